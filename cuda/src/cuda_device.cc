// SPDX-License-Identifier: Apache-2.0
// CudaDevice over the CUDA runtime, and probe_cuda. Failures of host work on a stream are
// tracked beside the CUDA handles (the GPU knows nothing of them): each host function on a
// stream gets an index, an event remembers its stream's index at record(), so "the failure
// happened before this record" is failed_at <= index once the event has completed.
#include "cuda_device.h"

#include <cuda_runtime.h>

#include <mutex>
#include <string>
#include <utility>

#include "busy_kernel.h"
#include "cuda_check.h"
#include "zinf/common/error.h"
#include "zinf/common/log.h"

namespace zinf::cuda {

CudaAvailability probe_cuda() {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    // Without a driver this is cudaErrorInsufficientDriver; without a GPU cudaErrorNoDevice.
    (void)cudaGetLastError();
    return CudaAvailability{0, std::string("cudaGetDeviceCount: ") + cudaGetErrorName(err) + ": " +
                                   cudaGetErrorString(err)};
  }
  if (count <= 0) return CudaAvailability{0, "cudaGetDeviceCount: 0 devices"};
  return CudaAvailability{count, {}};
}

namespace detail {
namespace {

// The failure state of one stream, shared with its events and with host functions in flight
// (which may run after the Stream owner is gone).
struct StreamFailure {
  std::mutex mu;
  Status failure;               // the first failure
  std::uint64_t failed_at = 0;  // index of the host function that failed; 0 = none
  bool reported = false;        // synchronize() has thrown it
};

void set_failure(StreamFailure& s, std::uint64_t index, Status failure) {
  std::lock_guard lock(s.mu);
  if (s.failed_at == 0) {
    s.failed_at = index;
    s.failure = std::move(failure);
  }
}

/// The failure of `s` if it happened at or before host function `index`, else ok.
Status failure_up_to(StreamFailure& s, std::uint64_t index) {
  std::lock_guard lock(s.mu);
  if (s.failed_at != 0 && s.failed_at <= index) return s.failure;
  return Status::ok_status();
}

struct CudaStream final : StreamImpl {
  CudaStream(std::uint64_t stream_id, bool is_adopted)
      : StreamImpl(stream_id, is_adopted), failure(std::make_shared<StreamFailure>()) {}
  cudaStream_t stream = nullptr;
  std::shared_ptr<StreamFailure> failure;
  std::mutex enqueue_mu;             // numbers host functions and records in stream order
  std::uint64_t host_functions = 0;  // guarded by enqueue_mu
};

struct CudaEvent final : EventImpl {
  ~CudaEvent() override {
    if (event != nullptr) ZINF_CUDA_CHECK_NOTHROW(cudaEventDestroy(event));
  }
  cudaEvent_t event = nullptr;
  mutable std::mutex mu;  // guards the two fields below
  std::shared_ptr<StreamFailure> source;
  std::uint64_t source_index = 0;
};

struct HostWorkCall {
  std::shared_ptr<StreamFailure> failure;
  std::uint64_t index;
  std::function<void()> work;
  std::string operation;
  std::string backend;
};

struct PropagateCall {
  std::shared_ptr<StreamFailure> from;
  std::uint64_t from_index;
  std::shared_ptr<StreamFailure> to;
  std::uint64_t to_index;
};

// cudaLaunchHostFunc callbacks: they run on a runtime thread, may not call CUDA, and must not
// let an exception out. A stream that has failed skips its later host work.
void CUDART_CB run_host_work(void* user) noexcept {
  std::unique_ptr<HostWorkCall> call(static_cast<HostWorkCall*>(user));
  try {
    {
      std::lock_guard lock(call->failure->mu);
      if (call->failure->failed_at != 0) return;
    }
    std::string what;
    try {
      call->work();
      return;
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
      what = "unknown exception";
    }
    set_failure(*call->failure, call->index,
                Status::error(ErrorCode::kIo, std::move(what))
                    .with_operation(std::move(call->operation))
                    .with_backend(std::move(call->backend)));
  } catch (...) {
    log(LogLevel::kError, "host work failed and its failure could not be recorded");
  }
}

// Enqueued after cudaStreamWaitEvent when the event's stream runs host work: carries that
// stream's failure (if it came before the record) into the waiting stream.
void CUDART_CB propagate_failure(void* user) noexcept {
  std::unique_ptr<PropagateCall> call(static_cast<PropagateCall*>(user));
  try {
    Status failure = failure_up_to(*call->from, call->from_index);
    if (!failure.ok()) set_failure(*call->to, call->to_index, std::move(failure));
  } catch (...) {
    log(LogLevel::kError, "a failure could not be passed on to a waiting stream");
  }
}

std::uint64_t total_memory(int device_index) {
  ZINF_CUDA_CHECK(cudaSetDevice(device_index));
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  ZINF_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return total_bytes;
}

Status event_failure(const CudaEvent& e) {
  std::shared_ptr<StreamFailure> source;
  std::uint64_t index = 0;
  {
    std::lock_guard lock(e.mu);
    source = e.source;
    index = e.source_index;
  }
  if (source == nullptr) return Status::ok_status();
  return failure_up_to(*source, index);
}

}  // namespace

CudaDevice::CudaDevice(int device_index)
    : DeviceBase(total_memory(device_index), /*enforce_capacity=*/false),
      index_(device_index),
      name_("cuda:" + std::to_string(device_index)) {}

CudaDevice::~CudaDevice() { check_no_live_owners(); }

void CudaDevice::select() const { ZINF_CUDA_CHECK(cudaSetDevice(index_)); }

CUstream_st* CudaDevice::native_stream(StreamRef stream) {
  if (stream.empty() || stream.device() == nullptr ||
      stream.device()->kind() != DeviceKind::kCuda) {
    throw UsageError("native_stream: not a stream of a CUDA device");
  }
  return static_cast<CudaStream*>(impl_of(stream))->stream;
}

std::byte* CudaDevice::do_allocate(std::size_t bytes) {
  select();
  void* p = nullptr;
  cudaError_t err = cudaMalloc(&p, bytes);
  if (err != cudaSuccess) {
    throw_cuda_error(err, "cudaMalloc(" + std::to_string(bytes) + " bytes) on " + name_, __FILE__,
                     __LINE__);
  }
  return static_cast<std::byte*>(p);
}

void CudaDevice::do_free(std::byte* data, std::size_t /*bytes*/) noexcept {
  ZINF_CUDA_CHECK_NOTHROW(cudaSetDevice(index_));
  ZINF_CUDA_CHECK_NOTHROW(cudaFree(data));
}

std::shared_ptr<StreamImpl> CudaDevice::do_create_stream(std::uint64_t id) {
  select();
  auto s = std::make_shared<CudaStream>(id, /*is_adopted=*/false);
  ZINF_CUDA_CHECK(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking));
  return s;
}

