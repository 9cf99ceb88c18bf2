// SPDX-License-Identifier: Apache-2.0
// BufferPool: one anonymous mapping of the whole budget, aligned for huge pages, carved into
// leases by a first-fit RangeAllocator under a mutex, with FIFO waiters on a condition variable.
#include "zinf/swap/buffer_pool.h"

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <fstream>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "range_allocator.h"
#include "zinf/common/align.h"
#include "zinf/common/check.h"
#include "zinf/common/error.h"
#include "zinf/common/log.h"
#include "zinf/common/status.h"

namespace zinf::swap {
namespace {

// The transparent huge page size on x86-64 and arm64 with 4 KiB base pages.
constexpr std::uint64_t kHugePageBytes = 2ull << 20;

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; Debian 12's headers may predate it
#endif

// True unless /sys says transparent huge pages are off ("[never]"): madvise(MADV_HUGEPAGE)
// succeeds even then, so its return value alone would claim huge pages we will never get.
bool thp_enabled_system_wide() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  if (!std::getline(in, line)) return false;
  return line.find("[never]") == std::string::npos;
}

// The one owner of the arena mapping. Over-maps by the alignment and unmaps the slack at both
// ends, so the kept mapping is exactly [data, data + size) and aligned.
class Mapping {
 public:
  Mapping(std::uint64_t size, std::uint64_t align) {
    std::uint64_t len = size + align;
    void* p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      throw IoError(Status::from_errno(err, "buffer pool mmap", {}, Status::kUnset, len)
                        .with_code(ErrorCode::kResource)
                        .with_message("cannot map " + std::to_string(len) +
                                      " bytes for the buffer pool arena: " + std::strerror(err)));
    }
    auto base = reinterpret_cast<std::uintptr_t>(p);
    std::uintptr_t aligned = align_up(base, align);
    std::uintptr_t head = aligned - base;
    std::uintptr_t tail = len - head - size;
    // munmap of a page-aligned part of our own mapping cannot fail; a failure would only leak.
    if (head > 0) ::munmap(p, head);
    if (tail > 0) ::munmap(reinterpret_cast<void*>(aligned + size), tail);
    data_ = reinterpret_cast<std::byte*>(aligned);
    size_ = size;
  }
  ~Mapping() {
    if (data_ != nullptr && ::munmap(data_, size_) != 0) {
      log(LogLevel::kWarning,
          "buffer pool: munmap of the arena failed: " + std::string(std::strerror(errno)));
    }
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;

  std::byte* data() const noexcept { return data_; }
  std::uint64_t size() const noexcept { return size_; }

 private:
  std::byte* data_ = nullptr;
  std::uint64_t size_ = 0;
};

}  // namespace

struct BufferPool::Impl {
  Impl(std::uint64_t budget, std::uint32_t align, std::uint64_t map_align)
      : mapping(budget, map_align), alignment(align), allocator(budget / align) {}

  Mapping mapping;
  std::uint32_t alignment;
  bool huge_pages = false;

  mutable std::mutex mu;
  std::condition_variable cv;
  detail::RangeAllocator allocator;  // in units of `alignment` bytes
  std::size_t live_leases = 0;
  std::deque<std::uint64_t> waiters;  // tickets of blocked acquirers, in arrival order
  std::uint64_t next_ticket = 0;
  std::atomic<std::uint64_t> in_use{0};
  std::atomic<std::uint64_t> peak{0};

  // Carves `units` if a run is free; caller holds mu. Reserves the free list's room first so
  // that the matching release() cannot allocate.
  std::byte* carve(std::uint64_t units) {
    if (allocator.largest_free_run() < units) return nullptr;
    allocator.reserve_for(live_leases + 1);
    std::optional<std::uint64_t> start = allocator.allocate(units);
    if (!start) return nullptr;
    ++live_leases;
    std::uint64_t now = in_use.load(std::memory_order_relaxed) + units * alignment;
    in_use.store(now, std::memory_order_relaxed);
    if (now > peak.load(std::memory_order_relaxed)) peak.store(now, std::memory_order_relaxed);
    return mapping.data() + *start * alignment;
  }

  // Returns `bytes` rounded to whole blocks, or throws UsageError if it can never be served.
  std::uint64_t checked_size(std::size_t bytes, const char* op) const {
    if (bytes == 0) throw UsageError(std::string("BufferPool: ") + op + " of 0 bytes");
    // A size whose padding passes 2^64 exceeds any budget: refused below like one that does not.
    const std::uint64_t rounded = checked_align_up(bytes, alignment).value_or(UINT64_MAX);
    if (rounded > mapping.size()) {
      throw UsageError(std::string("BufferPool: ") + op + " of " + std::to_string(bytes) +
                       " bytes (" + std::to_string(rounded) + " rounded to " +
                       std::to_string(alignment) + "-byte blocks) exceeds the budget of " +
                       std::to_string(mapping.size()) + " bytes");
    }
    return rounded;
  }

  // Carves `units`, waiting in arrival order until they fit, or until `deadline` passes
  // (nullptr then). A request that fits at once and finds nobody waiting never queues; a
  // queued request carves only when it is at the head, so a large one is never overtaken.
  // Leaving the queue (success, timeout or exception) wakes the others: the new head may fit.
  std::byte* wait_and_carve(std::uint64_t units,
                            std::optional<std::chrono::steady_clock::time_point> deadline) {
    std::unique_lock lock(mu);
    if (waiters.empty()) {
      if (std::byte* p = carve(units)) return p;
    }
    if (deadline && std::chrono::steady_clock::now() >= *deadline) return nullptr;
    const std::uint64_t ticket = next_ticket++;
    waiters.push_back(ticket);
    std::byte* p = nullptr;
    try {
      for (;;) {
        if (waiters.front() == ticket && (p = carve(units)) != nullptr) break;
        if (!deadline) {
          cv.wait(lock);
        } else if (cv.wait_until(lock, *deadline) == std::cv_status::timeout) {
          if (waiters.front() == ticket) p = carve(units);  // last look before giving up
          break;
        }
      }
    } catch (...) {
      std::erase(waiters, ticket);
      cv.notify_all();
      throw;
    }
    std::erase(waiters, ticket);
    cv.notify_all();
    return p;
  }
};

