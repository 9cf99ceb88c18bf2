// SPDX-License-Identifier: Apache-2.0
// Device: device memory, asynchronous host<->device copies on streams, events, host work on a
// stream and pinned registration of host buffers. Backends: CUDA (runtime API) and a host
// simulation with one worker per stream. Part of zinf::cuda, beneath prefetch/ and offload/;
// made only through make_device(). Never includes cuda_runtime.h.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "zinf/common/status.h"

namespace zinf::cuda {

class Device;
class AdoptedStream;
namespace detail {
struct StreamImpl;
struct EventImpl;
}  // namespace detail

/// Which backend make_device builds.
enum class DeviceKind {
  kAuto,  ///< CUDA if a device is visible, else host with one notice saying why
  kCuda,  ///< the CUDA runtime, or DeviceError with the reason
  kHost,  ///< the host simulation (never touches the CUDA runtime)
};

/// Parses "auto" | "cuda" | "host"; throws zinf::UsageError otherwise.
DeviceKind parse_device_kind(std::string_view text);
/// Returns "auto", "cuda" or "host".
std::string_view device_kind_name(DeviceKind kind) noexcept;

struct DeviceOptions {
  DeviceKind kind = DeviceKind::kAuto;
  /// CUDA device ordinal (cudaSetDevice). The host backend ignores it.
  int device_index = 0;
  /// Host backend only: copy bandwidth per direction in GB/s (1e9 bytes/s), modelling a PCIe
  /// link shared by every stream of the device (host-to-device and device-to-host are
  /// separate lanes, as PCIe is full duplex). 0 = uncapped. A rate model, not an ordering one.
  double host_copy_bandwidth_gbps = 0;
  /// Host backend only: simulated device memory in bytes; allocate() beyond it throws
  /// DeviceError as a full GPU would. 0 = unlimited.
  std::uint64_t host_memory_bytes = 0;
};

/// What make_device(kAuto) finds. `reason` says why no device is usable (empty if one is).
struct CudaAvailability {
  int device_count = 0;
  std::string reason;
  bool available() const noexcept { return device_count > 0; }
};

/// Asks the CUDA runtime how many devices are visible (cudaGetDeviceCount), clearing the error
/// it leaves behind. Without a driver the reason names the runtime's error, e.g.
/// "cudaGetDeviceCount: cudaErrorInsufficientDriver: CUDA driver version is insufficient for
/// CUDA runtime version". In a build without CUDA the reason says so. Thread-safe.
CudaAvailability probe_cuda();

/// A non-owning view of a range of one DeviceBuffer (device memory: not dereferenceable on the
/// host for CUDA). Made by DeviceBuffer::span, so it is always inside its buffer, or by
/// adopt_device_memory (cuda_interop.h) for memory another allocator owns. Valid while that
/// memory lives.
class DeviceSpan {
 public:
  DeviceSpan() = default;

  /// Device address of the first byte.
  std::byte* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }
  /// The Device whose memory this is (nullptr for a default-constructed span).
  const Device* device() const noexcept { return device_; }

  /// Returns bytes [offset, offset + count) of this span. Throws UsageError if that range is
  /// not inside it.
  DeviceSpan subspan(std::size_t offset, std::size_t count) const;

 private:
  friend class DeviceBuffer;
  friend DeviceSpan adopt_device_memory(const Device& device, void* data, std::size_t bytes);
  DeviceSpan(const Device* device, std::byte* data, std::size_t size) noexcept
      : device_(device), data_(data), size_(size) {}

  const Device* device_ = nullptr;
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

/// The one owner of a device allocation (256-byte aligned). Move-only; a moved-from buffer is
/// empty. The destructor frees the memory: no copy on any stream may still use it then, and it
/// must run before the Device that made it is destroyed.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  /// Device address (host memory for the host backend).
  std::byte* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }
  const Device* device() const noexcept { return device_; }

  /// The whole buffer as a span.
  DeviceSpan span() const noexcept { return DeviceSpan(device_, data_, size_); }
  /// Bytes [offset, offset + count). Throws UsageError, naming offset, length and buffer size,
  /// if the range passes the end.
  DeviceSpan span(std::size_t offset, std::size_t count) const;

  /// Frees the memory now (same preconditions as the destructor); leaves the buffer empty.
  void reset() noexcept;

 private:
  friend class Device;
  DeviceBuffer(Device* device, std::byte* data, std::size_t size) noexcept
      : device_(device), data_(data), size_(size) {}

  Device* device_ = nullptr;
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

