// SPDX-License-Identifier: Apache-2.0
// dma_copy: the host simulation's stand-in for a copy engine. Large copies are written with
// non-temporal (streaming) stores, as DMA writes device memory without passing through the
// CPU's caches. Private to zinf::cuda (HostDevice); white-box tested and benchmarked.
#pragma once

#include <cstddef>

namespace zinf::cuda::detail {

/// Copies below this many bytes go through memcpy: source and destination fit in the caches,
/// where ordinary stores are as fast and leave the data warm for the next reader. Above it,
/// streaming stores keep their rate while memcpy falls (docs/benchmarks.md, "The host
/// simulation's copy threshold", with its command).
inline constexpr std::size_t kStreamingCopyThreshold = std::size_t{2} << 20;

/// Copies n bytes from src to dst (which must not overlap), with streaming stores when n is at
/// least kStreamingCopyThreshold and the CPU has them (x86-64: SSE2, part of the baseline);
/// memcpy otherwise. Any alignment. Ends with a store fence, so the bytes are visible to
/// another thread that sees any later store of this thread (an event completing). Thread-safe.
void dma_copy(std::byte* dst, const std::byte* src, std::size_t n) noexcept;

/// The streaming path alone, whatever n (for tests and the benchmark); memcpy where the CPU
/// has no streaming stores.
void streaming_copy(std::byte* dst, const std::byte* src, std::size_t n) noexcept;

}  // namespace zinf::cuda::detail
