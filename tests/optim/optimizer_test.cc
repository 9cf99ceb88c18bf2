// SPDX-License-Identifier: Apache-2.0
// OffloadedOptimizer: parity of the nvme tier (every I/O backend), the cpu tier and the plain
// in-memory kernel over K steps (bitwise, fp32 and bf16 gradients, odd sizes over several
// groups and sub-groups); per-group stepping; hyper-parameters per group (set for one or all
// groups, refused values); copy-out; construction checks (depth, disk too small); usage
// errors; step statistics. What is the same over both state stores (a step's grad_scale,
// each group's own set, the budget error) is in state_store_test.cc.
#include "zinf/optim/optimizer.h"

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "optimizer_test_util.h"
#include "support/log_capture.h"
#include "support/test_dir.h"
#include "zinf/common/error.h"
#include "zinf/swap/io_engine.h"

namespace zinf::optim {
namespace {

using test::odd_groups;

constexpr std::uint64_t kSteps = 5;

OptimizerOptions options_for(StateTier tier, swap::IoEngineKind kind, const test::TestDir& dir) {
  OptimizerOptions o;
  o.tier = tier;
  o.sub_group_elements = test::kOddSubGroup;
  o.pipeline_depth = 3;
  o.hyper = test::test_hyper();
  o.io.kind = kind;
  o.io.queue_depth = 8;
  if (tier == StateTier::kNvme) o.directories = {dir.subdir("nvme0"), dir.subdir("nvme1")};
  return o;
}

std::string skip_reason(swap::IoEngineKind kind) {
  if (kind != swap::IoEngineKind::kUring) return "";
  return swap::io_uring_unavailable_reason();
}

// (tier, engine, gradient type)
using ParityParam = std::tuple<StateTier, swap::IoEngineKind, ElementType>;

class OptimizerParity : public ::testing::TestWithParam<ParityParam> {};

TEST_P(OptimizerParity, MatchesThePlainKernelBitwise) {
  const auto [tier, kind, dtype] = GetParam();
  if (auto why = skip_reason(kind); !why.empty()) GTEST_SKIP() << "io_uring unavailable: " << why;
  test::TestDir dir;
  const auto groups = odd_groups();
  OffloadedOptimizer opt(options_for(tier, kind, dir), groups);
  test::init_all(opt);
  test::run_steps(opt, 1, kSteps, dtype);
  EXPECT_EQ(opt.step_count(), kSteps);
  const test::State want = test::reference_run(groups, test::test_hyper(), kSteps, dtype);
  EXPECT_EQ(test::diff(test::read_all(opt), want), "");
}

std::string parity_name(const ::testing::TestParamInfo<ParityParam>& info) {
  const auto [tier, kind, dtype] = info.param;
  return std::string(state_tier_name(tier)) + "_" + std::string(swap::io_engine_kind_name(kind)) +
         "_" + std::string(element_type_name(dtype));
}

INSTANTIATE_TEST_SUITE_P(
    Tiers, OptimizerParity,
    ::testing::Values(
        ParityParam{StateTier::kNvme, swap::IoEngineKind::kThreads, ElementType::kF32},
        ParityParam{StateTier::kNvme, swap::IoEngineKind::kThreads, ElementType::kBF16},
        ParityParam{StateTier::kNvme, swap::IoEngineKind::kUring, ElementType::kF32},
        ParityParam{StateTier::kNvme, swap::IoEngineKind::kUring, ElementType::kBF16},
        ParityParam{StateTier::kCpu, swap::IoEngineKind::kThreads, ElementType::kF32},
        ParityParam{StateTier::kCpu, swap::IoEngineKind::kThreads, ElementType::kBF16}),
    parity_name);

TEST(OffloadedOptimizer, NvmeAndCpuTiersAgreeBitwiseWithDeepRing) {
  // A deeper ring reads further ahead; the result must not depend on it.
  test::TestDir dir;
  const auto groups = odd_groups();
  auto o = options_for(StateTier::kNvme, swap::IoEngineKind::kThreads, dir);
  o.pipeline_depth = 5;
  o.swap_checksums = true;
  OffloadedOptimizer nvme(o, groups);
  OffloadedOptimizer cpu(options_for(StateTier::kCpu, swap::IoEngineKind::kThreads, dir), groups);
  for (auto* opt : {&nvme, &cpu}) {
    test::init_all(*opt);
    test::run_steps(*opt, 1, 3);
  }
  EXPECT_EQ(test::diff(test::read_all(nvme), test::read_all(cpu)), "");
}

// With checksums (the default) the update sums what it reads and writes piece by piece; with
// records of several stripe units, units start inside the arrays and straddle the params/m
// and m/v boundaries, and the last one holds the padding: still bitwise the plain kernel.
TEST(OffloadedOptimizer, ChecksumsFoldedIntoTheUpdateOverManyStripeUnitsChangeNoBit) {
  test::TestDir dir;
  const std::vector<ParamGroupSpec> groups = {{"big", 2 * 300007 + 11}, {"small", 5}};
  auto o = options_for(StateTier::kNvme, swap::IoEngineKind::kThreads, dir);
  o.sub_group_elements = 300007;  // 3.6 MB records: four 1 MiB stripe units each
  ASSERT_TRUE(o.swap_checksums);
  OffloadedOptimizer opt(o, groups);
  test::init_all(opt);
  test::run_steps(opt, 1, 3);
  EXPECT_EQ(test::diff(test::read_all(opt),
                       test::reference_run(groups, test::test_hyper(), 3, ElementType::kF32)),
            "");
}

TEST(OffloadedOptimizer, PerGroupSteppingInAnyOrderMatchesStep) {
  // Backward produces the last layer's gradients first: groups are handed over in reverse,
  // one at a time, and the update of each runs while the caller goes on.
  test::TestDir dir;
  const auto groups = odd_groups();
  OffloadedOptimizer staged(options_for(StateTier::kNvme, swap::IoEngineKind::kThreads, dir),
                            groups);
  test::init_all(staged);
  for (std::uint64_t t = 1; t <= 3; ++t) {
    test::StepGrads sg(groups, t, ElementType::kF32);
    staged.begin_step();
    for (std::size_t g = groups.size(); g-- > 0;) staged.step_group(g, sg.views[g].grads);
    const StepStats st = staged.end_step();
    EXPECT_EQ(st.step, t);
    EXPECT_EQ(st.sub_groups, 3u + 4u + 1u);
  }
  const test::State want = test::reference_run(groups, test::test_hyper(), 3, ElementType::kF32);
  EXPECT_EQ(test::diff(test::read_all(staged), want), "");
}

TEST(OffloadedOptimizer, GroupsLeftOutOfAStepAreNotUpdated) {
  test::TestDir dir;
  const auto groups = odd_groups();
  OffloadedOptimizer opt(options_for(StateTier::kNvme, swap::IoEngineKind::kThreads, dir), groups);
  test::init_all(opt);
  const test::State before = test::read_all(opt);
  test::StepGrads sg(groups, 1, ElementType::kF32);
  opt.begin_step();
  opt.step_group(1, sg.views[1].grads);
  (void)opt.end_step();
  const test::State after = test::read_all(opt);
  EXPECT_EQ(after.p[0], before.p[0]);
  EXPECT_EQ(after.p[2], before.p[2]);
  EXPECT_NE(after.p[1], before.p[1]);
}

// ---- Hyper-parameters per group -------------------------------------------------------------

TEST(OffloadedOptimizer, SetHyperOfOneGroupChangesOnlyThatGroupFromTheNextStep) {
  test::TestDir dir;
  const auto groups = odd_groups();
  OffloadedOptimizer opt(options_for(StateTier::kCpu, swap::IoEngineKind::kThreads, dir), groups);
  test::init_all(opt);
  test::run_steps(opt, 1, 1);
  adam::AdamParams changed = test::test_hyper();
  changed.lr = 3e-2;
  changed.weight_decay = 0.2;
  changed.mode = adam::AdamMode::kAdam;
  opt.set_hyper(1, changed);
  EXPECT_TRUE(test::same_hyper(opt.hyper(1), changed));
  EXPECT_TRUE(test::same_hyper(opt.hyper(0), test::test_hyper()));
  EXPECT_TRUE(test::same_hyper(opt.hyper(2), test::test_hyper()));
  EXPECT_TRUE(test::same_hyper(opt.hyper(), test::test_hyper()));  // the set for all groups

  // An open step has fixed its sets: neither form of set_hyper reaches it.
  {
    test::StepGrads sg(groups, 2, ElementType::kF32);
    opt.begin_step();
    EXPECT_THROW(opt.set_hyper(0, changed), UsageError);
    EXPECT_THROW(opt.set_hyper(changed), UsageError);
    for (const auto& v : sg.views) opt.step_group(v.group, v.grads);
    (void)opt.end_step();
  }
  test::run_steps(opt, 3, 3);
  auto changed_from_2 = [&](std::size_t g, std::uint64_t t) {
    return g == 1 && t >= 2 ? changed : test::test_hyper();
  };
  EXPECT_EQ(test::diff(test::read_all(opt),
                       test::reference_run_with(groups, changed_from_2, 3, ElementType::kF32)),
            "");

  // set_hyper for all groups replaces every group's set, group 1's included.
  adam::AdamParams all = test::test_hyper();
  all.lr = 5e-3;
  opt.set_hyper(all);
  EXPECT_TRUE(test::same_hyper(opt.hyper(), all));
  for (std::size_t g = 0; g < groups.size(); ++g) {
    EXPECT_TRUE(test::same_hyper(opt.hyper(g), all)) << "group " << g;
  }
  test::run_steps(opt, 4, 4);
  EXPECT_EQ(test::diff(test::read_all(opt), test::reference_run_with(
                                                groups,
                                                [&](std::size_t g, std::uint64_t t) {
                                                  return t == 4 ? all : changed_from_2(g, t);
                                                },
                                                4, ElementType::kF32)),
            "");
}

TEST(OffloadedOptimizer, RefusedHyperParametersChangeNothing) {
  test::TestDir dir;
  const auto groups = test::groups_with_own_hyper();
  OffloadedOptimizer opt(options_for(StateTier::kCpu, swap::IoEngineKind::kThreads, dir), groups);
  test::init_all(opt);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<std::pair<std::string, std::function<void(adam::AdamParams&)>>> bad = {
      {"lr", [](adam::AdamParams& h) { h.lr = -1; }},
      {"beta1", [&](adam::AdamParams& h) { h.beta1 = nan; }},
      {"beta2", [](adam::AdamParams& h) { h.beta2 = 1; }},
      {"eps", [](adam::AdamParams& h) { h.eps = 0; }},
      {"weight_decay", [&](adam::AdamParams& h) { h.weight_decay = inf; }},
      {"grad_scale", [](adam::AdamParams& h) { h.grad_scale = 0; }},
  };
  for (const auto& [field, spoil] : bad) {
    adam::AdamParams h = test::test_hyper();
    spoil(h);
    try {
      opt.set_hyper(1, h);
      ADD_FAILURE() << "set_hyper(1, ...) accepted a bad " << field;
    } catch (const UsageError& e) {
      EXPECT_EQ(std::string(e.what()).rfind("OffloadedOptimizer: group 'w1': " + field + " ", 0),
                0u)
          << e.what();
    }
    EXPECT_THROW(opt.set_hyper(h), UsageError) << field;
  }
  EXPECT_THROW(opt.set_hyper(3, test::test_hyper()), UsageError);  // no group 3
  EXPECT_THROW((void)opt.hyper(3), UsageError);
  EXPECT_TRUE(test::same_hyper(opt.hyper(), test::test_hyper()));
  for (std::size_t g = 0; g < groups.size(); ++g) {
    EXPECT_TRUE(test::same_hyper(opt.hyper(g), groups[g].hyper.value_or(test::test_hyper())))
        << "group " << g;
  }
  test::run_steps(opt, 1, 2);
  EXPECT_EQ(test::diff(test::read_all(opt),
                       test::reference_run(groups, test::test_hyper(), 2, ElementType::kF32)),
            "");

  // A group's own set is checked at construction too, and the message names the group.
  auto bad_groups = odd_groups();
  adam::AdamParams h = test::test_hyper();
  h.eps = 0;
  bad_groups[2].hyper = h;
  try {
    OffloadedOptimizer rejected(options_for(StateTier::kCpu, swap::IoEngineKind::kThreads, dir),
                                bad_groups);
    ADD_FAILURE() << "constructed with eps 0 for a group";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("OffloadedOptimizer: group 'bias': eps ", 0), 0u)
        << e.what();
  }
}

TEST(OffloadedOptimizer, CopyOutMatchesTheKernelsFusedCopy) {
  test::TestDir dir;
  const auto groups = odd_groups();
  OffloadedOptimizer opt(options_for(StateTier::kNvme, swap::IoEngineKind::kThreads, dir), groups);
  test::init_all(opt);
  test::StepGrads sg(groups, 1, ElementType::kF32);
  std::vector<std::vector<std::uint16_t>> out;
  for (const auto& g : groups) out.emplace_back(g.numel, 0);
  std::vector<GroupGrads> views = sg.views;
  for (std::size_t g = 0; g < groups.size(); ++g) views[g].out = adam::CopyOut::bf16(out[g]);
  (void)opt.step(views);

  adam::CpuAdam adam;
  adam::AdamParams hp = test::test_hyper();
  hp.step = 1;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    auto p = test::initial_params(g, groups[g].numel);
    std::vector<float> m(p.size(), 0.0f), v(p.size(), 0.0f);
    std::vector<std::uint16_t> want(p.size());
    adam.step(hp, p, m, v, sg.views[g].grads, adam::CopyOut::bf16(want));
    EXPECT_EQ(out[g], want) << "group " << g;
  }
}

