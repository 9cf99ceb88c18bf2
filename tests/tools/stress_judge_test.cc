// SPDX-License-Identifier: Apache-2.0
// `zinf stress`'s verdict, rule by rule: what passes a run and what fails it.
#include "verdict.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace zinf::tools::stress {
namespace {

// A run that stayed within its budget: 64M, the swap pool half of it, the optimizer and the
// prefetcher a quarter each (as stress_main divides it).
StressTotals clean_run() {
  StressTotals t;
  t.tally.swap_outs = 100;
  t.tally.swap_ins = 120;
  t.tally.opt_steps = 10;
  t.tally.bytes_verified = 1 << 20;
  PinnedMemory& p = t.pinned;
  p.pool_budget = 32 << 20;
  p.pool_peak = 20 << 20;
  p.optimizer_budget = 16 << 20;
  p.optimizer_peak = 8 << 20;
  p.prefetch_budget = 16 << 20;
  p.prefetch_peak_held = 4 << 20;
  p.reserved = p.pool_budget + p.optimizer_peak + (8 << 20);  // + prefetch staging
  p.peak = p.pool_peak + p.optimizer_peak + (8 << 20);
  return t;
}

StressOptions options() {
  StressOptions o;
  o.budget = 64ull << 20;
  return o;
}

TEST(StressJudge, CleanRunPasses) {
  const StressVerdict v = judge(clean_run(), options());
  EXPECT_TRUE(v.pass());
  EXPECT_TRUE(v.broken.empty());
  EXPECT_TRUE(v.problems.empty());
}

TEST(StressJudge, FaultsSurfacedAsErrorsAndRecoverableFaultsAbsorbedPass) {
  StressTotals t = clean_run();
  t.tally.injected.by_rule[kRuleEio] = 3;
  t.tally.injected.by_rule[kRuleEnospc] = 2;
  t.tally.injected.by_rule[kRuleShort] = 7;
  t.tally.injected.by_rule[kRuleEagain] = 4;
  t.tally.injected.by_rule[kRuleDelay] = 5;
  t.tally.hard_surfaced = 5;
  t.tally.failed_ops = 4;
  t.tally.opt_undone = 1;
  t.tally.opt_rebuilds = 1;
  t.tally.prefetch_reads_dropped = 1;
  EXPECT_TRUE(judge(t, options()).pass());
}

TEST(StressJudge, AMismatchFails) {
  StressTotals t = clean_run();
  t.tally.mismatches = 1;
  t.tally.problem("swap_in w0-t1 [0, +4096) of 4096: mismatch at tensor offset 0: ...");
  const StressVerdict v = judge(t, options());
  EXPECT_FALSE(v.pass());
  EXPECT_EQ(v.broken, std::vector<StressRule>{StressRule::kMismatch});
  EXPECT_EQ(v.problems, t.tally.problems);  // the worker's own line, nothing added
}

TEST(StressJudge, AnUnsurfacedHardFaultFails) {
  StressTotals t = clean_run();
  t.tally.hard_unsurfaced = 1;
  const StressVerdict v = judge(t, options());
  EXPECT_FALSE(v.pass());
  EXPECT_EQ(v.broken, std::vector<StressRule>{StressRule::kHardFaultUnsurfaced});
}

TEST(StressJudge, AnUnexpectedErrorFails) {
  StressTotals t = clean_run();
  t.tally.unexpected_errors = 1;
  const StressVerdict v = judge(t, options());
  EXPECT_FALSE(v.pass());
  EXPECT_EQ(v.broken, std::vector<StressRule>{StressRule::kUnexpectedError});
}

TEST(StressJudge, ASurfacedCorruptionFails) {
  StressTotals t = clean_run();
  t.tally.corruption_errors = 1;
  const StressVerdict v = judge(t, options());
  EXPECT_FALSE(v.pass());
  EXPECT_EQ(v.broken, std::vector<StressRule>{StressRule::kCorruption});
}

TEST(StressJudge, AnErrorWithoutContextFails) {
  StressTotals t = clean_run();
  t.tally.hard_surfaced = 1;
  t.tally.failed_ops = 1;
  t.tally.errors_without_context = 1;
  const StressVerdict v = judge(t, options());
  EXPECT_FALSE(v.pass());
  EXPECT_EQ(v.broken, std::vector<StressRule>{StressRule::kErrorWithoutContext});
}

TEST(StressJudge, PinnedMemoryExactlyAtEveryBudgetPasses) {
  StressTotals t = clean_run();
  PinnedMemory& p = t.pinned;
  p.reserved = p.peak = 64ull << 20;
  p.pool_peak = p.pool_budget;
  p.optimizer_peak = p.optimizer_budget;
  p.prefetch_peak_held = p.prefetch_budget;
  EXPECT_TRUE(judge(t, options()).pass());
}

// Each way over budget: the whole reserved or peak over --budget, or a part over its share.
TEST(StressJudge, ABudgetOverrunFailsWithItsProblemLine) {
  const std::vector<void (*)(PinnedMemory&)> overruns = {
      [](PinnedMemory& p) { p.reserved = (64ull << 20) + 1; },
      [](PinnedMemory& p) { p.peak = (64ull << 20) + 1; },
      [](PinnedMemory& p) { p.pool_peak = p.pool_budget + 1; },
      [](PinnedMemory& p) { p.optimizer_peak = p.optimizer_budget + 1; },
      [](PinnedMemory& p) { p.prefetch_peak_held = p.prefetch_budget + 1; },
  };
  for (std::size_t i = 0; i < overruns.size(); ++i) {
    StressTotals t = clean_run();
    overruns[i](t.pinned);
    EXPECT_TRUE(over_budget(t.pinned, options().budget)) << "case " << i;
    const StressVerdict v = judge(t, options());
    EXPECT_FALSE(v.pass()) << "case " << i;
    EXPECT_EQ(v.broken, std::vector<StressRule>{StressRule::kBudgetOverrun}) << "case " << i;
    EXPECT_EQ(v.problems, std::vector<std::string>{"pinned memory over budget"}) << "case " << i;
  }
}

// Device memory is judged against --gpu-mem by the device's own peak: at it passes, one byte
// over fails with a line naming the device and both figures.
TEST(StressJudge, DeviceMemoryOverGpuMemFailsWithItsProblemLine) {
  StressTotals t = clean_run();
  t.device = {"cuda:0", 8ull << 20, 8ull << 20};
  EXPECT_TRUE(judge(t, options()).pass());
  t.device.peak += 1;
  const StressVerdict v = judge(t, options());
  EXPECT_EQ(v.broken, std::vector<StressRule>{StressRule::kDeviceOverrun});
  EXPECT_EQ(v.problems, std::vector<std::string>{"device memory over --gpu-mem: peak 8388609 "
                                                 "bytes on cuda:0, budget 8388608"});
}

TEST(StressJudge, PlantCorruptionThatPlantedNothingFails) {
  StressOptions o = options();
  o.plant = true;
  const StressVerdict v = judge(clean_run(), o);
  EXPECT_FALSE(v.pass());
  EXPECT_EQ(v.broken, std::vector<StressRule>{StressRule::kNothingPlanted});
  EXPECT_EQ(v.problems, std::vector<std::string>{"plant-corruption: nothing was planted"});
}

TEST(StressJudge, PlantedCorruptionIsJudgedByWhatTheWorkersFound) {
  StressOptions o = options();
  o.plant = true;
  StressTotals t = clean_run();
  t.planted = "flipped bytes [0, 64) of /tmp/x (tensor w0-t1, its bytes [0, 64))";
  t.tally.mismatches = 1;
  const StressVerdict v = judge(t, o);
  EXPECT_FALSE(v.pass());
  EXPECT_EQ(v.broken, std::vector<StressRule>{StressRule::kMismatch});
}

TEST(StressJudge, EveryBrokenRuleIsListedInOrder) {
  StressOptions o = options();
  o.plant = true;
  StressTotals t = clean_run();
  t.tally.mismatches = t.tally.hard_unsurfaced = t.tally.unexpected_errors = 1;
  t.tally.corruption_errors = t.tally.errors_without_context = 1;
  t.pinned.peak = (64ull << 20) + 1;
  t.device = {"host", 2, 1};
  const StressVerdict v = judge(t, o);
  EXPECT_EQ(v.broken,
            (std::vector<StressRule>{StressRule::kMismatch, StressRule::kHardFaultUnsurfaced,
                                     StressRule::kUnexpectedError, StressRule::kCorruption,
                                     StressRule::kErrorWithoutContext, StressRule::kBudgetOverrun,
                                     StressRule::kDeviceOverrun, StressRule::kNothingPlanted}));
  for (StressRule r : v.broken) EXPECT_TRUE(v.broke(r));
  EXPECT_EQ(v.problems, (std::vector<std::string>{
                            "pinned memory over budget",
                            "device memory over --gpu-mem: peak 2 bytes on host, budget 1",
                            "plant-corruption: nothing was planted"}));
}

// The report shows the first kMaxProblems lines: the workers' first, the verdict's after them
// while there is room.
TEST(StressJudge, ProblemLinesKeepTheWorkersFirstUnderTheCap) {
  StressTotals t = clean_run();
  t.tally.mismatches = kMaxProblems - 1;
  for (std::size_t i = 0; i + 1 < kMaxProblems; ++i)
    t.tally.problem("mismatch " + std::to_string(i));
  t.pinned.peak = (64ull << 20) + 1;
  StressOptions o = options();
  o.plant = true;
  const StressVerdict v = judge(t, o);
  ASSERT_EQ(v.problems.size(), kMaxProblems);
  EXPECT_EQ(v.problems.front(), "mismatch 0");
  EXPECT_EQ(v.problems.back(), "pinned memory over budget");  // no room for the plant line
  EXPECT_TRUE(v.broke(StressRule::kNothingPlanted));
}

}  // namespace
}  // namespace zinf::tools::stress
