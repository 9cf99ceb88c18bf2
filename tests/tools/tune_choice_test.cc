// SPDX-License-Identifier: Apache-2.0
// `zinf tune`'s choice rule on synthetic measurements: a clear winner replaces the default, a
// winner inside the noise (either setting's spread) keeps it, ties keep it, and a setting
// measured once is no candidate.
#include "choice.h"

#include <gtest/gtest.h>

namespace zinf::tools::tune {
namespace {

TEST(TuneChoice, MeasuredIsMedianAndRange) {
  Measured m = measured({3.0, 1.0, 2.5});
  EXPECT_DOUBLE_EQ(m.median_gbps, 2.5);
  EXPECT_DOUBLE_EQ(m.spread_gbps, 2.0);
  EXPECT_EQ(m.passes, 3u);
  EXPECT_DOUBLE_EQ(measured({4.0}).spread_gbps, 0.0);
  EXPECT_EQ(measured({}).passes, 0u);
}

TEST(TuneChoice, ClearWinnerReplacesTheDefault) {
  // Default 2.0 +- 0.1, candidate 3.0 +- 0.2: margin 1.0 > 0.2.
  std::vector<Measured> s = {measured({2.0, 1.95, 2.05}), measured({3.0, 2.9, 3.1}),
                             measured({2.5, 2.5, 2.5})};
  Choice c = choose(s, 0);
  EXPECT_EQ(c.best, 1u);
  EXPECT_EQ(c.chosen, 1u);
  EXPECT_TRUE(c.beats_default);
  EXPECT_NEAR(c.margin_gbps, 1.0, 1e-12);
  EXPECT_NEAR(c.noise_gbps, 0.2, 1e-12);
  EXPECT_EQ(choice_line(c, s, {"d", "w", "x"}, 0),
            "w beats the default (d) by 1.00 GB/s (50.0%), more than the spread 0.20 GB/s: "
            "chosen");
}

TEST(TuneChoice, WinnerInsideEitherSpreadKeepsTheDefault) {
  // The candidate's own spread (0.5) swallows its 0.1 margin.
  std::vector<Measured> s = {measured({2.0, 2.0, 2.0}), measured({2.1, 1.8, 2.3})};
  Choice c = choose(s, 0);
  EXPECT_EQ(c.best, 1u);
  EXPECT_EQ(c.chosen, 0u);
  EXPECT_FALSE(c.beats_default);
  EXPECT_EQ(choice_line(c, s, {"d", "w"}, 0),
            "w beats the default (d) by 0.10 GB/s (5.0%), inside the spread 0.50 GB/s (noise): "
            "the default is kept");
  // The default's spread counts as much: a steady candidate against a noisy default.
  s = {measured({2.0, 1.5, 2.6}), measured({2.5, 2.5, 2.5})};
  c = choose(s, 0);
  EXPECT_EQ(c.chosen, 0u);
  EXPECT_NEAR(c.noise_gbps, 1.1, 1e-12);
  // A margin exactly equal to the spread is not more than it.
  s = {measured({2.0, 2.0}), measured({2.5, 2.5, 2.0})};
  c = choose(s, 0);
  EXPECT_NEAR(c.margin_gbps, 0.5, 1e-12);
  EXPECT_EQ(c.chosen, 0u);
}

TEST(TuneChoice, TiesKeepTheDefaultThenTheEarlierSetting) {
  std::vector<Measured> s = {measured({2.0, 2.0, 2.0}), measured({2.0, 2.0, 2.0}),
                             measured({2.0, 2.0, 2.0})};
  Choice c = choose(s, 1);
  EXPECT_EQ(c.best, 1u);
  EXPECT_EQ(c.chosen, 1u);
  EXPECT_FALSE(c.beats_default);
  EXPECT_EQ(choice_line(c, s, {"a", "b", "c"}, 1), "the default (b) measured best: kept");
  // Two candidates tied above the default: the earlier is the best, and it wins by the margin.
  s = {measured({1.0, 1.0}), measured({3.0, 3.0}), measured({3.0, 3.0})};
  c = choose(s, 0);
  EXPECT_EQ(c.best, 1u);
  EXPECT_EQ(c.chosen, 1u);
}

TEST(TuneChoice, ASinglePassIsNoCandidate) {
  // 5.0 in one pass has no spread: the best is the repeated 3.0, which wins clearly.
  std::vector<Measured> s = {measured({2.0, 2.0, 2.0}), measured({5.0}), measured({3.0, 3.0})};
  Choice c = choose(s, 0);
  EXPECT_EQ(c.best, 2u);
  EXPECT_EQ(c.chosen, 2u);
  // Nothing else repeated: the default stays.
  s = {measured({2.0, 2.0, 2.0}), measured({5.0})};
  c = choose(s, 0);
  EXPECT_EQ(c.best, 0u);
  EXPECT_EQ(c.chosen, 0u);
}

}  // namespace
}  // namespace zinf::tools::tune
