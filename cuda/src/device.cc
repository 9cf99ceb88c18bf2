// SPDX-License-Identifier: Apache-2.0
// The owners (DeviceBuffer, Stream, Event, PinnedRegistration), option parsing, make_device
// with its CUDA probe and fallback to the host simulation, and the interop entry points
// (adopt_stream, native_stream) that reach the backends through Device's private hooks.
#include "zinf/cuda/device.h"

#include <cmath>
#include <string>
#include <utility>

#include "device_base.h"
#include "host_device.h"
#include "zinf/common/check.h"
#include "zinf/common/error.h"
#include "zinf/common/log.h"
#include "zinf/config.h"
#include "zinf/cuda/cuda_interop.h"
#if ZINF_HAVE_CUDA
#include "cuda_device.h"
#endif

namespace zinf::cuda {
namespace {

std::string range_error(const Device* device, std::size_t offset, std::size_t count,
                        std::size_t size) {
  std::string name = device != nullptr ? std::string(device->name()) : std::string("no device");
  return "device range out of bounds on " + name + ": offset=" + std::to_string(offset) +
         " length=" + std::to_string(count) + " size=" + std::to_string(size);
}

bool fits(std::size_t offset, std::size_t count, std::size_t size) noexcept {
  return offset <= size && count <= size - offset;
}

}  // namespace

// ---- options ----

DeviceKind parse_device_kind(std::string_view text) {
  if (text == "auto") return DeviceKind::kAuto;
  if (text == "cuda") return DeviceKind::kCuda;
  if (text == "host") return DeviceKind::kHost;
  throw UsageError("unknown device kind '" + std::string(text) + "' (expected auto, cuda or host)");
}

std::string_view device_kind_name(DeviceKind kind) noexcept {
  switch (kind) {
    case DeviceKind::kAuto: return "auto";
    case DeviceKind::kCuda: return "cuda";
    case DeviceKind::kHost: return "host";
  }
  return "unknown";
}

// ---- views ----

DeviceSpan DeviceSpan::subspan(std::size_t offset, std::size_t count) const {
  if (!fits(offset, count, size_)) throw UsageError(range_error(device_, offset, count, size_));
  return DeviceSpan(device_, data_ + offset, count);
}

DeviceSpan DeviceBuffer::span(std::size_t offset, std::size_t count) const {
  if (!fits(offset, count, size_)) throw UsageError(range_error(device_, offset, count, size_));
  return DeviceSpan(device_, data_ + offset, count);
}

std::uint64_t StreamRef::id() const noexcept { return impl_ != nullptr ? impl_->id : 0; }

// ---- owners: each releases through its Device ----

DeviceBuffer::~DeviceBuffer() { reset(); }

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : device_(std::exchange(other.device_, nullptr)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    device_ = std::exchange(other.device_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void DeviceBuffer::reset() noexcept {
  if (device_ != nullptr && data_ != nullptr) device_->free_buffer(data_, size_);
  device_ = nullptr;
  data_ = nullptr;
  size_ = 0;
}

Stream::~Stream() { release(); }

Stream::Stream(Stream&& other) noexcept
    : device_(std::exchange(other.device_, nullptr)), impl_(std::move(other.impl_)) {}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    release();
    device_ = std::exchange(other.device_, nullptr);
    impl_ = std::move(other.impl_);
  }
  return *this;
}

void Stream::release() noexcept {
  if (impl_ != nullptr) device_->destroy_stream(*impl_);
  impl_.reset();
  device_ = nullptr;
}

Event::~Event() = default;  // the backend's EventImpl releases its handle when the last user goes

Event::Event(Event&& other) noexcept
    : device_(std::exchange(other.device_, nullptr)), impl_(std::move(other.impl_)) {}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    device_ = std::exchange(other.device_, nullptr);
    impl_ = std::move(other.impl_);
  }
  return *this;
}