BufferLease::BufferLease(BufferLease&& other) noexcept
    : pool_(std::exchange(other.pool_, nullptr)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

BufferLease& BufferLease::operator=(BufferLease&& other) noexcept {
  if (this != &other) {
    reset();
    pool_ = std::exchange(other.pool_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

BufferLease::~BufferLease() { reset(); }

void BufferLease::reset() noexcept {
  if (pool_ != nullptr && data_ != nullptr) pool_->release(data_, size_);
  pool_ = nullptr;
  data_ = nullptr;
  size_ = 0;
}

BufferPool::BufferPool(const BufferPoolOptions& options) {
  const std::uint32_t align = options.alignment;
  if (align < 4096 || (align & (align - 1)) != 0) {
    throw UsageError("BufferPool: alignment " + std::to_string(align) +
                     " is not a power of two >= 4096");
  }
  if (options.budget_bytes == 0) throw UsageError("BufferPool: budget_bytes is 0");
  const std::optional<std::uint64_t> budget_up = checked_align_up(options.budget_bytes, align);
  if (!budget_up) {
    throw UsageError("BufferPool: budget_bytes " + std::to_string(options.budget_bytes) +
                     " rounded to " + std::to_string(align) + "-byte blocks exceeds 2^64");
  }
  const std::uint64_t budget = *budget_up;
  std::uint64_t map_align = std::max<std::uint64_t>(kHugePageBytes, align);
  impl_ = std::make_unique<Impl>(budget, align, map_align);

  if (options.huge_pages) {
    if (::madvise(impl_->mapping.data(), budget, MADV_HUGEPAGE) == 0) {
      impl_->huge_pages = thp_enabled_system_wide();
      if (!impl_->huge_pages) {
        log(LogLevel::kInfo, "buffer pool: transparent huge pages are disabled; using 4 KiB pages");
      }
    } else {
      log(LogLevel::kInfo, std::string("buffer pool: madvise(MADV_HUGEPAGE) refused (") +
                               errno_name(errno) + "); using 4 KiB pages");
    }
  }
  if (options.prefault) {
    // One call faults in the whole range (huge pages where granted); older kernels say EINVAL
    // and get one write per base page instead.
    if (::madvise(impl_->mapping.data(), budget, MADV_POPULATE_WRITE) != 0) {
      const auto page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
      volatile std::byte* p = impl_->mapping.data();
      for (std::uint64_t off = 0; off < budget; off += page) p[off] = std::byte{0};
    }
  }
}

BufferPool::~BufferPool() {
  ZINF_CHECK(impl_->in_use.load() == 0, "BufferPool destroyed while leases are outstanding");
}

BufferLease BufferPool::acquire(std::size_t bytes) {
  const std::uint64_t rounded = impl_->checked_size(bytes, "acquire");
  std::byte* p = impl_->wait_and_carve(rounded / impl_->alignment, std::nullopt);
  return BufferLease(this, p, rounded);
}

BufferLease BufferPool::try_acquire(std::size_t bytes, std::chrono::nanoseconds timeout) {
  const std::uint64_t rounded = impl_->checked_size(bytes, "try_acquire");
  // A timeout beyond a day is "forever": now() + nanoseconds::max() would overflow.
  std::optional<std::chrono::steady_clock::time_point> deadline;
  if (timeout < std::chrono::hours(24)) deadline = std::chrono::steady_clock::now() + timeout;
  std::byte* p = impl_->wait_and_carve(rounded / impl_->alignment, deadline);
  if (p == nullptr) return {};
  return BufferLease(this, p, rounded);
}

void BufferPool::release(std::byte* data, std::size_t size) noexcept {
  const std::uint64_t units = size / impl_->alignment;
  const auto start = static_cast<std::uint64_t>(data - impl_->mapping.data()) / impl_->alignment;
  {
    std::lock_guard lock(impl_->mu);
    impl_->allocator.free(start, units);  // room reserved at carve(): cannot allocate
    --impl_->live_leases;
    impl_->in_use.store(impl_->in_use.load(std::memory_order_relaxed) - size,
                        std::memory_order_relaxed);
  }
  impl_->cv.notify_all();
}

std::span<std::byte> BufferPool::arena() const noexcept {
  return {impl_->mapping.data(), impl_->mapping.size()};
}
std::uint64_t BufferPool::budget_bytes() const noexcept { return impl_->mapping.size(); }
std::uint32_t BufferPool::alignment() const noexcept { return impl_->alignment; }
std::uint64_t BufferPool::bytes_in_use() const noexcept {
  return impl_->in_use.load(std::memory_order_relaxed);
}
std::uint64_t BufferPool::peak_bytes_in_use() const noexcept {
  return impl_->peak.load(std::memory_order_relaxed);
}
bool BufferPool::huge_pages() const noexcept { return impl_->huge_pages; }
std::size_t BufferPool::waiting() const noexcept {
  std::lock_guard lock(impl_->mu);
  return impl_->waiters.size();
}

}  // namespace zinf::swap