TEST(OffloadedOptimizer, StepStatsCountEveryRecordOnce) {
  test::TestDir dir;
  const auto groups = odd_groups();
  OffloadedOptimizer opt(options_for(StateTier::kNvme, swap::IoEngineKind::kThreads, dir), groups);
  test::init_all(opt);
  test::StepGrads sg(groups, 1, ElementType::kF32);
  const StepStats st = opt.step(sg.views);
  // 12 bytes per element, each sub-group padded to 4096: 5 full records of 4099 elements
  // (49188 -> 53248 bytes) and the short ones (1809, 5 and 3 elements).
  auto padded = [](std::uint64_t n) { return (n * 12 + 4095) / 4096 * 4096; };
  const std::uint64_t state = 5 * padded(4099) + padded(1809) + padded(5) + padded(3);
  EXPECT_EQ(st.bytes_read, state);
  EXPECT_EQ(st.bytes_written, state);
  EXPECT_EQ(st.elements, 10007u + 3 * 4099 + 5 + 3);
  EXPECT_GT(st.seconds, 0.0);
  EXPECT_GT(st.read_seconds, 0.0);
  EXPECT_GT(st.write_seconds, 0.0);
  EXPECT_GT(st.compute_seconds, 0.0);
  EXPECT_LE(st.read_seconds, st.seconds);
  EXPECT_EQ(opt.pinned_bytes_peak(), 3 * padded(4099));
  EXPECT_EQ(opt.record_bytes(), padded(4099));
}

