// SPDX-License-Identifier: Apache-2.0
// CudaDevice: the Device backend over the CUDA runtime API (cudaMalloc, non-blocking streams,
// cudaMemcpyAsync, events without timing, cudaLaunchHostFunc, cudaHostRegister), plain C++
// against CUDA::cudart; its one kernel (busy_kernel.cu) serves enqueue_busy. Private to
// zinf::cuda; only built with CUDA.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "device_base.h"

// cudaStream_t is `CUstream_st*` (driver_types.h); declared here to keep cuda_runtime.h out.
struct CUstream_st;

namespace zinf::cuda::detail {

class CudaDevice final : public DeviceBase {
 public:
  /// Selects device `device_index` (which probe_cuda() has seen). Throws DeviceError.
  explicit CudaDevice(int device_index);
  ~CudaDevice() override;

  /// The CUDA device ordinal.
  int index() const noexcept { return index_; }
  /// The cudaStream_t behind `stream`, for other CUDA libraries inside zinf::cuda (NCCL).
  /// Throws UsageError unless `stream` is a stream of a CudaDevice.
  static CUstream_st* native_stream(StreamRef stream);

  std::string_view name() const noexcept override { return name_; }
  DeviceKind kind() const noexcept override { return DeviceKind::kCuda; }

 private:
  std::byte* do_allocate(std::size_t bytes) override;
  void do_free(std::byte* data, std::size_t bytes) noexcept override;
  std::shared_ptr<StreamImpl> do_create_stream(std::uint64_t id) override;
  std::shared_ptr<StreamImpl> do_adopt_stream(std::uint64_t id, void* native) override;
  void do_destroy_stream(StreamImpl& stream) noexcept override;
  void* do_native_handle(StreamImpl& stream) const noexcept override;
  void check_native_memory(const void* data, std::size_t bytes) const override;
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

  /// Makes this device current on the calling thread (the runtime's current device is
  /// per-thread, and any thread may call a Device).
  void select() const;

  const int index_;
  const std::string name_;
};

std::unique_ptr<Device> make_cuda_device(const DeviceOptions& options);

}  // namespace zinf::cuda::detail
