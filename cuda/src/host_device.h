// SPDX-License-Identifier: Apache-2.0
// HostDevice: a GPU simulated in host memory, so that the prefetcher's overlap logic is tested
// on machines without one. Each stream has one worker thread that runs its operations in order;
// events are generation counters with a condition variable; copies may be throttled to a
// PCIe-like bandwidth shared by the device's streams. Private to zinf::cuda.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>

#include "device_base.h"

namespace zinf::cuda::detail {

/// One direction of a simulated PCIe link: copies reserve back-to-back time slots of
/// bytes / rate, so concurrent streams share the bandwidth instead of each getting all of it.
class CopyLane {
 public:
  explicit CopyLane(double bytes_per_second) noexcept : bytes_per_second_(bytes_per_second) {}
  bool capped() const noexcept { return bytes_per_second_ > 0; }
  /// Reserves the lane for `bytes` and returns when that transfer ends. Thread-safe.
  std::chrono::steady_clock::time_point reserve(std::size_t bytes);

 private:
  const double bytes_per_second_;
  std::mutex mu_;
  std::chrono::steady_clock::time_point free_at_{};
};

class HostDevice final : public DeviceBase {
 public:
  explicit HostDevice(const DeviceOptions& options);
  ~HostDevice() override;

  std::string_view name() const noexcept override { return "host"; }
  DeviceKind kind() const noexcept override { return DeviceKind::kHost; }

  CopyLane& lane(CopyDirection direction) noexcept {
    if (direction == CopyDirection::kOnDevice) return on_device_;
    return direction == CopyDirection::kToDevice ? to_device_ : to_host_;
  }
  /// True if [data, data + bytes) lies inside one live allocation of this device
  /// (zinf/cuda/testing.h). Thread-safe.
  bool owns(const void* data, std::size_t bytes) const;

 private:
  std::byte* do_allocate(std::size_t bytes) override;
  void do_free(std::byte* data, std::size_t bytes) noexcept override;
  std::shared_ptr<StreamImpl> do_create_stream(std::uint64_t id) override;
  std::shared_ptr<StreamImpl> do_adopt_stream(std::uint64_t id, void* native) override;
  void do_destroy_stream(StreamImpl& stream) noexcept override;
  void* do_native_handle(StreamImpl& stream) const noexcept override;
  // Device memory is host memory: any address can be.
  void check_native_memory(const void*, std::size_t) const override {}
  std::shared_ptr<EventImpl> do_create_event() override;
  void do_register_host(std::span<std::byte> host) override;
  Status do_unregister_host(std::span<std::byte> host) noexcept override;
  void do_copy(StreamImpl& stream, std::byte* dst, const std::byte* src, std::size_t n,
               CopyDirection direction) override;
  void do_record(EventImpl& event, StreamImpl& stream) override;
  void do_wait(StreamImpl& stream, EventImpl& event) override;
  void do_host_work(StreamImpl& stream, std::function<void()> work) override;
  void do_busy(StreamImpl& stream, std::chrono::nanoseconds duration) override;
  void do_synchronize(StreamImpl& stream) override;
  bool query_event(const EventImpl& event) override;
  void synchronize_event(const EventImpl& event) override;

  CopyLane to_device_;
  CopyLane to_host_;
  CopyLane on_device_{0};  // device memory bandwidth is not modelled: uncapped
  // Live allocations, start address -> length: device memory is host memory here, so only
  // this record tells a device buffer from any other readable host address.
  mutable std::mutex allocations_mu_;
  std::map<std::uintptr_t, std::size_t> allocations_;
};

std::unique_ptr<Device> make_host_device(const DeviceOptions& options);

}  // namespace zinf::cuda::detail