TEST(OffloadedOptimizer, RejectsBadOptions) {
  test::TestDir dir;
  auto o = options_for(StateTier::kNvme, swap::IoEngineKind::kThreads, dir);
  o.pipeline_depth = 2;
  EXPECT_THROW(OffloadedOptimizer(o, odd_groups()), UsageError);
  o = options_for(StateTier::kNvme, swap::IoEngineKind::kThreads, dir);
  o.directories.clear();
  EXPECT_THROW(OffloadedOptimizer(o, odd_groups()), UsageError);
  o = options_for(StateTier::kCpu, swap::IoEngineKind::kThreads, dir);
  EXPECT_THROW(OffloadedOptimizer(o, {}), UsageError);
  EXPECT_THROW(OffloadedOptimizer(o, {{"a", 0}}), UsageError);
  EXPECT_THROW(OffloadedOptimizer(o, {{"a", 4}, {"a", 5}}), UsageError);
  o.sub_group_elements = 0;  // not an error: the precision's default (12 MiB records)
  EXPECT_EQ(OffloadedOptimizer(o, {{"a", 4}}).sub_group_elements(), 1u << 20);
  o.state_precision = adam::StatePrecision::kBF16;
  EXPECT_EQ(OffloadedOptimizer(o, {{"a", 4}}).sub_group_elements(), 3u << 19);
  o = options_for(StateTier::kCpu, swap::IoEngineKind::kThreads, dir);
  o.hyper.beta1 = 1.0;
  EXPECT_THROW(OffloadedOptimizer(o, {{"a", 4}}), UsageError);
}

