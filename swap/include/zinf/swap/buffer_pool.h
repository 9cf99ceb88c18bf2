// SPDX-License-Identifier: Apache-2.0
// BufferPool: aligned host memory for I/O under a byte budget that is never exceeded, backed by
// transparent huge pages where the system gives them. Part of zinf::swap.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

namespace zinf::swap {

class BufferPool;

struct BufferPoolOptions {
  /// The most bytes the pool ever holds (rounded up to whole blocks). The whole budget is
  /// reserved as one arena at construction, so it is also what may be pinned or registered.
  std::uint64_t budget_bytes = 256ull << 20;
  /// Alignment of every lease and granule of its size (a power of two >= 4096; use the largest
  /// File::alignment() of the files it serves).
  std::uint32_t alignment = 4096;
  /// Ask for 2 MiB transparent huge pages (madvise); falls back quietly where refused.
  /// Why: a 1 MiB transfer from 4 KiB pages spans 256 memory segments and the block layer
  /// splits it in two (254-segment limit); from 2 MiB pages it goes whole (the figure:
  /// docs/benchmarks.md, "Figures behind the defaults").
  bool huge_pages = true;
  /// Touch every page of the arena at construction (MADV_POPULATE_WRITE, else a write per
  /// page), so that the first I/O into a lease does not pay for page faults. Costs the time to
  /// zero the whole budget up front, and makes the whole budget resident at once.
  bool prefault = false;
};

/// A move-only lease on `size()` bytes of the pool; returns them on destruction.
class BufferLease {
 public:
  BufferLease() = default;
  BufferLease(BufferLease&& other) noexcept;
  BufferLease& operator=(BufferLease&& other) noexcept;
  BufferLease(const BufferLease&) = delete;
  BufferLease& operator=(const BufferLease&) = delete;
  ~BufferLease();

  std::span<std::byte> span() const noexcept { return {data_, size_}; }
  std::byte* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  explicit operator bool() const noexcept { return data_ != nullptr; }
  /// Returns the memory to the pool now.
  void reset() noexcept;

 private:
  friend class BufferPool;
  BufferLease(BufferPool* pool, std::byte* data, std::size_t size) noexcept
      : pool_(pool), data_(data), size_(size) {}
  BufferPool* pool_ = nullptr;
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

/// Aligned host memory under a byte budget. The arena is one private anonymous mapping of the
/// whole budget, aligned to 2 MiB (or `alignment` if larger); leases are carved from it first
/// fit, in whole alignment blocks, and merged back when returned, so the budget can never be
/// exceeded. Waiters are served in arrival order: a large request is not starved by a stream of
/// small ones (a small request waits behind a large one that does not fit yet).
/// Thread-safe. The pool must outlive its leases (ZINF_CHECK at destruction otherwise).
class BufferPool {
 public:
  /// Reserves the arena. Throws zinf::IoError (kResource) if the memory cannot be mapped, and
  /// zinf::UsageError for a bad alignment or a zero budget.
  explicit BufferPool(const BufferPoolOptions& options);
  ~BufferPool();
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  /// Leases `bytes` rounded up to whole alignment blocks, blocking until that much is free as
  /// one contiguous run and every earlier waiter has been served. The memory is not cleared.
  /// Throws UsageError for zero bytes, or if the rounded size exceeds the whole budget (it
  /// could never be served; the message names both numbers).
  BufferLease acquire(std::size_t bytes);
  /// Like acquire but waits at most `timeout` (zero: does not wait); an empty lease on timeout.
  BufferLease try_acquire(std::size_t bytes, std::chrono::nanoseconds timeout = {});

  /// The arena, for IoEngine::register_buffers and pinned registration.
  std::span<std::byte> arena() const noexcept;
  std::uint64_t budget_bytes() const noexcept;
  std::uint32_t alignment() const noexcept;
  /// Bytes leased now, and the most ever leased at once.
  std::uint64_t bytes_in_use() const noexcept;
  std::uint64_t peak_bytes_in_use() const noexcept;
  /// Callers blocked in acquire/try_acquire now (a stall indicator for stats and tests).
  std::size_t waiting() const noexcept;
  /// True if huge pages were asked for and the kernel accepted MADV_HUGEPAGE for the arena
  /// (and transparent huge pages are not disabled system-wide).
  bool huge_pages() const noexcept;

 private:
  friend class BufferLease;
  void release(std::byte* data, std::size_t size) noexcept;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zinf::swap
