// SPDX-License-Identifier: Apache-2.0
// Interop with streams made outside zinf: adopt_stream turns a native stream handle (a
// trainer's cudaStream_t, or a host-simulation stream in tests) into an AdoptedStream whose
// StreamRef works wherever zinf takes one (OffloadEngine's compute stream, LayerPrefetcher,
// Device calls), and native_stream gives the handle behind any StreamRef. Never includes
// cuda_runtime.h: handles travel as void*, which a cudaStream_t converts to implicitly.
#pragma once

#include <utility>

#include "zinf/cuda/device.h"

namespace zinf::cuda {

/// zinf's bookkeeping for a stream it did not make: a StreamRef of the adopting Device that
/// enqueues onto the native stream, in that stream's one order with whatever its owner
/// enqueues there (a trainer's kernels). Move-only; a moved-from one is empty.
///
/// Lifetime: the native stream must outlive the AdoptedStream and every operation zinf
/// enqueued on it; zinf never destroys it. The destructor waits for everything enqueued on the
/// native stream so far (zinf's work and the owner's work before it: a stream has one order),
/// so that once it returns no zinf buffer, event or pinned range is still in use by it; a
/// failure there is logged (debug), not thrown, and stays the owner's to see. Like every
/// owner, it must be destroyed before its Device.
///
/// Errors: a failure on the native stream (host work that threw, a device error) fails it for
/// zinf and its owner alike, as the Device contract says for any stream.
///
/// Threads: as Device: any thread may enqueue on ref(); the object itself is not synchronised.
class AdoptedStream {
 public:
  AdoptedStream() = default;
  ~AdoptedStream() = default;  // ~Stream below waits, through the backend's adopted path
  AdoptedStream(AdoptedStream&& other) noexcept
      : stream_(std::move(other.stream_)), native_(std::exchange(other.native_, nullptr)) {}
  AdoptedStream& operator=(AdoptedStream&& other) noexcept {
    if (this != &other) {
      stream_ = std::move(other.stream_);
      native_ = std::exchange(other.native_, nullptr);
    }
    return *this;
  }
  AdoptedStream(const AdoptedStream&) = delete;
  AdoptedStream& operator=(const AdoptedStream&) = delete;

  bool empty() const noexcept { return stream_.empty(); }
  StreamRef ref() const noexcept { return stream_.ref(); }
  operator StreamRef() const noexcept { return ref(); }  // NOLINT: a view, like Stream's
  /// The native handle it was adopted from (nullptr when empty).
  void* native() const noexcept { return native_; }

 private:
  friend AdoptedStream adopt_stream(Device& device, void* native);
  AdoptedStream(Stream stream, void* native) noexcept
      : stream_(std::move(stream)), native_(native) {}

  Stream stream_;
  void* native_ = nullptr;
};

/// Adopts `native`, a stream made outside zinf, as a stream of `device`. Does not block.
///
/// - CUDA: `native` is a cudaStream_t of the CUDA device `device` runs on (checked with
///   cudaStreamGetDevice: another device's stream is a UsageError naming both). The default
///   stream must be spelled cudaStreamLegacy or cudaStreamPerThread: nullptr (0) is refused,
///   because which of the two 0 means depends on how the caller was compiled.
/// - Host simulation: `native` is native_stream() of a Stream of any host Device (the tests'
///   stand-in for a trainer's stream made by the CUDA runtime), alive when adopted; anything
///   else is a UsageError, checked against the live host streams (never dereferenced). Copies
///   zinf enqueues on it are throttled by `device`'s host_copy_bandwidth_gbps. If that Stream
///   is destroyed while still adopted, later enqueues through the adoption throw UsageError.
///
/// Throws UsageError as above (the message names the handle), DeviceError if the CUDA runtime
/// refuses the handle.
AdoptedStream adopt_stream(Device& device, void* native);

/// Returns the native handle behind `stream`: its cudaStream_t on CUDA (cast it back with
/// static_cast<cudaStream_t>), the handle adopt_stream takes on the host simulation. For an
/// adopted stream, the handle it was adopted from. Throws UsageError for an empty StreamRef.
/// Valid while the stream lives. Thread-safe.
void* native_stream(StreamRef stream);

/// Views `bytes` of device memory at `data` that another allocator owns (a trainer's gradient
/// buffer from PyTorch's caching allocator, cudaMalloc) as a DeviceSpan of `device`, usable
/// wherever zinf takes one (copies, OffloadEngine::set_gradients). zinf never frees it; the
/// memory must outlive every use zinf makes of the span.
///
/// - CUDA: cudaPointerGetAttributes must report device (or managed) memory of the CUDA device
///   `device` runs on; host memory, another device's memory or an unknown pointer is a
///   UsageError naming the address. Only the start is checked: the caller vouches for the
///   length.
/// - Host simulation: device memory is host memory, so any non-null address is accepted (the
///   tests pass memory of a DeviceBuffer or of their own).
///
/// A null `data` is a UsageError unless `bytes` is 0 (an empty span). Thread-safe.
DeviceSpan adopt_device_memory(const Device& device, void* data, std::size_t bytes);

}  // namespace zinf::cuda
