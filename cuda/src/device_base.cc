// SPDX-License-Identifier: Apache-2.0
// DeviceBase: argument checks, memory/copy accounting and the pinned-range registry shared by
// the CUDA and host backends.
#include "device_base.h"

#include <charconv>
#include <iterator>
#include <string>
#include <utility>

#include "zinf/common/check.h"
#include "zinf/common/error.h"
#include "zinf/common/log.h"

namespace zinf::cuda::detail {

std::string hex_address(const void* p) {
  char buf[2 + 2 * sizeof(std::uintptr_t)] = {'0', 'x'};
  auto [end, ec] =
      std::to_chars(buf + 2, buf + sizeof(buf), reinterpret_cast<std::uintptr_t>(p), 16);
  (void)ec;  // the buffer holds every uintptr_t
  return std::string(buf, end);
}

DeviceBase::DeviceBase(std::uint64_t capacity_bytes, bool enforce_capacity) noexcept
    : capacity_bytes_(capacity_bytes), enforce_capacity_(enforce_capacity) {}

void DeviceBase::check_no_live_owners() const noexcept {
  std::size_t pinned = 0;
  {
    std::lock_guard lock(pinned_mu_);
    pinned = pinned_.size();
  }
  std::uint64_t buffers = live_allocations_.load();
  std::uint64_t streams = live_streams_.load();
  if (buffers != 0 || streams != 0 || pinned != 0) {
    log(LogLevel::kError, std::string(name()) + " destroyed while " + std::to_string(buffers) +
                              " buffer(s), " + std::to_string(streams) + " stream(s) and " +
                              std::to_string(pinned) + " pinned registration(s) still live");
  }
  ZINF_CHECK(buffers == 0 && streams == 0 && pinned == 0,
             "every DeviceBuffer, Stream and PinnedRegistration must die before its Device");
}

std::string DeviceBase::usage_text(std::string_view op, std::string_view what) const {
  std::string out(op);
  out += " on ";
  out += name();
  out += ": ";
  out += what;
  return out;
}

// ---- memory ----

DeviceBuffer DeviceBase::allocate(std::size_t bytes) {
  if (bytes == 0) return DeviceBuffer();
  // Reserve before allocating and give back on failure, so concurrent allocations never pass
  // the capacity together (docs/style.md section 4, byte budget with rollback).
  std::uint64_t before = allocated_bytes_.load();
  if (enforce_capacity_ && capacity_bytes_ != 0) {
    do {
      if (bytes > capacity_bytes_ || before > capacity_bytes_ - bytes) {
        throw DeviceError(usage_text(
            "allocate", std::to_string(bytes) + " bytes do not fit in device memory (capacity " +
                            std::to_string(capacity_bytes_) + " bytes, " + std::to_string(before) +
                            " allocated)"));
      }
    } while (!allocated_bytes_.compare_exchange_weak(before, before + bytes));
  } else {
    before = allocated_bytes_.fetch_add(bytes);
  }
  std::byte* data = nullptr;
  try {
    data = do_allocate(bytes);
  } catch (...) {
    allocated_bytes_.fetch_sub(bytes);
    throw;
  }
  std::uint64_t now = before + bytes;
  std::uint64_t peak = peak_allocated_bytes_.load();
  while (peak < now && !peak_allocated_bytes_.compare_exchange_weak(peak, now)) {}
  live_allocations_.fetch_add(1);
  total_allocations_.fetch_add(1);
  return make_buffer(data, bytes);
}

void DeviceBase::free_buffer(std::byte* data, std::size_t size) noexcept {
  do_free(data, size);
  allocated_bytes_.fetch_sub(size);
  live_allocations_.fetch_sub(1);
}

// ---- streams and events ----

Stream DeviceBase::create_stream() {
  std::shared_ptr<StreamImpl> impl = do_create_stream(next_stream_id_.fetch_add(1));
  live_streams_.fetch_add(1);
  return make_stream(std::move(impl));
}

Stream DeviceBase::adopt_native_stream(void* native) {
  std::shared_ptr<StreamImpl> impl = do_adopt_stream(next_stream_id_.fetch_add(1), native);
  // Counted as a live stream: it must go before this device like any other.
  live_streams_.fetch_add(1);
  return make_stream(std::move(impl));
}

void* DeviceBase::native_handle(StreamRef stream) const {
  return do_native_handle(checked_stream(stream, "native_stream"));
}

void DeviceBase::destroy_stream(StreamImpl& stream) noexcept {
  do_destroy_stream(stream);
  live_streams_.fetch_sub(1);
}

Event DeviceBase::create_event() { return make_event(do_create_event()); }

StreamImpl& DeviceBase::checked_stream(StreamRef stream, std::string_view op) const {
  if (stream.empty()) throw UsageError(usage_text(op, "empty stream"));
  if (stream.device() != this)
    throw UsageError(usage_text(op, "the stream belongs to another device"));
  return *impl_of(stream);
}

EventImpl& DeviceBase::checked_event(const Event& event, std::string_view op) const {
  if (event.empty()) throw UsageError(usage_text(op, "empty event"));
  if (device_of(event) != this)
    throw UsageError(usage_text(op, "the event belongs to another device"));
  return *impl_of(event);
}

void DeviceBase::check_span(DeviceSpan span, std::size_t host_size, std::string_view op,
                            CopyDirection direction) const {
  if (!span.empty() && span.device() != this) {
    throw UsageError(usage_text(op, "the device span belongs to another device"));
  }
  if (span.size() != host_size) {
    bool to_device = direction == CopyDirection::kToDevice;
    std::size_t src = to_device ? host_size : span.size();
    std::size_t dst = to_device ? span.size() : host_size;
    throw UsageError(usage_text(op, "source length " + std::to_string(src) +
                                        " != destination length " + std::to_string(dst)));
  }
}

// ---- enqueue ----

void DeviceBase::copy_to_device(StreamRef stream, DeviceSpan dst, std::span<const std::byte> src) {
  StreamImpl& s = checked_stream(stream, "copy_to_device");
  check_span(dst, src.size(), "copy_to_device", CopyDirection::kToDevice);
  if (src.empty()) return;
  bool pinned = is_pinned(src.data(), src.size());
  do_copy(s, dst.data(), src.data(), src.size(), CopyDirection::kToDevice);
  bytes_to_device_.fetch_add(src.size());
  if (!pinned) pageable_copies_.fetch_add(1);
}

void DeviceBase::copy_to_host(StreamRef stream, std::span<std::byte> dst, DeviceSpan src) {
  StreamImpl& s = checked_stream(stream, "copy_to_host");
  check_span(src, dst.size(), "copy_to_host", CopyDirection::kToHost);
  if (dst.empty()) return;
  bool pinned = is_pinned(dst.data(), dst.size());
  do_copy(s, dst.data(), src.data(), dst.size(), CopyDirection::kToHost);
  bytes_to_host_.fetch_add(dst.size());
  if (!pinned) pageable_copies_.fetch_add(1);
}

void DeviceBase::copy_on_device(StreamRef stream, DeviceSpan dst, DeviceSpan src) {
  StreamImpl& s = checked_stream(stream, "copy_on_device");
  for (const DeviceSpan* span : {&dst, &src}) {
    if (!span->empty() && span->device() != this) {
      throw UsageError(usage_text("copy_on_device", "a device span belongs to another device"));
    }
  }
  if (dst.size() != src.size()) {
    throw UsageError(usage_text("copy_on_device", "source length " + std::to_string(src.size()) +
                                                      " != destination length " +
                                                      std::to_string(dst.size())));
  }
  if (src.empty()) return;
  if (dst.data() < src.data() + src.size() && src.data() < dst.data() + dst.size()) {
    throw UsageError(usage_text("copy_on_device", "source " + hex_address(src.data()) +
                                                      " and destination " +
                                                      hex_address(dst.data()) + " overlap"));
  }
  do_copy(s, dst.data(), src.data(), src.size(), CopyDirection::kOnDevice);
  bytes_on_device_.fetch_add(src.size());
}

void DeviceBase::record(Event& event, StreamRef stream) {
  EventImpl& e = checked_event(event, "record");
  do_record(e, checked_stream(stream, "record"));
}

void DeviceBase::wait(StreamRef stream, const Event& event) {
  StreamImpl& s = checked_stream(stream, "wait");
  do_wait(s, checked_event(event, "wait"));
}

void DeviceBase::enqueue_host_work(StreamRef stream, std::function<void()> work) {
  StreamImpl& s = checked_stream(stream, "enqueue_host_work");
  if (!work) throw UsageError(usage_text("enqueue_host_work", "empty function"));
  do_host_work(s, std::move(work));
}

void DeviceBase::enqueue_busy(StreamRef stream, std::chrono::nanoseconds duration) {
  StreamImpl& s = checked_stream(stream, "enqueue_busy");
  if (duration < std::chrono::nanoseconds::zero()) {
    throw UsageError(usage_text("enqueue_busy",
                                "negative duration " + std::to_string(duration.count()) + " ns"));
  }
  if (duration == std::chrono::nanoseconds::zero()) return;
  do_busy(s, duration);
}

void DeviceBase::synchronize(StreamRef stream) {
  do_synchronize(checked_stream(stream, "synchronize"));
}

// ---- pinned registration ----

PinnedRegistration DeviceBase::register_host(std::span<std::byte> host) {
  if (host.empty()) throw UsageError(usage_text("register_host", "empty range"));
  auto start = reinterpret_cast<std::uintptr_t>(host.data());
  std::lock_guard lock(pinned_mu_);
  // Ranges are disjoint, so only the neighbours on either side can overlap.
  auto next = pinned_.upper_bound(start);
  auto overlap = pinned_.end();
  if (next != pinned_.begin() && std::prev(next)->first + std::prev(next)->second > start) {
    overlap = std::prev(next);
  } else if (next != pinned_.end() && next->first < start + host.size()) {
    overlap = next;
  }
  if (overlap != pinned_.end()) {
    throw DeviceError(
        usage_text("register_host", "address=" + hex_address(host.data()) +
                                        " length=" + std::to_string(host.size()) +
                                        " overlaps a registered range (address=" +
                                        hex_address(reinterpret_cast<const void*>(overlap->first)) +
                                        " length=" + std::to_string(overlap->second) + ")"));
  }
  do_register_host(host);  // under the lock: a racing overlapping registration cannot slip in
  pinned_.emplace(start, host.size());
  pinned_bytes_ += host.size();
  return make_registration(host);
}

Status DeviceBase::unregister_host(std::span<std::byte> host) noexcept {
  std::lock_guard lock(pinned_mu_);
  auto it = pinned_.find(reinterpret_cast<std::uintptr_t>(host.data()));
  ZINF_CHECK(it != pinned_.end() && it->second == host.size(),
             "a PinnedRegistration's range is in its device's registry");
  pinned_.erase(it);
  pinned_bytes_ -= host.size();
  return do_unregister_host(host);
}

bool DeviceBase::is_pinned(const void* p, std::size_t n) const {
  auto start = reinterpret_cast<std::uintptr_t>(p);
  std::lock_guard lock(pinned_mu_);
  auto next = pinned_.upper_bound(start);
  if (next == pinned_.begin()) return false;
  auto range = std::prev(next);
  return start - range->first <= range->second && n <= range->second - (start - range->first);
}

DeviceStats DeviceBase::stats() const {
  DeviceStats s;
  s.capacity_bytes = capacity_bytes_;
  s.allocated_bytes = allocated_bytes_.load();
  s.peak_allocated_bytes = peak_allocated_bytes_.load();
  s.live_allocations = live_allocations_.load();
  s.total_allocations = total_allocations_.load();
  s.bytes_to_device = bytes_to_device_.load();
  s.bytes_to_host = bytes_to_host_.load();
  s.bytes_on_device = bytes_on_device_.load();
  s.pageable_copies = pageable_copies_.load();
  std::lock_guard lock(pinned_mu_);
  s.pinned_bytes = pinned_bytes_;
  s.pinned_registrations = pinned_.size();
  return s;
}

}  // namespace zinf::cuda::detail
