// SPDX-License-Identifier: Apache-2.0
// A failed StoreCopyOut write follows the optimizer's write-back rules: end_step() throws the
// parameter store's IoError (key, file, offset, length, errno), and the optimizer is failed.
#include <cerrno>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "optimizer_test_util.h"
#include "support/test_dir.h"
#include "zinf/common/error.h"
#include "zinf/optim/optimizer.h"
#include "zinf/swap/fault_injection.h"
#include "zinf/swap/swap_store.h"

namespace zinf::optim {
namespace {

class StoreCopyOutFault : public ::testing::TestWithParam<StateTier> {};

TEST_P(StoreCopyOutFault, FailedCopyOutWriteFailsTheStep) {
  test::TestDir dir;
  const std::vector<ParamGroupSpec> gs = {{"w", 4 * 2048}};
  swap::FaultRule eio;
  eio.kind = swap::FaultKind::kError;
  eio.op = swap::IoOp::kWrite;
  eio.offset_begin = 8192;  // the third sub-group's 4096 bytes
  eio.offset_end = 12288;
  eio.err = EIO;
  auto plan = std::make_shared<swap::FaultPlan>(std::vector<swap::FaultRule>{eio});
  swap::IoOptions io;
  io.kind = swap::IoEngineKind::kThreads;
  io.faults = plan;
  auto engine = swap::make_io_engine(io);
  swap::SwapStoreOptions so;
  so.directories = {dir.subdir("param")};
  so.capacity_bytes = 1u << 20;
  // Checksums off: the fault hits one 4096-byte sub-group's write, and with checksums a range
  // write must cover whole stripe units (1 MiB here), which 2048-element sub-groups are not.
  so.checksums = false;
  swap::SwapStore store(so, *engine);
  store.allocate("w", gs[0].numel * 2);

  OptimizerOptions o;
  o.tier = GetParam();
  o.sub_group_elements = 2048;
  o.pipeline_depth = 3;
  o.pinned_budget_bytes = 16u << 20;
  o.io.kind = swap::IoEngineKind::kThreads;
  o.store_copy_out = true;
  if (o.tier == StateTier::kNvme) o.directories = {dir.subdir("opt")};
  OffloadedOptimizer opt(o, gs);
  test::init_all(opt);
  std::vector<float> g(gs[0].numel, 0.01f);
  opt.begin_step();
  opt.step_group(0, adam::GradView::f32(g), StoreCopyOut{&store, "w", ElementType::kBF16});
  try {
    (void)opt.end_step();
    ADD_FAILURE() << "no throw";
  } catch (const IoError& e) {
    EXPECT_EQ(e.status().sys_errno(), EIO);
    EXPECT_EQ(e.status().path(), store.file_paths()[0]);
    EXPECT_EQ(e.status().offset(), 8192u);
    EXPECT_EQ(e.status().length(), 4096u);
    EXPECT_NE(std::string(e.what()).find("swap_out of key 'w'"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(opt.failed());
  EXPECT_THROW(opt.begin_step(), EngineFailed);
  EXPECT_EQ(plan->injected_errors(), 1u);
}

INSTANTIATE_TEST_SUITE_P(Tiers, StoreCopyOutFault,
                         ::testing::Values(StateTier::kCpu, StateTier::kNvme),
                         [](const auto& p) { return std::string(state_tier_name(p.param)); });

}  // namespace
}  // namespace zinf::optim
