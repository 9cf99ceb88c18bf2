// SPDX-License-Identifier: Apache-2.0
// dma_copy (white-box: private to zinf::cuda): every byte of copies of every alignment of
// source and destination, around the 64-byte body and the streaming threshold, and nothing
// written outside the destination.
#include "dma_copy.h"

#include <cstddef>
#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

namespace zinf::cuda::detail {
namespace {

constexpr std::size_t kGuard = 128;

std::byte value_at(std::size_t i) { return static_cast<std::byte>((i * 131 + 7) % 251); }

// Copies n bytes from src_offset into dst_offset of fresh buffers with `copy`, then checks
// the copy and that the guard bytes around the destination are untouched.
template <typename Copy>
void check_copy(Copy copy, std::size_t n, std::size_t src_offset, std::size_t dst_offset) {
  std::vector<std::byte> src(n + src_offset + kGuard);
  std::vector<std::byte> dst(n + dst_offset + 2 * kGuard, std::byte{0xEE});
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = value_at(i);
  std::byte* d = dst.data() + kGuard + dst_offset;
  copy(d, src.data() + src_offset, n);
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_EQ(d[i], value_at(i + src_offset))
        << "byte " << i << " of " << n << " (src+" << src_offset << ", dst+" << dst_offset << ")";
  }
  for (std::size_t i = 0; i < dst.size(); ++i) {
    const bool inside = i >= kGuard + dst_offset && i < kGuard + dst_offset + n;
    if (!inside) {
      ASSERT_EQ(dst[i], std::byte{0xEE}) << "guard byte " << i << " written, n=" << n;
    }
  }
}

TEST(DmaCopy, StreamingCopyIsExactForEverySizeAndAlignment) {
  for (std::size_t n : {0, 1, 15, 16, 17, 63, 64, 65, 127, 128, 129, 1000, 4096, 4099}) {
    for (std::size_t so = 0; so < 17; ++so) {
      for (std::size_t d = 0; d < 17; ++d) check_copy(streaming_copy, n, so, d);
    }
  }
}

TEST(DmaCopy, AroundTheThresholdBothPathsAreExact) {
  constexpr std::size_t t = kStreamingCopyThreshold;
  for (std::size_t n : {t - 1, t, t + 1, t + 63, t + 4096}) {
    for (std::size_t offset : {0, 3, 16, 61}) {
      check_copy(dma_copy, n, offset, 0);
      check_copy(dma_copy, n, 0, offset);
    }
  }
}

}  // namespace
}  // namespace zinf::cuda::detail
