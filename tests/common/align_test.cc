// SPDX-License-Identifier: Apache-2.0
#include "zinf/common/align.h"

#include <cstdint>

#include <gtest/gtest.h>

namespace zinf {
namespace {

constexpr std::uint64_t kMax = UINT64_MAX;

// Usable in constant expressions: the layers size static buffers with it.
static_assert(align_up(1, 4096) == 4096);
static_assert(align_down(4097, 4096) == 4096);
static_assert(checked_align_up(kMax, 2) == std::nullopt);

TEST(Align, UpRoundsToTheNextMultiple) {
  EXPECT_EQ(align_up(0, 4096), 0u);
  EXPECT_EQ(align_up(1, 4096), 4096u);
  EXPECT_EQ(align_up(4096, 4096), 4096u);
  EXPECT_EQ(align_up(4097, 4096), 8192u);
  EXPECT_EQ(align_up(7, 1), 7u);
}

TEST(Align, AnyAlignmentNotOnlyPowersOfTwo) {
  EXPECT_EQ(align_up(10, 3), 12u);
  EXPECT_EQ(align_up(12, 3), 12u);
  EXPECT_EQ(align_down(11, 3), 9u);
  EXPECT_EQ(align_up(1, 3u << 20), 3u << 20);
}

TEST(Align, DownRoundsToThePreviousMultiple) {
  EXPECT_EQ(align_down(0, 512), 0u);
  EXPECT_EQ(align_down(511, 512), 0u);
  EXPECT_EQ(align_down(513, 512), 512u);
  EXPECT_EQ(align_down(kMax, 4096), kMax - 4095);
}

TEST(Align, CheckedUpReportsOverflowInsteadOfWrapping) {
  // The former (v + to - 1) / to * to turned these into 0.
  EXPECT_EQ(checked_align_up(kMax, 4096), std::nullopt);
  EXPECT_EQ(checked_align_up(kMax - 4094, 4096), std::nullopt);
  EXPECT_EQ(checked_align_up(kMax - 4095, 4096), kMax - 4095);  // already aligned
  EXPECT_EQ(checked_align_up(kMax, 1), kMax);
  EXPECT_EQ(checked_align_up(kMax, kMax), kMax);
  EXPECT_EQ(checked_align_up(5, 4096), 4096u);
}

TEST(Align, IsAligned) {
  EXPECT_TRUE(is_aligned(0, 4096));
  EXPECT_TRUE(is_aligned(8192, 4096));
  EXPECT_FALSE(is_aligned(4095, 4096));
}

TEST(AlignDeathTest, UpAbortsWhereTheResultDoesNotFit) {
  EXPECT_DEATH((void)align_up(kMax, 4096), "does not fit");
}

TEST(AlignDeathTest, ZeroAlignmentIsABug) {
  EXPECT_DEATH((void)align_up(1, 0), "alignment 0");
  EXPECT_DEATH((void)align_down(1, 0), "alignment 0");
}

}  // namespace
}  // namespace zinf