std::shared_ptr<StreamImpl> CudaDevice::do_adopt_stream(std::uint64_t id, void* native) {
  if (native == nullptr) {
    throw UsageError(usage_text("adopt_stream",
                                "native stream is null; give cudaStreamLegacy or "
                                "cudaStreamPerThread for the default stream (which one 0 "
                                "means depends on how the caller was compiled)"));
  }
  select();
  auto stream = static_cast<cudaStream_t>(native);
  int owner = -1;
  cudaError_t err = cudaStreamGetDevice(stream, &owner);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    throw UsageError(usage_text(
        "adopt_stream", "native stream " + hex_address(native) + " is not a usable CUDA stream: " +
                            cudaGetErrorName(err) + ": " + cudaGetErrorString(err)));
  }
  if (owner != index_) {
    throw UsageError(usage_text("adopt_stream", "native stream " + hex_address(native) +
                                                    " belongs to cuda:" + std::to_string(owner)));
  }
  auto s = std::make_shared<CudaStream>(id, /*is_adopted=*/true);
  s->stream = stream;
  return s;
}

void CudaDevice::check_native_memory(const void* data, std::size_t bytes) const {
  cudaPointerAttributes attr{};
  const cudaError_t err = cudaPointerGetAttributes(&attr, data);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    throw UsageError(usage_text("adopt_device_memory",
                                hex_address(data) + " is not memory the CUDA runtime knows: " +
                                    cudaGetErrorName(err) + ": " + cudaGetErrorString(err)));
  }
  if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged) {
    throw UsageError(usage_text("adopt_device_memory",
                                hex_address(data) + " (" + std::to_string(bytes) +
                                    " bytes) is host memory, not device memory"));
  }
  if (attr.device != index_) {
    throw UsageError(usage_text("adopt_device_memory",
                                hex_address(data) + " is memory of cuda:" +
                                    std::to_string(attr.device)));
  }
}