bool Event::query() const {
  if (impl_ == nullptr) throw UsageError("Event::query: empty event");
  return device_->query_event(*impl_);
}

void Event::synchronize() const {
  if (impl_ == nullptr) throw UsageError("Event::synchronize: empty event");
  device_->synchronize_event(*impl_);
}

PinnedRegistration::~PinnedRegistration() {
  Status s = close();
  if (!s.ok()) log(LogLevel::kWarning, "pinned registration not released: " + s.to_string());
}

PinnedRegistration::PinnedRegistration(PinnedRegistration&& other) noexcept
    : device_(std::exchange(other.device_, nullptr)), range_(std::exchange(other.range_, {})) {}

PinnedRegistration& PinnedRegistration::operator=(PinnedRegistration&& other) noexcept {
  if (this != &other) {
    Status s = close();
    if (!s.ok()) log(LogLevel::kWarning, "pinned registration not released: " + s.to_string());
    device_ = std::exchange(other.device_, nullptr);
    range_ = std::exchange(other.range_, {});
  }
  return *this;
}

Status PinnedRegistration::close() noexcept {
  if (device_ == nullptr || range_.empty()) return Status::ok_status();
  Device* device = std::exchange(device_, nullptr);
  return device->unregister_host(std::exchange(range_, {}));
}

// ---- interop ----

AdoptedStream adopt_stream(Device& device, void* native) {
  return AdoptedStream(device.adopt_native_stream(native), native);
}

DeviceSpan adopt_device_memory(const Device& device, void* data, std::size_t bytes) {
  if (bytes == 0) return DeviceSpan(&device, static_cast<std::byte*>(data), 0);
  if (data == nullptr) {
    throw UsageError("adopt_device_memory: null address for " + std::to_string(bytes) +
                     " bytes on device " + std::string(device.name()));
  }
  device.check_native_memory(data, bytes);
  return DeviceSpan(&device, static_cast<std::byte*>(data), bytes);
}

void* native_stream(StreamRef stream) {
  if (stream.empty()) throw UsageError("native_stream: empty stream");
  return stream.device()->native_handle(stream);
}

// ---- factory ----

#if !ZINF_HAVE_CUDA
CudaAvailability probe_cuda() { return CudaAvailability{0, "zinf was built without CUDA"}; }
#endif

std::unique_ptr<Device> make_device(const DeviceOptions& options) {
  if (!std::isfinite(options.host_copy_bandwidth_gbps) || options.host_copy_bandwidth_gbps < 0) {
    throw UsageError("make_device: host_copy_bandwidth_gbps must be >= 0 (0 = uncapped), got " +
                     std::to_string(options.host_copy_bandwidth_gbps));
  }
  if (options.device_index < 0) {
    throw UsageError("make_device: device_index must be >= 0, got " +
                     std::to_string(options.device_index));
  }
  if (options.kind == DeviceKind::kHost) return detail::make_host_device(options);

  // One probe decides both detection and construction (docs/style.md section 2).
  CudaAvailability cuda = probe_cuda();
  if (!cuda.available()) {
    if (options.kind == DeviceKind::kCuda) {
      throw DeviceError("CUDA device requested but none is visible (" + cuda.reason + ")");
    }
    log(LogLevel::kNotice, "no CUDA device visible (" + cuda.reason + "); using host simulation");
    return detail::make_host_device(options);
  }
  if (options.device_index >= cuda.device_count) {
    throw UsageError("make_device: device_index " + std::to_string(options.device_index) +
                     " but only " + std::to_string(cuda.device_count) +
                     " CUDA device(s) are visible");
  }
#if ZINF_HAVE_CUDA
  return detail::make_cuda_device(options);
#else
  ::zinf::detail::check_failed("cuda.available()",
                               "probe_cuda reported a device in a build without CUDA", __FILE__,
                               __LINE__);
#endif
}

}  // namespace zinf::cuda
