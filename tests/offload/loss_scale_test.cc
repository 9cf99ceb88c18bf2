// SPDX-License-Identifier: Apache-2.0
// LossScaler: DeepSpeed's documented dynamic loss scaling on a synthetic sequence of overflows
// (hysteresis, halving, the floor, growth after a window, consecutive hysteresis), static and
// disabled scales, and the checkpoint text round trip.
#include "loss_scale.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace zinf::offload::detail {
namespace {

LossScaleConfig dynamic_config() {
  LossScaleConfig c;
  c.enabled = true;
  c.loss_scale = 0;
  c.initial_scale_power = 4;  // 16
  c.loss_scale_window = 3;
  c.hysteresis = 2;
  c.min_loss_scale = 2;
  return c;
}

// Feeds `steps` ('x' overflow, '.' good) and returns the scale after each.
std::vector<double> run(LossScaler& s, const std::string& steps) {
  std::vector<double> out;
  for (char c : steps) {
    s.update(c == 'x');
    out.push_back(s.scale());
  }
  return out;
}

TEST(LossScaler, DynamicScaleFollowsHysteresisHalvingFloorAndGrowth) {
  LossScaler s(dynamic_config());
  EXPECT_TRUE(s.dynamic());
  EXPECT_EQ(s.scale(), 16.0);
  // The first overflow spends the hysteresis (2 -> 1) and keeps the scale; each further one
  // halves it down to min_loss_scale 2, where it stays.
  EXPECT_EQ(run(s, "xxxxx"), (std::vector<double>{16, 8, 4, 2, 2}));
  // Three good steps (the window) double it and refill the hysteresis.
  EXPECT_EQ(run(s, "..."), (std::vector<double>{2, 2, 4}));
  EXPECT_EQ(s.state().hysteresis_left, 2u);
  // An overflow restarts the window and is tolerated once more.
  EXPECT_EQ(run(s, "..x"), (std::vector<double>{4, 4, 4}));
  EXPECT_EQ(run(s, "..."), (std::vector<double>{4, 4, 8}));
  // Without consecutive_hysteresis a good step does not refill it: overflow, good, overflow
  // halves at the second.
  EXPECT_EQ(run(s, "x.x"), (std::vector<double>{8, 8, 4}));
  // Growth continues window after window while nothing overflows.
  EXPECT_EQ(run(s, "......"), (std::vector<double>{4, 4, 8, 8, 8, 16}));
}

TEST(LossScaler, ConsecutiveHysteresisRefillsAfterEveryGoodStep) {
  LossScaleConfig c = dynamic_config();
  c.consecutive_hysteresis = true;
  LossScaler s(c);
  // Overflows separated by good steps never halve; two in a row do.
  EXPECT_EQ(run(s, "x.x.x."), (std::vector<double>{16, 16, 16, 16, 16, 16}));
  EXPECT_EQ(run(s, "xx"), (std::vector<double>{16, 8}));
}

TEST(LossScaler, HysteresisOneHalvesAtEveryOverflow) {
  LossScaleConfig c = dynamic_config();
  c.hysteresis = 1;
  c.initial_scale_power = 16;
  c.min_loss_scale = 1;
  LossScaler s(c);
  EXPECT_EQ(run(s, "xxx"), (std::vector<double>{32768, 16384, 8192}));
}

TEST(LossScaler, StaticAndDisabledScalesNeverMove) {
  LossScaleConfig c = dynamic_config();
  c.loss_scale = 128;
  LossScaler fixed(c);
  EXPECT_FALSE(fixed.dynamic());
  EXPECT_EQ(run(fixed, "xx....x"), std::vector<double>(7, 128.0));
  LossScaler off(LossScaleConfig{});
  EXPECT_EQ(off.scale(), 1.0);
  EXPECT_EQ(run(off, "x...x"), std::vector<double>(5, 1.0));
}

TEST(LossScaler, StartsNoLowerThanTheFloor) {
  LossScaleConfig c = dynamic_config();
  c.initial_scale_power = 0;
  c.min_loss_scale = 4;
  EXPECT_EQ(LossScaler(c).scale(), 4.0);
}

TEST(LossScaler, StateRoundTripsThroughTextAndRefusesWhatTheConfigCannotReach) {
  LossScaler s(dynamic_config());
  (void)run(s, "x..xx.");
  const LossScaleState st = s.state();
  const std::string text = LossScaler::to_text(st);
  const auto back = LossScaler::from_text(text);
  ASSERT_TRUE(back.has_value()) << text;
  EXPECT_EQ(*back, st);

  LossScaler fresh(dynamic_config());
  ASSERT_TRUE(fresh.restore(*back));
  EXPECT_EQ(run(fresh, "...x"), run(s, "...x"));

  EXPECT_FALSE(LossScaler::from_text("").has_value());
  EXPECT_FALSE(LossScaler::from_text("zinf loss scale v2\n").has_value());
  EXPECT_FALSE(LossScaler::from_text(text + "extra\n").has_value());
  EXPECT_FALSE(LossScaler::from_text(text.substr(0, text.size() - 1)).has_value());
  EXPECT_FALSE(
      LossScaler::from_text("zinf loss scale v1\nscale 0x1p+4\nhysteresis_left -1\ngood_steps 0\n")
          .has_value());
  EXPECT_FALSE(fresh.restore({0.0, 1, 0}));
  EXPECT_FALSE(fresh.restore({16.0, 0, 0}));
  EXPECT_FALSE(fresh.restore({16.0, 3, 0}));  // above the config's hysteresis 2
  EXPECT_EQ(fresh.state(), s.state());        // a refused restore changes nothing
}

}  // namespace
}  // namespace zinf::offload::detail