TEST(OffloadedOptimizer, DiskTooSmallForTheStateIsAnErrorAtConstruction) {
  test::TestDir dir;
  auto o = options_for(StateTier::kNvme, swap::IoEngineKind::kThreads, dir);
  o.directories = {dir.subdir("small")};
  o.sub_group_elements = 1 << 24;  // 192 MiB records: 576 MiB of ring, never mapped here
  // 2^40 elements: 12 TiB of state, more than any test machine's disk. The disk is checked
  // before the ring is mapped.
  try {
    OffloadedOptimizer opt(o, {{"huge", std::uint64_t{1} << 40}});
    FAIL() << "constructed a 12 TiB state";
  } catch (const IoError& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNoSpace) << e.what();
    EXPECT_NE(std::string(e.what()).find(o.directories[0]), std::string::npos) << e.what();
  }
}

TEST(OffloadedOptimizer, UsageErrorsLeaveTheOptimizerUsable) {
  test::TestDir dir;
  const auto groups = odd_groups();
  OffloadedOptimizer opt(options_for(StateTier::kNvme, swap::IoEngineKind::kThreads, dir), groups);
  test::StepGrads sg(groups, 1, ElementType::kF32);
  // No parameters yet.
  EXPECT_THROW((void)opt.step(sg.views), UsageError);
  EXPECT_EQ(opt.step_count(), 0u);
  test::init_all(opt);
  EXPECT_THROW(opt.set_params(0, std::vector<float>(3)), UsageError);
  // A group twice, a wrong size, an unknown group: refused before the step opens.
  std::vector<GroupGrads> twice = {sg.views[0], sg.views[0]};
  EXPECT_THROW((void)opt.step(twice), UsageError);
  std::vector<float> short_grads(5);
  std::vector<GroupGrads> wrong = {{0, adam::GradView::f32(short_grads)}};
  EXPECT_THROW((void)opt.step(wrong), UsageError);
  std::vector<GroupGrads> unknown = {{7, sg.views[0].grads}};
  EXPECT_THROW((void)opt.step(unknown), UsageError);
  EXPECT_EQ(opt.step_count(), 0u);
  // Per-group misuse.
  EXPECT_THROW(opt.step_group(0, sg.views[0].grads), UsageError);  // no open step
  EXPECT_THROW((void)opt.end_step(), UsageError);
  opt.begin_step();
  EXPECT_THROW(opt.begin_step(), UsageError);
  opt.step_group(0, sg.views[0].grads);
  EXPECT_THROW(opt.step_group(0, sg.views[0].grads), UsageError);
  EXPECT_THROW(opt.save(dir.file("ckpt")), UsageError);
  opt.step_group(1, sg.views[1].grads);
  opt.step_group(2, sg.views[2].grads);
  (void)opt.end_step();
  EXPECT_EQ(opt.step_count(), 1u);
  EXPECT_FALSE(opt.failed());
  const test::State want = test::reference_run(groups, test::test_hyper(), 1, ElementType::kF32);
  EXPECT_EQ(test::diff(test::read_all(opt), want), "");
}

