// SPDX-License-Identifier: Apache-2.0
// Reference kernels: what CpuAdam's speed is measured against, never part of the training
// path (nothing in offload/ or the C API calls them; the benchmarks and `zinf bench adam
// --reference` do).
//
// StreamRmw: the memory-bandwidth reference. A STREAM-like read-modify-write kernel
// a[i] = a[i] + s * b[i] which, like Adam, reads every array it writes, run with the same
// chunking and kind of thread pool as CpuAdam, so that the ratio of the two figures is the
// kernel's distance from the memory bound rather than a difference in threading.
#pragma once

#include <cstddef>
#include <memory>
#include <span>

namespace zinf::adam {

/// Runs a[i] = a[i] + s * b[i] over fp32 arrays on a persistent pool. A measuring reference:
/// its figure bounds what a memory-bound kernel such as CpuAdam can reach on this machine.
class StreamRmw {
 public:
  /// Bytes moved per element: read a, read b, write a.
  static constexpr std::size_t kBytesPerElement = 12;

  /// Starts the pool; `threads` counts the calling thread, 0 means one per hardware thread.
  /// Throws UsageError if `threads` exceeds 1024.
  explicit StreamRmw(std::size_t threads);
  ~StreamRmw();
  StreamRmw(const StreamRmw&) = delete;
  StreamRmw& operator=(const StreamRmw&) = delete;

  /// Updates `a` in place; blocks until done. Throws UsageError if the lengths differ or a
  /// non-empty span is null.
  void run(std::span<float> a, std::span<const float> b, float s);

  /// Returns the number of threads that run (calling thread included).
  std::size_t threads() const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zinf::adam