/// A view of a Stream (or of an AdoptedStream, zinf/cuda/cuda_interop.h), passed by value.
/// Valid while its Stream lives.
class StreamRef {
 public:
  StreamRef() = default;
  bool empty() const noexcept { return impl_ == nullptr; }
  /// A number unique among the streams of its device, for logs and errors.
  std::uint64_t id() const noexcept;
  const Device* device() const noexcept { return device_; }
  friend bool operator==(StreamRef, StreamRef) = default;

 private:
  friend class Stream;
  friend class Device;
  StreamRef(Device* device, detail::StreamImpl* impl) noexcept : device_(device), impl_(impl) {}

  Device* device_ = nullptr;
  detail::StreamImpl* impl_ = nullptr;
};

/// The one owner of a stream: a queue of device operations executed in the order they were
/// enqueued. Move-only; a moved-from stream is empty. The destructor waits for the stream's
/// enqueued work to finish (logging, never throwing, a failure nobody was told about), and
/// must run before the Device that made it is destroyed.
class Stream {
 public:
  Stream() = default;
  ~Stream();
  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  bool empty() const noexcept { return impl_ == nullptr; }
  StreamRef ref() const noexcept { return StreamRef(device_, impl_.get()); }
  operator StreamRef() const noexcept { return ref(); }  // NOLINT: a view, like span
  std::uint64_t id() const noexcept { return ref().id(); }

 private:
  friend class Device;
  Stream(Device* device, std::shared_ptr<detail::StreamImpl> impl) noexcept
      : device_(device), impl_(std::move(impl)) {}
  void release() noexcept;

  Device* device_ = nullptr;
  std::shared_ptr<detail::StreamImpl> impl_;
};

/// The one owner of an event: a marker recorded on a stream that completes when the work
/// enqueued on that stream before it has completed. Move-only. query() and synchronize() may be
/// called from any thread. An event never recorded counts as complete (as in CUDA). Recording
/// again replaces what the event tracks: query/synchronize/wait refer to the latest record().
class Event {
 public:
  Event() = default;
  ~Event();
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  bool empty() const noexcept { return impl_ == nullptr; }

  /// Returns true if the work of the latest record() has completed (or there was none), false
  /// if it is still running. Never blocks. Throws DeviceError if that work failed (the error of
  /// the stream it was recorded on, e.g. host work that threw), or for a device error.
  bool query() const;
  /// Blocks until the work of the latest record() has completed; throws DeviceError as query().
  void synchronize() const;

 private:
  friend class Device;
  Event(Device* device, std::shared_ptr<detail::EventImpl> impl) noexcept
      : device_(device), impl_(std::move(impl)) {}

  Device* device_ = nullptr;
  std::shared_ptr<detail::EventImpl> impl_;
};

/// The one owner of a pinned (page-locked, DMA-able) registration of caller-owned host memory:
/// cudaHostRegister on CUDA, bookkeeping on the host backend. Move-only. The memory must outlive
/// the registration, and no copy may be using it when the registration ends.
class PinnedRegistration {
 public:
  PinnedRegistration() = default;
  /// Unregisters if still registered; a failure is logged (use close() to see it).
  ~PinnedRegistration();
  PinnedRegistration(PinnedRegistration&& other) noexcept;
  PinnedRegistration& operator=(PinnedRegistration&& other) noexcept;
  PinnedRegistration(const PinnedRegistration&) = delete;
  PinnedRegistration& operator=(const PinnedRegistration&) = delete;

  bool empty() const noexcept { return range_.empty(); }
  std::span<std::byte> range() const noexcept { return range_; }

  /// Unregisters now and returns the outcome (cudaHostUnregister's failure as a Status).
  /// Leaves the registration empty; closing an empty one returns ok.
  [[nodiscard]] Status close() noexcept;

 private:
  friend class Device;
  PinnedRegistration(Device* device, std::span<std::byte> range) noexcept
      : device_(device), range_(range) {}

  Device* device_ = nullptr;
  std::span<std::byte> range_;
};

/// Counters for one Device since it was made (only what this Device did, not other users of
/// the GPU). Read without stopping the device, so they may be mid-update across fields.
struct DeviceStats {
  /// Device memory in total: cudaMemGetInfo's total on CUDA, host_memory_bytes on host
  /// (0 = unlimited).
  std::uint64_t capacity_bytes = 0;
  std::uint64_t allocated_bytes = 0;       ///< bytes in live DeviceBuffers
  std::uint64_t peak_allocated_bytes = 0;  ///< most allocated_bytes has ever been
  std::uint64_t live_allocations = 0;
  std::uint64_t total_allocations = 0;
  std::uint64_t pinned_bytes = 0;  ///< bytes in live PinnedRegistrations
  std::uint64_t pinned_registrations = 0;
  std::uint64_t bytes_to_device = 0;  ///< enqueued by copy_to_device
  std::uint64_t bytes_to_host = 0;    ///< enqueued by copy_to_host
  std::uint64_t bytes_on_device = 0;  ///< enqueued by copy_on_device
  /// Copies whose host side is not inside a PinnedRegistration of this Device: on CUDA they
  /// are staged through a driver buffer and do not overlap with the host, so a prefetcher wants
  /// this at 0.
  std::uint64_t pageable_copies = 0;
};

