// SPDX-License-Identifier: Apache-2.0
// The loop order the AVX2 and portable paths choose from their arrays' addresses
// (adam/src/loop_order.h, issue #37): sequential where no load follows a store it may collide
// with (equal addresses mod 1 MiB) within the kernel's safe distance, windowed where arrays lie
// a few pieces apart mod 1 MiB, and on the layouts zinf makes itself (the optimizer's
// [params | m | v] records of any length, their gradients 4 KiB aligned) an order with no such
// pair nearer than the safe distance.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "cpu_adam_kernel.h"
#include "loop_order.h"

namespace zinf::adam::detail {
namespace {

constexpr std::uintptr_t kBase = std::uintptr_t{1} << 32;  // 2 MiB aligned; never dereferenced

// Arguments whose p, m, v and fp32 gradients start at these byte offsets past kBase.
KernelArgs args_at(std::uintptr_t p, std::uintptr_t m, std::uintptr_t v, std::uintptr_t g) {
  KernelArgs a{};
  a.params = reinterpret_cast<float*>(kBase + p);
  a.m = reinterpret_cast<float*>(kBase + m);
  a.v = reinterpret_cast<float*>(kBase + v);
  a.grads = reinterpret_cast<const void*>(kBase + g);
  a.grad_type = ElementType::kF32;
  return a;
}

// The nearest aliasing pair, in pieces, of one order on these arguments (as the choice sees it).
std::size_t nearest(const KernelArgs& a, bool windowed, std::size_t safe) {
  const auto addr = [](const void* q) {
    return static_cast<std::uint32_t>(reinterpret_cast<std::uintptr_t>(q));
  };
  const std::uint32_t arrays[] = {addr(a.params), addr(a.m), addr(a.v), addr(a.grads)};
  std::size_t d = safe;
  for (std::size_t x = 0; x < 4; ++x) {
    for (std::size_t y = 0; y < 3; ++y) {
      if (x != y)
        d = std::min(d, alias_distance(windowed, (arrays[y] - arrays[x]) & kAliasMask, safe));
    }
  }
  return d;
}

constexpr std::size_t kSafe[] = {4, 5};  // the portable and AVX2 paths' own

TEST(LoopOrder, EqualOffsetsAndWideStaggersStaySequential) {
  for (std::size_t safe : kSafe) {
    EXPECT_FALSE(use_windowed_order(args_at(0, 0, 0, 0), safe));
    EXPECT_FALSE(use_windowed_order(args_at(0, 1 << 21, 2 << 21, 3 << 21), safe));
    EXPECT_FALSE(use_windowed_order(args_at(0, 1088, 2176, 3264), safe));
    EXPECT_FALSE(use_windowed_order(args_at(0, 4096 + 256, 8192 + 768, 1280), safe));
    // A small gap plus a power of two from 4 KiB to 512 KiB: apart mod 1 MiB.
    for (std::uintptr_t far = 4096; far < (1u << 20); far *= 2) {
      EXPECT_FALSE(use_windowed_order(args_at(0, far + 16, 0, 0), safe));
    }
  }
}

TEST(LoopOrder, ArraysAFewPiecesApartTakeTheWindowedOrder) {
  for (std::size_t safe : kSafe) {
    for (std::uintptr_t gap : {16u, 32u, 48u, 64u, 96u}) {
      SCOPED_TRACE("gap=" + std::to_string(gap) + " safe=" + std::to_string(safe));
      EXPECT_TRUE(use_windowed_order(args_at(0, gap, 2 * gap, 3 * gap), safe));
      EXPECT_TRUE(use_windowed_order(args_at(3 * gap, 2 * gap, gap, 0), safe));
      // One array moved alone, each way round, and one page further.
      EXPECT_TRUE(use_windowed_order(args_at(0, gap, 0, 0), safe));
      EXPECT_TRUE(use_windowed_order(args_at(gap, 0, 0, 0), safe));
      EXPECT_TRUE(use_windowed_order(args_at(0, (1 << 20) - gap, 0, 0), safe));
      EXPECT_TRUE(use_windowed_order(args_at(0, 0, (1 << 20) + gap, 0), safe));
      EXPECT_TRUE(use_windowed_order(args_at(0, 0, (1 << 21) + gap, 0), safe));
    }
  }
}

// Gradients only read: one a few pieces past the arrays written is no hazard, one before them
// is; narrow gradients drift against the fp32 arrays and are not counted.
TEST(LoopOrder, GradientsCountOnlyAsALoadAndOnlyWhenFp32) {
  for (std::size_t safe : kSafe) {
    EXPECT_FALSE(use_windowed_order(args_at(64, 64, 64, 128), safe));
    EXPECT_TRUE(use_windowed_order(args_at(64, 64, 64, 0), safe));
    KernelArgs narrow = args_at(64, 64, 64, 0);
    narrow.grad_type = ElementType::kBF16;
    EXPECT_FALSE(use_windowed_order(narrow, safe));
  }
}

// Where both orders have an aliasing pair, the one whose pair is further away is taken.
TEST(LoopOrder, TakesTheOrderWithTheFurtherPair) {
  // Sequential: m 32 bytes past p (one piece). Windowed: v 2048 + 16 bytes past p (four).
  const KernelArgs a = args_at(0, 32, 2048 + 16, 0);
  EXPECT_EQ(nearest(a, false, 5), 1u);
  EXPECT_EQ(nearest(a, true, 5), 4u);
  EXPECT_TRUE(use_windowed_order(a, 5));
  // Sequential: m 96 bytes past p (three). Windowed: v 512 bytes past p (one).
  const KernelArgs b = args_at(0, 96, 512, 0);
  EXPECT_EQ(nearest(b, false, 5), 3u);
  EXPECT_EQ(nearest(b, true, 5), 1u);
  EXPECT_FALSE(use_windowed_order(b, 5));
}

// The optimizer's records hold [params | m | v] of n elements contiguously in 4 KiB-aligned
// slots, and their gradients come 4 KiB aligned (optim/src/optimizer_impl.h, RecordLayout):
// for every n up to 4096 and within 2048 of each multiple of 256 Ki (where m and v come within
// a few pieces of params mod 1 MiB), the order chosen has no colliding pair nearer than the
// kernel's safe distance.
TEST(LoopOrder, OptimizerRecordsOfEveryLengthAreClear) {
  std::vector<std::uintptr_t> lengths;
  for (std::uintptr_t n = 1; n <= 4096; ++n) lengths.push_back(n);
  for (std::uintptr_t k = 1; k <= 4; ++k) {
    for (std::uintptr_t n = k * 262144 - 2048; n <= k * 262144 + 2048; ++n) lengths.push_back(n);
  }
  for (std::size_t safe : kSafe) {
    for (std::uintptr_t n : lengths) {
      SCOPED_TRACE("n=" + std::to_string(n) + " safe=" + std::to_string(safe));
      const KernelArgs a = args_at(0, 4 * n, 8 * n, 1 << 30);
      EXPECT_EQ(nearest(a, use_windowed_order(a, safe), safe), safe);
      if (HasFailure()) return;
    }
  }
}

}  // namespace
}  // namespace zinf::adam::detail
