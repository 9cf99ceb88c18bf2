// SPDX-License-Identifier: Apache-2.0
// ChunkPool: runs an element-wise kernel over [0, n) on a persistent Boost.Asio thread pool.
// Shared by CpuAdam and the StreamRmw reference kernel. The chunk boundaries depend only on n
// and the address of the first array, never on the thread count, which is half of why results
// are bitwise identical whatever the number of threads (the other half is in the kernels).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace zinf::adam::detail {

/// Elements per chunk: 64 Ki floats (256 KiB per fp32 array). Large enough that claiming a
/// chunk (one atomic add) and restarting the hardware prefetch streams cost well under 1% of
/// its ~50 us at memory speed, small enough that threads on noisy shared vCPUs stay balanced
/// (claimed dynamically: a slow vCPU simply takes fewer chunks).
inline constexpr std::size_t kChunkElems = std::size_t{1} << 16;
/// The last one to two chunks' worth of a run is cut into chunks of this size instead, so that
/// threads finish a run within a quarter chunk of each other: a run the optimizer makes per
/// 1 Mi-element record otherwise left one thread idle for up to a whole chunk at its end.
inline constexpr std::size_t kTailChunkElems = kChunkElems / 4;

class ChunkPool {
 public:
  using ChunkFn = void (*)(const void* ctx, std::size_t begin, std::size_t end);

  /// `threads` counts the calling thread; 0 means one per hardware thread. Throws UsageError
  /// above kMaxThreads.
  explicit ChunkPool(std::size_t threads);
  ~ChunkPool();
  ChunkPool(const ChunkPool&) = delete;
  ChunkPool& operator=(const ChunkPool&) = delete;

  static constexpr std::size_t kMaxThreads = 1024;

  std::size_t threads() const noexcept { return threads_; }

  /// Calls fn(ctx, begin, end) once per chunk of [0, n) and returns when all are done. Chunks
  /// hold kChunkElems elements, the last ones kTailChunkElems, and their boundaries depend on
  /// n and the anchor only; they fall where `anchor + index * elem_bytes` is 64-byte aligned
  /// (if it can be), so that no two threads write the same cache line of an array aligned like
  /// the anchor. `fn` must not throw. Safe to call from several threads at once.
  void run(std::size_t n, const void* anchor, std::size_t elem_bytes, ChunkFn fn, const void* ctx);

 private:
  struct Pool;
  std::size_t threads_;
  std::unique_ptr<Pool> pool_;  // null when threads_ == 1
};

}  // namespace zinf::adam::detail
