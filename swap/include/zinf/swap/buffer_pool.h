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
  bool huge_pages = true;
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

/// Thread-safe. The pool must outlive its leases (ZINF_CHECK at destruction otherwise).
class BufferPool {
 public:
  /// Reserves the arena. Throws zinf::IoError (kResource) if the memory cannot be mapped, and
  /// zinf::UsageError for a bad alignment or a zero budget.
  explicit BufferPool(const BufferPoolOptions& options);
  ~BufferPool();
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  /// Leases `bytes` rounded up to whole alignment blocks, blocking until that much is free.
  /// Throws UsageError if the rounded size exceeds the whole budget (it could never be served).
  BufferLease acquire(std::size_t bytes);
  /// Like acquire but waits at most `timeout`; empty lease on timeout.
  BufferLease try_acquire(std::size_t bytes, std::chrono::nanoseconds timeout = {});

  /// The arena, for IoEngine::register_buffers and pinned registration.
  std::span<std::byte> arena() const noexcept;
  std::uint64_t budget_bytes() const noexcept;
  std::uint32_t alignment() const noexcept;
  /// Bytes leased now, and the most ever leased at once.
  std::uint64_t bytes_in_use() const noexcept;
  std::uint64_t peak_bytes_in_use() const noexcept;
  /// True if the kernel accepted MADV_HUGEPAGE for the arena.
  bool huge_pages() const noexcept;

 private:
  friend class BufferLease;
  void release(std::byte* data, std::size_t size) noexcept;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zinf::swap