void* CudaDevice::do_native_handle(StreamImpl& stream) const noexcept {
  return static_cast<CudaStream&>(stream).stream;
}

void CudaDevice::do_destroy_stream(StreamImpl& stream) noexcept {
  auto& s = static_cast<CudaStream&>(stream);
  ZINF_CUDA_CHECK_NOTHROW(cudaSetDevice(index_));
  // Drain first, as the host backend does, so buffers used by queued copies may be freed next.
  ZINF_CUDA_CHECK_NOTHROW(cudaStreamSynchronize(s.stream));
  // An adopted stream stays its owner's, failures included (the owner reports them).
  if (s.adopted) return;
  ZINF_CUDA_CHECK_NOTHROW(cudaStreamDestroy(s.stream));
  s.stream = nullptr;
  try {
    std::lock_guard lock(s.failure->mu);
    if (s.failure->failed_at != 0 && !s.failure->reported) {
      log(LogLevel::kWarning, "stream " + std::to_string(s.id) +
                                  " destroyed after a failure no synchronize() reported: " +
                                  s.failure->failure.to_string());
    }
  } catch (...) {
    // Logging is best effort here.
  }
}

std::shared_ptr<EventImpl> CudaDevice::do_create_event() {
  select();
  auto e = std::make_shared<CudaEvent>();
  ZINF_CUDA_CHECK(cudaEventCreateWithFlags(&e->event, cudaEventDisableTiming));
  return e;
}

void CudaDevice::do_register_host(std::span<std::byte> host) {
  select();
  ZINF_CUDA_CHECK(cudaHostRegister(host.data(), host.size(), cudaHostRegisterDefault));
}

Status CudaDevice::do_unregister_host(std::span<std::byte> host) noexcept {
  try {
    cudaError_t err = cudaSetDevice(index_);
    if (err == cudaSuccess) err = cudaHostUnregister(host.data());
    if (err == cudaSuccess || err == cudaErrorCudartUnloading) return Status::ok_status();
    (void)cudaGetLastError();
    return Status::error(ErrorCode::kIo,
                         std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err))
        .with_operation("cudaHostUnregister(address=" + hex_address(host.data()) +
                        " length=" + std::to_string(host.size()) + ")")
        .with_backend(name_);
  } catch (...) {
    return Status::error(ErrorCode::kResource, "out of memory while reporting a failure")
        .with_operation("cudaHostUnregister");
  }
}

void CudaDevice::do_copy(StreamImpl& stream, std::byte* dst, const std::byte* src, std::size_t n,
                         CopyDirection direction) {
  auto& s = static_cast<CudaStream&>(stream);
  select();
  const cudaMemcpyKind kind = direction == CopyDirection::kToDevice ? cudaMemcpyHostToDevice
                              : direction == CopyDirection::kToHost ? cudaMemcpyDeviceToHost
                                                                    : cudaMemcpyDeviceToDevice;
  ZINF_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, kind, s.stream));
}

