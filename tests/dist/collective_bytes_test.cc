// SPDX-License-Identifier: Apache-2.0
// The sharded engine's collective byte counts (StepStats) against `zinf plan`'s per-stage
// figures (tools/plan/plan_model.h, the arithmetic behind `zinf plan --json`) for the same
// model and world size: 2 and 3 ranks as threads, stages 1, 2 and 3, a training step as the
// demo and DeepSpeed run it (every layer fetched in forward and again in backward, its
// gradients handed in, then step). Layers whose sizes 2 and 3 divide need no padding, so the
// counts equal the plan's exactly; odd sizes exceed it by at most the padding's bytes.
#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "plan_model.h"
#include "support/test_dir.h"
#include "thread_group.h"
#include "zinf/cuda/device.h"
#include "zinf/dist/sharded_engine.h"
#include "zinf/offload/config.h"

namespace zinf::dist {
namespace {

using offload::OffloadDevice;
using tools::PlanInput;
using tools::PlanRow;
using tools::Tier;

offload::EngineConfig config(int stage) {
  offload::EngineConfig cfg;
  cfg.zero_stage = stage;
  cfg.offload_optimizer.device = OffloadDevice::kCpu;  // ZeRO-Offload's setting
  cfg.sub_group_size = 1024;
  cfg.zinf.pinned_budget_bytes = 16u << 20;
  cfg.zinf.adam_threads = 1;
  cfg.zinf.tbw_tb = 0;
  cfg.zinf.rate_notice_share = 0;
  return cfg;
}

// One step's counts on every rank (they must agree), as [all-gather, reduce-scatter,
// all-reduce].
struct Counts {
  double all_gather = 0, reduce_scatter = 0, all_reduce = 0;
};

Counts run_step(int world, int stage, const std::vector<offload::LayerSpec>& layers) {
  std::vector<Counts> seen(static_cast<std::size_t>(world));
  test::ThreadGroup group(world);
  group.run(MemoryKind::kHost, [&](Collectives& comm, cuda::Device& device) {
    cuda::Stream compute = device.create_stream();
    ShardedEngine e(config(stage), layers, device, compute.ref(), comm);
    for (std::size_t l = 0; l < layers.size(); ++l) {
      e.set_master_weights(l, std::vector<float>(layers[l].numel, 0.5f));
    }
    // Two steps: the second is measured (the first's counts must be the same).
    offload::StepStats st;
    for (int step = 0; step < 2; ++step) {
      for (std::size_t l = 0; l < layers.size(); ++l) {  // forward
        (void)e.fetch(l);
        e.release(l);
      }
      for (std::size_t l = layers.size(); l-- > 0;) {  // backward
        (void)e.fetch(l);
        e.release(l);
        const std::vector<float> g(layers[l].numel, 1.0f / 64);
        e.set_gradients(l, adam::GradView::f32(g));
      }
      const offload::StepStats now = e.step();
      // stats() reports the last step's counts as step() returned them.
      const offload::EngineStats reported = e.stats();
      EXPECT_EQ(reported.last_step.allgather_bytes, now.allgather_bytes);
      EXPECT_EQ(reported.last_step.reduce_scatter_bytes, now.reduce_scatter_bytes);
      EXPECT_EQ(reported.last_step.all_reduce_bytes, now.all_reduce_bytes);
      if (step == 1) {
        EXPECT_EQ(now.allgather_bytes, st.allgather_bytes);
        EXPECT_EQ(now.reduce_scatter_bytes, st.reduce_scatter_bytes);
        EXPECT_EQ(now.all_reduce_bytes, st.all_reduce_bytes);
      }
      st = now;
    }
    device.synchronize(compute.ref());
    seen[static_cast<std::size_t>(comm.rank())] = {static_cast<double>(st.allgather_bytes),
                                                   static_cast<double>(st.reduce_scatter_bytes),
                                                   static_cast<double>(st.all_reduce_bytes)};
  });
  for (const Counts& c : seen) {
    EXPECT_EQ(c.all_gather, seen[0].all_gather);
    EXPECT_EQ(c.reduce_scatter, seen[0].reduce_scatter);
    EXPECT_EQ(c.all_reduce, seen[0].all_reduce);
  }
  return seen[0];
}

// `zinf plan --params <the layers' sum> --gpus N --gpus-per-node N --bytes-per-param 2,4,12`'s
// row for the stage: bf16 parameters, fp32 gradients (the engine averages them in fp32).
PlanRow plan_row(int world, int stage, const std::vector<offload::LayerSpec>& layers) {
  PlanInput in;
  for (const auto& l : layers) in.params += static_cast<double>(l.numel);
  in.bytes = {2, 4, 12};
  in.gpus = static_cast<std::uint32_t>(world);
  in.gpus_per_node = in.gpus;
  return tools::evaluate_setup(in, {stage, stage == 1 ? Tier::kGpu : Tier::kCpu, Tier::kGpu},
                               static_cast<std::uint32_t>(world));
}

class CollectiveBytes : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(CollectiveBytes, EqualThePlansFiguresWithoutPadding) {
  const auto [world, stage] = GetParam();
  // Every size a multiple of 6: no padding at 2 or 3 ranks.
  const std::vector<offload::LayerSpec> layers = {{"embed", 6000, ElementType::kBF16},
                                                  {"bias", 6, ElementType::kBF16},
                                                  {"proj", 1206, ElementType::kBF16}};
  const Counts got = run_step(world, stage, layers);
  const PlanRow plan = plan_row(world, stage, layers);
  EXPECT_DOUBLE_EQ(got.all_gather, plan.allgather_per_step);
  EXPECT_DOUBLE_EQ(got.reduce_scatter + got.all_reduce, plan.grad_reduce_per_step);
  // Stage 1 all-reduces, stages 2 and 3 reduce-scatter.
  EXPECT_EQ(stage == 1 ? got.reduce_scatter : got.all_reduce, 0.0);
}

TEST_P(CollectiveBytes, ExceedThePlansFiguresByThePaddingAtMost) {
  const auto [world, stage] = GetParam();
  const std::vector<offload::LayerSpec> layers = {{"embed", 1001, ElementType::kBF16},
                                                  {"bias", 5, ElementType::kBF16},
                                                  {"proj", 2048, ElementType::kBF16}};
  const Counts got = run_step(world, stage, layers);
  const PlanRow plan = plan_row(world, stage, layers);
  // At most world - 1 padding elements per layer, gathered (2 bytes each, twice at stage 3)
  // and reduced (4 bytes each, twice for an all-reduce).
  const double pad = static_cast<double>(layers.size() * static_cast<std::size_t>(world - 1));
  EXPECT_GE(got.all_gather, plan.allgather_per_step);
  EXPECT_LE(got.all_gather, plan.allgather_per_step + pad * 2 * (stage == 3 ? 2 : 1));
  const double reduced = got.reduce_scatter + got.all_reduce;
  EXPECT_GE(reduced, plan.grad_reduce_per_step);
  EXPECT_LE(reduced, plan.grad_reduce_per_step + pad * 4 * (stage == 1 ? 2 : 1));
}

INSTANTIATE_TEST_SUITE_P(WorldsAndStages, CollectiveBytes,
                         ::testing::Combine(::testing::Values(2, 3), ::testing::Values(1, 2, 3)),
                         [](const auto& p) {
                           return std::to_string(std::get<0>(p.param)) + "ranks_stage" +
                                  std::to_string(std::get<1>(p.param));
                         });

// Stage 2 gathers half the parameter bytes of stage 3 (once per step, not at each of the two
// fetches), and moves the same gradient bytes.
TEST(CollectiveBytesStages, StageTwoGathersHalfOfStageThree) {
  const std::vector<offload::LayerSpec> layers = {{"embed", 6000, ElementType::kBF16},
                                                  {"proj", 1206, ElementType::kBF16}};
  for (const int world : {2, 3}) {
    const Counts two = run_step(world, 2, layers);
    const Counts three = run_step(world, 3, layers);
    EXPECT_EQ(2 * two.all_gather, three.all_gather) << world << " ranks";
    EXPECT_EQ(two.reduce_scatter, three.reduce_scatter) << world << " ranks";
  }
}

}  // namespace
}  // namespace zinf::dist
