// SPDX-License-Identifier: Apache-2.0
// DeviceBase: what every Device backend shares (argument checks with one set of error texts,
// memory and copy accounting, the registry of pinned ranges), so that CudaDevice and
// HostDevice differ only in the do_* hooks. Private to zinf::cuda.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>

#include "zinf/cuda/device.h"

namespace zinf::cuda::detail {

/// A backend's stream state. The id is unique per Device, for logs and errors. An adopted
/// stream (adopt_stream) wraps a native stream zinf does not own: destroying it waits for the
/// stream's work but leaves the native stream to its owner.
struct StreamImpl {
  StreamImpl(std::uint64_t stream_id, bool is_adopted) : id(stream_id), adopted(is_adopted) {}
  virtual ~StreamImpl() = default;
  StreamImpl(const StreamImpl&) = delete;
  StreamImpl& operator=(const StreamImpl&) = delete;
  const std::uint64_t id;
  const bool adopted;
};

/// A backend's event state (shared with operations still queued on streams).
struct EventImpl {
  EventImpl() = default;
  virtual ~EventImpl() = default;
  EventImpl(const EventImpl&) = delete;
  EventImpl& operator=(const EventImpl&) = delete;
};

enum class CopyDirection { kToDevice, kToHost, kOnDevice };

/// Formats an address as 0x... for error texts.
std::string hex_address(const void* p);

class DeviceBase : public Device {
 public:
  DeviceBuffer allocate(std::size_t bytes) final;
  Stream create_stream() final;
  Event create_event() final;
  PinnedRegistration register_host(std::span<std::byte> host) final;
  void copy_to_device(StreamRef stream, DeviceSpan dst, std::span<const std::byte> src) final;
  void copy_to_host(StreamRef stream, std::span<std::byte> dst, DeviceSpan src) final;
  void copy_on_device(StreamRef stream, DeviceSpan dst, DeviceSpan src) final;
  using Device::copy_to_device;
  using Device::copy_to_host;
  void record(Event& event, StreamRef stream) final;
  void wait(StreamRef stream, const Event& event) final;
  void enqueue_host_work(StreamRef stream, std::function<void()> work) final;
  void enqueue_busy(StreamRef stream, std::chrono::nanoseconds duration) final;
  void synchronize(StreamRef stream) final;
  DeviceStats stats() const final;

 protected:
  /// `capacity_bytes` is reported in stats; allocations beyond it are refused here when
  /// `enforce_capacity` (the host simulation; CUDA lets cudaMalloc decide).
  DeviceBase(std::uint64_t capacity_bytes, bool enforce_capacity) noexcept;
  ~DeviceBase() override = default;

  /// Backends call this first in their destructor: an owner that outlives its Device is a bug.
  void check_no_live_owners() const noexcept;

  /// Builds the UsageError text "<op> on <name>: <what>".
  std::string usage_text(std::string_view op, std::string_view what) const;

 private:
  // Hooks. Arguments are already checked (same device, non-empty, sizes match, n > 0).
  virtual std::byte* do_allocate(std::size_t bytes) = 0;  // throws DeviceError
  virtual void do_free(std::byte* data, std::size_t bytes) noexcept = 0;
  virtual std::shared_ptr<StreamImpl> do_create_stream(std::uint64_t id) = 0;
  // An adopted stream over `native` (unchecked): the backend validates the handle and throws
  // UsageError, naming it, for one it cannot use.
  virtual std::shared_ptr<StreamImpl> do_adopt_stream(std::uint64_t id, void* native) = 0;
  // Owned streams: drain and destroy. Adopted ones: wait for the work so far, destroy nothing.
  virtual void do_destroy_stream(StreamImpl& stream) noexcept = 0;
  virtual void* do_native_handle(StreamImpl& stream) const noexcept = 0;
  virtual std::shared_ptr<EventImpl> do_create_event() = 0;
  virtual void do_register_host(std::span<std::byte> host) = 0;
  virtual Status do_unregister_host(std::span<std::byte> host) noexcept = 0;
  virtual void do_copy(StreamImpl& stream, std::byte* dst, const std::byte* src, std::size_t n,
                       CopyDirection direction) = 0;
  virtual void do_record(EventImpl& event, StreamImpl& stream) = 0;
  virtual void do_wait(StreamImpl& stream, EventImpl& event) = 0;
  virtual void do_host_work(StreamImpl& stream, std::function<void()> work) = 0;
  virtual void do_busy(StreamImpl& stream, std::chrono::nanoseconds duration) = 0;  // > 0
  virtual void do_synchronize(StreamImpl& stream) = 0;

  // Device's interop hooks (cuda_interop.h), with the checks and accounting around do_*.
  Stream adopt_native_stream(void* native) final;
  void* native_handle(StreamRef stream) const final;

  // Device's owner callbacks, with the accounting around the hooks.
  void free_buffer(std::byte* data, std::size_t size) noexcept final;
  void destroy_stream(StreamImpl& stream) noexcept final;
  Status unregister_host(std::span<std::byte> host) noexcept final;

  StreamImpl& checked_stream(StreamRef stream, std::string_view op) const;
  EventImpl& checked_event(const Event& event, std::string_view op) const;
  void check_span(DeviceSpan span, std::size_t host_size, std::string_view op,
                  CopyDirection direction) const;
  /// True if [p, p + n) lies inside one registered range.
  bool is_pinned(const void* p, std::size_t n) const;

  const std::uint64_t capacity_bytes_;
  const bool enforce_capacity_;
  std::atomic<std::uint64_t> allocated_bytes_{0};
  std::atomic<std::uint64_t> peak_allocated_bytes_{0};
  std::atomic<std::uint64_t> live_allocations_{0};
  std::atomic<std::uint64_t> total_allocations_{0};
  std::atomic<std::uint64_t> live_streams_{0};
  std::atomic<std::uint64_t> next_stream_id_{1};
  std::atomic<std::uint64_t> bytes_to_device_{0};
  std::atomic<std::uint64_t> bytes_to_host_{0};
  std::atomic<std::uint64_t> bytes_on_device_{0};
  std::atomic<std::uint64_t> pageable_copies_{0};

  mutable std::mutex pinned_mu_;
  std::map<std::uintptr_t, std::size_t> pinned_;  // start address -> length; disjoint
  std::uint64_t pinned_bytes_ = 0;                // guarded by pinned_mu_
};

}  // namespace zinf::cuda::detail