/// A GPU, or its simulation in host memory.
///
/// Contract, for every backend:
/// - Thread-safe: any thread may call any member. Operations on one stream run in the order
///   their calls returned; streams run concurrently with each other and with the host.
/// - Enqueue calls (copy_*, record, wait, enqueue_host_work) return without waiting for the
///   device. Misuse (a stream, event or span of another Device, an empty one, lengths that
///   differ, a range past the end of a buffer) throws UsageError at the call, before anything
///   is enqueued.
/// - Lifetime: host memory given to a copy must stay valid and untouched (for copies to the
///   device: unmodified) until the copy completes, i.e. until a later synchronize or event
///   says so. Every owner (DeviceBuffer, Stream, Event, PinnedRegistration) must be destroyed
///   before its Device.
/// - Errors: a failure inside a stream (host work that throws, a device error) fails the stream:
///   its later host work does not run, the contents of buffers its later copies target are
///   unspecified, and synchronize() on it throws DeviceError quoting the first failure, now and
///   every later time (make a new stream to continue). An event recorded after the failure
///   reports it from query()/synchronize(), and a stream that waits on such an event fails with
///   the same error. Errors cross threads as values and surface at those calls only.
/// - Pinned memory: copies from/to host memory inside a PinnedRegistration are truly
///   asynchronous on CUDA; others work but are counted in DeviceStats::pageable_copies.
/// - Streams made outside zinf (a trainer's cudaStream_t) join through adopt_stream
///   (zinf/cuda/cuda_interop.h); their StreamRef is a stream of the adopting device for all of
///   the above.
class Device {
 public:
  virtual ~Device() = default;
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  /// "host" or "cuda:<index>"; shown in logs, errors and benchmark output.
  virtual std::string_view name() const noexcept = 0;
  virtual DeviceKind kind() const noexcept = 0;

  /// Allocates `bytes` of device memory (uninitialised, 256-byte aligned). Zero bytes gives an
  /// empty buffer. Blocks. Throws DeviceError if the device is out of memory, naming the size.
  virtual DeviceBuffer allocate(std::size_t bytes) = 0;
  /// Creates a stream (its own worker on host; a non-blocking CUDA stream). Throws DeviceError.
  virtual Stream create_stream() = 0;
  /// Creates an event (no timing). Throws DeviceError.
  virtual Event create_event() = 0;
  /// Page-locks `host` for DMA until the registration ends. Throws UsageError for an empty
  /// range and DeviceError if any of it is already registered or the driver refuses.
  virtual PinnedRegistration register_host(std::span<std::byte> host) = 0;

  /// Enqueues a copy of `src` (host) into `dst` (device); the sizes must match.
  virtual void copy_to_device(StreamRef stream, DeviceSpan dst, std::span<const std::byte> src) = 0;
  /// Enqueues a copy of `src` (device) into `dst` (host); the sizes must match.
  virtual void copy_to_host(StreamRef stream, std::span<std::byte> dst, DeviceSpan src) = 0;
  /// Enqueues a copy of `src` (device) into `dst` (device), both of this Device; the sizes must
  /// match and the ranges must not overlap (UsageError). No host memory takes part: nothing is
  /// pinned or pageable, and on CUDA it runs at device-memory speed.
  virtual void copy_on_device(StreamRef stream, DeviceSpan dst, DeviceSpan src) = 0;
  /// Enqueues a copy of `src` into `dst` at `dst_offset`; UsageError if it passes the end.
  void copy_to_device(StreamRef stream, const DeviceBuffer& dst, std::size_t dst_offset,
                      std::span<const std::byte> src) {
    copy_to_device(stream, dst.span(dst_offset, src.size()), src);
  }
  /// Enqueues a copy of dst.size() bytes of `src` from `src_offset` into `dst`; UsageError if
  /// that passes the end of `src`.
  void copy_to_host(StreamRef stream, std::span<std::byte> dst, const DeviceBuffer& src,
                    std::size_t src_offset) {
    copy_to_host(stream, dst, src.span(src_offset, dst.size()));
  }

