// SPDX-License-Identifier: Apache-2.0
// plan_engine (offload/src/engine_plan.h): the engine's plan from its config and layers alone,
// with no engine, device or file (the nvme tiers only probe their directories): the sub-group, the optimizer's options, the staging choice,
// the pinned budget's shares and its error, the drive-wear estimate and notices, the notices
// at construction and the drive-slowdown watches.
#include "engine_plan.h"

#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "support/test_dir.h"
#include "zinf/common/align.h"
#include "zinf/common/error.h"

namespace zinf::offload::detail {
namespace {

// Both tiers in memory: nothing to probe, nothing on a drive.
EngineConfig memory_config() {
  EngineConfig c;
  c.zero_stage = 3;
  c.offload_param.device = OffloadDevice::kNone;
  c.offload_optimizer.device = OffloadDevice::kCpu;
  c.offload_optimizer.buffer_count = 3;
  c.sub_group_size = 2048;
  c.zinf.adam_threads = 2;
  c.zinf.grad_staging_buffers = 2;
  c.optimizer.hyper.lr = 1e-2;
  return c;
}

std::vector<LayerSpec> layers() {
  return {{"a", 5000, ElementType::kBF16},
          {"b", 300, ElementType::kF16},
          {"c", 4096, ElementType::kBF16}};
}

TEST(EnginePlan, TranslatesTheConfigIntoTheOptimizersOptions) {
  EngineConfig c = memory_config();
  c.zinf.state_precision = adam::StatePrecision::kBF16;
  std::vector<LayerSpec> ls = layers();
  ls[1].hyper = c.optimizer.hyper;
  ls[1].hyper->weight_decay = 0;
  const EnginePlan plan = plan_engine(c, ls);
  EXPECT_EQ(plan.sub_group, 2048u);
  EXPECT_TRUE(plan.sub_group_note.empty());
  EXPECT_EQ(plan.optimizer.tier, optim::StateTier::kCpu);
  EXPECT_EQ(plan.optimizer.sub_group_elements, 2048u);
  EXPECT_EQ(plan.optimizer.pipeline_depth, 3u);
  EXPECT_EQ(plan.optimizer.state_precision, adam::StatePrecision::kBF16);
  EXPECT_EQ(plan.optimizer.adam.threads, 2u);
  EXPECT_EQ(plan.optimizer.hyper.lr, c.optimizer.hyper.lr);
  EXPECT_TRUE(plan.optimizer.directories.empty());
  EXPECT_EQ(plan.optimizer.io.faults, nullptr);
  ASSERT_EQ(plan.groups.size(), 3u);
  for (std::size_t i = 0; i < ls.size(); ++i) {
    EXPECT_EQ(plan.groups[i].name, ls[i].name);
    EXPECT_EQ(plan.groups[i].numel, ls[i].numel);
    EXPECT_EQ(plan.groups[i].hyper.has_value(), ls[i].hyper.has_value());
  }
  // The optimizer is built with exactly its own share of the budget.
  EXPECT_EQ(plan.optimizer.pinned_budget_bytes, plan.pinned.optimizer);
  EXPECT_EQ(plan.mode, StepMode::kOnArrival);
  EXPECT_FALSE(plan.stage);
  EXPECT_FALSE(plan.wear);
}

TEST(EnginePlan, ClampsTheSubGroup) {
  EngineConfig c = memory_config();
  c.sub_group_size = std::uint64_t{1} << 60;
  EXPECT_EQ(plan_engine(c, layers()).sub_group, kMaxLayerElements);
}

// Each share of zinf.pinned_budget_bytes, and the error when they do not fit: it names every
// share and the smallest budget that works, which then does.
TEST(EnginePlan, PinnedBudgetSharesAndTheSmallestThatWorks) {
  EngineConfig c = memory_config();
  const EnginePlan fits = plan_engine(c, layers());
  EXPECT_TRUE(fits.budget_error.empty()) << fits.budget_error;
  EXPECT_EQ(fits.pinned.optimizer,
            optim::optimizer_pinned_bytes_needed(fits.optimizer, fits.groups));
  EXPECT_EQ(fits.pinned.params, 0u);  // resident parameters: nothing pinned
  EXPECT_EQ(fits.grad_slot_bytes, align_up(5000u * 4, kHostAlign));
  EXPECT_EQ(fits.pinned.device_grads, 2 * fits.grad_slot_bytes);
  EXPECT_EQ(fits.pinned.stage, 0u);

  const std::uint64_t need = fits.pinned.total();
  c.zinf.pinned_budget_bytes = need - 1;
  const EnginePlan short_by_one = plan_engine(c, layers());
  const std::string optimizer = std::to_string(fits.pinned.optimizer);
  const std::string grads = std::to_string(fits.pinned.device_grads);
  EXPECT_EQ(short_by_one.budget_error,
            "OffloadEngine: zinf.pinned_budget_bytes " + std::to_string(need - 1) +
                " cannot hold the optimizer's " + optimizer + " bytes plus " +
                fits.params.pinned_what + "'s 0 bytes plus the device-gradient staging's " + grads +
                " bytes (zinf.grad_staging_buffers 2 x the largest layer's fp32 gradients; 0 if "
                "gradients always come from host memory); the smallest budget that works is " +
                std::to_string(need));
  c.zinf.pinned_budget_bytes = need;
  EXPECT_TRUE(plan_engine(c, layers()).budget_error.empty());
}

// The staged mode (clipping) stages the whole model's gradients in pinned memory; without an
// NVMe directory a budget too small for that says NVMe staging would have worked.
TEST(EnginePlan, StagedModeStagesInPinnedMemoryAndSaysWhatElseWouldFit) {
  EngineConfig c = memory_config();
  c.gradient_clipping = 1.0;
  const EnginePlan plan = plan_engine(c, layers());
  EXPECT_EQ(plan.mode, StepMode::kStaged);
  ASSERT_TRUE(plan.stage);
  EXPECT_FALSE(plan.stage->nvme);
  ASSERT_EQ(plan.stage->layers.size(), 3u);
  EXPECT_EQ(plan.pinned.stage, grad_stage_pinned_bytes(plan.stage->layers));

  c.zinf.pinned_budget_bytes = plan.pinned.total() - 1;
  const std::string error = plan_engine(c, layers()).budget_error;
  EXPECT_NE(error.find(" plus the gradient staging (the whole model's gradients as fp32)'s " +
                       std::to_string(plan.pinned.stage) + " bytes"),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("the gradients could be staged on NVMe instead"), std::string::npos)
      << error;
}

// The wear estimate: nothing on NVMe writes nothing; the optimizer's state on NVMe is 12 bytes
// per element a step (fp32), NVMe parameters add their low-precision bytes (2 each); each
// directory is named once. Then the two notices' texts from an estimate.
TEST(EnginePlan, WearEstimateCountsWhatEachStepWritesAndWhere) {
  EngineConfig c = memory_config();
  c.zinf.tbw_tb = 1;
  const EnginePlan memory = plan_engine(c, layers());
  ASSERT_TRUE(memory.wear);
  EXPECT_EQ(memory.wear->bytes_per_step, 0);
  EXPECT_TRUE(memory.wear->where.empty());

  // Both tiers on NVMe, two directories for the two: the plan probes their alignment and
  // leaves no file behind.
  test::TestDir dir;
  c.offload_optimizer.device = OffloadDevice::kNvme;
  c.offload_optimizer.nvme_path = dir.subdir("opt");
  c.offload_param.device = OffloadDevice::kNvme;
  c.offload_param.nvme_path = dir.subdir("param");
  const EnginePlan nvme = plan_engine(c, layers());
  ASSERT_TRUE(nvme.wear);
  EXPECT_EQ(nvme.wear->bytes_per_step, 12.0 * 9396 + 2.0 * 9396);
  EXPECT_EQ(nvme.wear->where, c.offload_optimizer.nvme_path + ", " + c.offload_param.nvme_path);
  EXPECT_TRUE(std::filesystem::is_empty(c.offload_optimizer.nvme_path));
  EXPECT_TRUE(std::filesystem::is_empty(c.offload_param.nvme_path));
  c.offload_param.nvme_path = c.offload_optimizer.nvme_path;  // one directory, named once
  EXPECT_EQ(plan_engine(c, layers()).wear->where, c.offload_optimizer.nvme_path);

  const WearEstimate wear{12.0 * 13499, "/nvme/opt"};
  EXPECT_EQ(wear_notice(wear, 1),
            "OffloadEngine: drive wear: each step writes about 0.000162 GB to /nvme/opt; the "
            "rated 1 TB of endurance lasts 6173297 steps (1% every 61733 steps); days at the "
            "step rate follow after the first steps");
  EXPECT_EQ(measured_wear_notice(wear, 1, 200e9, 10, 4),
            "OffloadEngine: drive wear: 200 GB written per step to /nvme/opt at 10 s per step "
            "(steps 2-4), 1.73e+03 TB a day: the rated 1 TB lasts 0.000579 days of training "
            "(1% every 0.000139 hours)");
}

// What the engine logs once built: the config's notices, then the start-up wear notice where
// a step writes to NVMe. The drive-slowdown watches: the optimizer's NVMe writes and reads,
// every directory named, each with its tuned reference; none off NVMe or with a share of 0.
TEST(EnginePlan, NoticesAndDriveSlowdownWatches) {
  EngineConfig c = memory_config();
  c.notices = {"zinf.old_key is now zinf.new_key"};
  c.zinf.tbw_tb = 1;
  c.zinf.rate_notice_share = 0.4;
  c.zinf.rate_notice_steps = 5;
  c.zinf.tuned_write_gbps = 2;
  c.zinf.tuned_read_gbps = 3;
  const EnginePlan memory = plan_engine(c, layers());
  EXPECT_EQ(memory.notices, std::vector<std::string>{"config: zinf.old_key is now zinf.new_key"});
  EXPECT_FALSE(memory.write_notice);
  EXPECT_FALSE(memory.read_notice);

  test::TestDir dir;
  c.offload_optimizer.device = OffloadDevice::kNvme;
  c.offload_optimizer.nvme_path = dir.subdir("opt");
  c.zinf.nvme_paths = {dir.subdir("more")};
  const std::string where = c.offload_optimizer.nvme_path + ", " + c.zinf.nvme_paths[0];
  const EnginePlan nvme = plan_engine(c, layers());
  ASSERT_TRUE(nvme.wear);
  ASSERT_EQ(nvme.notices.size(), 2u);
  EXPECT_EQ(nvme.notices[0], "config: zinf.old_key is now zinf.new_key");
  EXPECT_EQ(nvme.notices[1], wear_notice(*nvme.wear, 1));
  ASSERT_TRUE(nvme.write_notice);
  EXPECT_EQ(nvme.write_notice->what, "optimizer writes to " + where);
  EXPECT_EQ(nvme.write_notice->share, 0.4);
  EXPECT_EQ(nvme.write_notice->steps, 5u);
  EXPECT_EQ(nvme.write_notice->reference_gbps, 2);
  ASSERT_TRUE(nvme.read_notice);
  EXPECT_EQ(nvme.read_notice->what, "optimizer reads from " + where);
  EXPECT_EQ(nvme.read_notice->share, 0.4);
  EXPECT_EQ(nvme.read_notice->steps, 5u);
  EXPECT_EQ(nvme.read_notice->reference_gbps, 3);

  c.zinf.rate_notice_share = 0;
  c.zinf.tbw_tb = 0;
  c.notices.clear();
  const EnginePlan quiet = plan_engine(c, layers());
  EXPECT_TRUE(quiet.notices.empty());
  EXPECT_FALSE(quiet.write_notice);
  EXPECT_FALSE(quiet.read_notice);
}

TEST(EnginePlan, RefusesLayersTheConfigCannotHold) {
  EngineConfig c = memory_config();
  EXPECT_THROW(plan_engine(c, {}), UsageError);
  std::vector<LayerSpec> dup = {{"a", 10, ElementType::kBF16}, {"a", 10, ElementType::kBF16}};
  EXPECT_THROW(plan_engine(c, dup), UsageError);
  std::vector<LayerSpec> fp32 = {{"a", 10, ElementType::kF32}};
  EXPECT_THROW(plan_engine(c, fp32), UsageError);
  for (ElementType wide : {ElementType::kF64, ElementType::kI32, ElementType::kU8}) {
    try {
      (void)plan_engine(c, {{"w", 10, wide}});
      ADD_FAILURE() << element_type_name(wide) << " parameters were accepted";
    } catch (const UsageError& e) {
      EXPECT_STREQ(e.what(), "OffloadEngine: layer 'w' param_dtype must be bf16 or fp16");
    }
  }
  c.offload_param.device = OffloadDevice::kCpu;
  c.offload_param.buffer_size = 4096;
  try {
    (void)plan_engine(c, layers());
    ADD_FAILURE() << "no throw";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(),
                 "OffloadEngine: layer 'a' has 5000 elements, more than "
                 "offload_param.buffer_size 4096; raise offload_param.buffer_size to at least "
                 "5000");
  }
}

}  // namespace
}  // namespace zinf::offload::detail