void CudaDevice::do_record(EventImpl& event, StreamImpl& stream) {
  auto& e = static_cast<CudaEvent&>(event);
  auto& s = static_cast<CudaStream&>(stream);
  select();
  std::lock_guard stream_lock(s.enqueue_mu);
  std::lock_guard event_lock(e.mu);
  ZINF_CUDA_CHECK(cudaEventRecord(e.event, s.stream));
  e.source = s.failure;
  e.source_index = s.host_functions;
}

void CudaDevice::do_wait(StreamImpl& stream, EventImpl& event) {
  auto& e = static_cast<CudaEvent&>(event);
  auto& s = static_cast<CudaStream&>(stream);
  select();
  std::lock_guard stream_lock(s.enqueue_mu);  // same lock order as do_record
  std::lock_guard event_lock(e.mu);
  ZINF_CUDA_CHECK(cudaStreamWaitEvent(s.stream, e.event, 0));
  // Only a stream that ran host work before the record can have failed; for the usual case (a
  // copy stream) no host function is needed and the wait stays purely on the device.
  if (e.source != nullptr && e.source_index > 0) {
    auto call = std::make_unique<PropagateCall>(
        PropagateCall{e.source, e.source_index, s.failure, s.host_functions + 1});
    ZINF_CUDA_CHECK(cudaLaunchHostFunc(s.stream, propagate_failure, call.get()));
    call.release();  // owned by the callback now
    ++s.host_functions;
  }
}

void CudaDevice::do_host_work(StreamImpl& stream, std::function<void()> work) {
  auto& s = static_cast<CudaStream&>(stream);
  select();
  std::lock_guard lock(s.enqueue_mu);
  auto call = std::make_unique<HostWorkCall>(
      HostWorkCall{s.failure, s.host_functions + 1, std::move(work),
                   "host work on stream " + std::to_string(s.id), name_});
  ZINF_CUDA_CHECK(cudaLaunchHostFunc(s.stream, run_host_work, call.get()));
  call.release();  // owned by the callback now
  ++s.host_functions;
}

void CudaDevice::do_busy(StreamImpl& stream, std::chrono::nanoseconds duration) {
  auto& s = static_cast<CudaStream&>(stream);
  select();
  ZINF_CUDA_CHECK(launch_busy_kernel(s.stream, static_cast<std::uint64_t>(duration.count())));
}

void CudaDevice::do_synchronize(StreamImpl& stream) {
  auto& s = static_cast<CudaStream&>(stream);
  select();
  ZINF_CUDA_CHECK(cudaStreamSynchronize(s.stream));
  std::lock_guard lock(s.failure->mu);
  if (s.failure->failed_at != 0) {
    s.failure->reported = true;
    throw DeviceError(s.failure->failure.to_string());
  }
}

bool CudaDevice::query_event(const EventImpl& event) {
  const auto& e = static_cast<const CudaEvent&>(event);
  select();
  cudaError_t err = cudaEventQuery(e.event);
  if (err == cudaErrorNotReady) {
    (void)cudaGetLastError();  // not an error: do not let it linger in the last-error slot
    return false;
  }
  if (err != cudaSuccess) throw_cuda_error(err, "cudaEventQuery(e.event)", __FILE__, __LINE__);
  Status failure = event_failure(e);
  if (!failure.ok()) throw DeviceError(failure.to_string());
  return true;
}

void CudaDevice::synchronize_event(const EventImpl& event) {
  const auto& e = static_cast<const CudaEvent&>(event);
  select();
  ZINF_CUDA_CHECK(cudaEventSynchronize(e.event));
  Status failure = event_failure(e);
  if (!failure.ok()) throw DeviceError(failure.to_string());
}

std::unique_ptr<Device> make_cuda_device(const DeviceOptions& options) {
  return std::make_unique<CudaDevice>(options.device_index);
}

}  // namespace detail
}  // namespace zinf::cuda