  /// Enqueues `event` on `stream`: it completes when everything enqueued on `stream` before it
  /// has completed. Replaces what the event tracked.
  virtual void record(Event& event, StreamRef stream) = 0;
  /// Makes `stream` wait, on the device, for the latest record() of `event` as of this call
  /// (nothing if it was never recorded). The host does not block.
  virtual void wait(StreamRef stream, const Event& event) = 0;
  /// Enqueues `work` to run on a backend thread when the stream reaches it; later operations
  /// on the stream wait for it to return (use it to simulate compute, or to signal the host).
  /// `work` must not call into any Device (CUDA forbids runtime calls there). If it throws,
  /// the stream fails with the exception's text.
  virtual void enqueue_host_work(StreamRef stream, std::function<void()> work) = 0;
  /// Enqueues `duration` of simulated compute: the stream is busy for that long, as with a
  /// kernel of that length, and later operations on it wait. On CUDA a one-thread kernel waits
  /// on the GPU's global timer, so the host, the CPU and the runtime's host-function thread stay
  /// free (CUDA may run the host functions of all streams on one thread, so a sleeping host
  /// function would also hold back every other stream's host work); on host the stream's worker
  /// sleeps. For benchmarks and tests that model a trainer's compute. Zero enqueues nothing;
  /// a negative duration throws UsageError. A failed stream may skip it.
  virtual void enqueue_busy(StreamRef stream, std::chrono::nanoseconds duration) = 0;
  /// Blocks until everything enqueued on `stream` so far has completed. Throws DeviceError if
  /// the stream has failed (see the contract above) or for a device error.
  virtual void synchronize(StreamRef stream) = 0;

  virtual DeviceStats stats() const = 0;

 protected:
  Device() = default;

  // Backends make owners and reach their implementations through these (friendship is not
  // inherited).
  DeviceBuffer make_buffer(std::byte* data, std::size_t size) noexcept {
    return DeviceBuffer(this, data, size);
  }
  Stream make_stream(std::shared_ptr<detail::StreamImpl> impl) noexcept {
    return Stream(this, std::move(impl));
  }
  Event make_event(std::shared_ptr<detail::EventImpl> impl) noexcept {
    return Event(this, std::move(impl));
  }
  PinnedRegistration make_registration(std::span<std::byte> range) noexcept {
    return PinnedRegistration(this, range);
  }
  static detail::StreamImpl* impl_of(StreamRef stream) noexcept { return stream.impl_; }
  static detail::EventImpl* impl_of(const Event& event) noexcept { return event.impl_.get(); }
  static const Device* device_of(const Event& event) noexcept { return event.device_; }

 private:
  friend class DeviceBuffer;
  friend class Stream;
  friend class Event;
  friend class PinnedRegistration;
  // zinf/cuda/cuda_interop.h: a stream made outside zinf, and the handle behind a StreamRef.
  friend AdoptedStream adopt_stream(Device& device, void* native);
  friend void* native_stream(StreamRef stream);
  friend DeviceSpan adopt_device_memory(const Device& device, void* data, std::size_t bytes);

  // The backend's check of adopt_device_memory: UsageError unless [data, data + bytes) can be
  // this device's memory.
  virtual void check_native_memory(const void* data, std::size_t bytes) const = 0;

  // The backend's half of adopt_stream: a Stream whose destruction waits for the work enqueued
  // so far but leaves the native stream alive. Throws UsageError for a handle it cannot use.
  virtual Stream adopt_native_stream(void* native) = 0;
  // The backend's native handle of `stream` (a stream of this device); UsageError otherwise.
  virtual void* native_handle(StreamRef stream) const = 0;

  // Called by the owners' destructors and members; never with an empty owner.
  virtual void free_buffer(std::byte* data, std::size_t size) noexcept = 0;
  virtual void destroy_stream(detail::StreamImpl& stream) noexcept = 0;
  virtual Status unregister_host(std::span<std::byte> host) noexcept = 0;
  virtual bool query_event(const detail::EventImpl& event) = 0;
  virtual void synchronize_event(const detail::EventImpl& event) = 0;
};

/// Builds the backend `options.kind` names. kAuto: CUDA if probe_cuda() finds a device, else
/// host, logging one notice with the reason ("no CUDA device visible (cudaGetDeviceCount:
/// cudaErrorNoDevice: ...); using host simulation"). kCuda without a usable device, or in a
/// build without CUDA, throws DeviceError with the reason. Throws UsageError for bad options
/// (negative bandwidth, a device index past the visible devices).
std::unique_ptr<Device> make_device(const DeviceOptions& options = {});

}  // namespace zinf::cuda