TEST(OffloadedOptimizer, SetStateAndStepCountResumeAnotherOptimizerBitwise) {
  // What a state_dict round trip does: the state read out of one optimizer after 2 steps is
  // set into a fresh one of the other tier, which then steps on bitwise as the first does.
  test::TestDir dir;
  const auto groups = odd_groups();
  for (const auto& [from_tier, to_tier] : {std::pair{StateTier::kNvme, StateTier::kCpu},
                                           std::pair{StateTier::kCpu, StateTier::kNvme}}) {
    test::TestDir sub;
    OffloadedOptimizer a(options_for(from_tier, swap::IoEngineKind::kThreads, sub), groups);
    test::init_all(a);
    test::run_steps(a, 1, 2);
    const test::State mid = test::read_all(a);
    OffloadedOptimizer b(options_for(to_tier, swap::IoEngineKind::kThreads, dir), groups);
    for (std::size_t g = 0; g < groups.size(); ++g) b.set_state(g, mid.p[g], mid.m[g], mid.v[g]);
    b.set_step_count(a.step_count());
    EXPECT_EQ(test::diff(test::read_all(b), mid), "");
    test::run_steps(a, 3, kSteps);
    test::run_steps(b, 3, kSteps);
    EXPECT_EQ(b.step_count(), kSteps);
    EXPECT_EQ(test::diff(test::read_all(b), test::read_all(a)), "");
  }
  OffloadedOptimizer opt(options_for(StateTier::kCpu, swap::IoEngineKind::kThreads, dir), groups);
  test::init_all(opt);
  const auto n = groups[0].numel;
  EXPECT_THROW(
      opt.set_state(0, std::vector<float>(n), std::vector<float>(n), std::vector<float>(n - 1)),
      UsageError);
  test::StepGrads sg(groups, 1, ElementType::kF32);
  opt.begin_step();
  EXPECT_THROW(opt.set_step_count(4), UsageError);
  EXPECT_THROW(
      opt.set_state(0, std::vector<float>(n), std::vector<float>(n), std::vector<float>(n)),
      UsageError);
  for (std::size_t g = 0; g < groups.size(); ++g) opt.step_group(g, sg.views[g].grads);
  (void)opt.end_step();
  EXPECT_EQ(opt.step_count(), 1u);
}

TEST(OffloadedOptimizer, DestroyedInsideAStepFinishesItsWork) {
  test::TestDir dir;
  const auto groups = odd_groups();
  test::StepGrads sg(groups, 1, ElementType::kF32);
  // The copy-outs outlive the optimizer: they show that every queued update ran to the end.
  std::vector<std::vector<std::uint16_t>> outs;
  for (const auto& g : groups) outs.emplace_back(g.numel, std::uint16_t{0xffff});
  test::LogCapture log(LogLevel::kWarning);
  {
    OffloadedOptimizer opt(options_for(StateTier::kNvme, swap::IoEngineKind::kThreads, dir),
                           groups);
    test::init_all(opt);
    opt.begin_step();
    for (std::size_t g = 0; g < groups.size(); ++g) {
      opt.step_group(g, sg.views[g].grads, adam::CopyOut::bf16(outs[g]));
    }
  }  // no end_step: the destructor drains the pipeline before the buffers go
  EXPECT_TRUE(log.lines().empty()) << log.lines().front();
  const test::State want = test::reference_run(groups, test::test_hyper(), 1, ElementType::kF32);
  adam::CpuAdam adam;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    std::vector<std::uint16_t> expected(groups[g].numel);
    adam.copy_out(want.p[g], adam::CopyOut::bf16(expected));
    EXPECT_TRUE(outs[g] == expected) << "group " << g << " was not updated by one whole step";
  }
}

TEST(OffloadedOptimizer, ParsesTierNames) {
  EXPECT_EQ(parse_state_tier("cpu", "--tier"), StateTier::kCpu);
  EXPECT_EQ(parse_state_tier("nvme", "--tier"), StateTier::kNvme);
  try {
    (void)parse_state_tier("disk", "--tier");
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()), "invalid --tier 'disk': expected cpu or nvme");
  }
}

}  // namespace
}  // namespace zinf::optim
