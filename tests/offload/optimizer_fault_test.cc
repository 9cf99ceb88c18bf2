// SPDX-License-Identifier: Apache-2.0
// OffloadedOptimizer under faults injected inside each I/O backend (FaultPlan): a failed
// write-back throws IoError naming file, offset and length once and then refuses every call
// with EngineFailed quoting it; a failed read before any write-back leaves the optimizer
// usable with its state untouched; short writes are resubmitted and nothing is lost; a failed
// checkpoint save leaves the optimizer usable.
#include <cerrno>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "optimizer_test_util.h"
#include "support/test_dir.h"
#include "zinf/common/error.h"
#include "zinf/offload/optimizer.h"
#include "zinf/swap/fault_injection.h"
#include "zinf/swap/io_engine.h"

namespace zinf::offload {
namespace {

using swap::FaultKind;
using swap::FaultRule;
using swap::IoEngineKind;
using swap::IoOp;

// Records of odd_groups() in the single swap file, allocated in order: embed#0, embed#1
// (53248 bytes each), embed#2 (1809 elements: 24576), w1#0 (53248), w1#1 ...
constexpr std::uint64_t kRecordBytes = 53248;
constexpr std::uint64_t kW1Sub1Offset = 2 * kRecordBytes + 24576 + kRecordBytes;  // 184320

class OptimizerFault : public ::testing::TestWithParam<IoEngineKind> {
 protected:
  void SetUp() override {
    if (GetParam() == IoEngineKind::kUring) {
      if (auto why = swap::io_uring_unavailable_reason(); !why.empty()) {
        GTEST_SKIP() << "io_uring unavailable: " << why;
      }
    }
  }

  // An nvme-tier optimizer over one directory whose engine applies `rules`. The swap file is
  // the engine's FileId 0 (the store attaches it first); a checkpoint file is FileId 1.
  std::unique_ptr<OffloadedOptimizer> make(std::vector<FaultRule> rules) {
    plan_ = std::make_shared<swap::FaultPlan>(std::move(rules), 1);
    OptimizerOptions o;
    o.tier = StateTier::kNvme;
    o.sub_group_elements = test::kOddSubGroup;
    o.hyper = test::test_hyper();
    o.io.kind = GetParam();
    o.io.queue_depth = 8;
    o.io.faults = plan_;
    o.directories = {dir_.subdir("nvme")};
    auto opt = std::make_unique<OffloadedOptimizer>(o, test::odd_groups());
    test::init_all(*opt);
    return opt;
  }

  static FaultRule on_record(IoOp op, std::uint64_t offset, std::uint64_t first_match) {
    FaultRule r;
    r.kind = FaultKind::kError;
    r.op = op;
    r.file = swap::FileId{0};
    r.offset_begin = offset;
    r.offset_end = offset + 1;
    r.first_match = first_match;
    r.err = EIO;
    return r;
  }

  test::TestDir dir_;
  std::shared_ptr<swap::FaultPlan> plan_;
};

TEST_P(OptimizerFault, FailedWriteBackThrowsOnceThenRefusesEveryCall) {
  // Match 0 of the rule is set_params' write of w1#1; match 1 is step 1's write-back.
  auto opt = make({on_record(IoOp::kWrite, kW1Sub1Offset, 1)});
  const std::string path = opt->swap_file_paths()[0];
  const auto groups = test::odd_groups();
  test::StepGrads sg(groups, 1, DType::kF32);
  std::string text;
  try {
    (void)opt->step(sg.views);
    FAIL() << "a failed write-back was not reported";
  } catch (const IoError& e) {
    text = e.what();
    EXPECT_EQ(e.sys_errno(), EIO);
    EXPECT_EQ(e.status().path(), path);
    EXPECT_EQ(e.status().offset(), kW1Sub1Offset);
    EXPECT_EQ(e.status().length(), kRecordBytes);
    EXPECT_EQ(text.rfind("swap_out of key 'w1#1': write failed: " + path +
                             " offset=184320 length=53248 done=0 engine=" + std::string(opt->engine_name()) + ": ",
                         0),
              0u)
        << text;
    EXPECT_TRUE(text.ends_with("(EIO)")) << text;
  }
  EXPECT_EQ(plan_->injected_errors(), 1u);
  EXPECT_TRUE(opt->failed());
  const std::string refused = "refusing work after an earlier failure: " + text;
  auto expect_refused = [&](auto&& call, const char* what) {
    try {
      call();
      ADD_FAILURE() << what << " ran on a failed optimizer";
    } catch (const EngineFailed& e) {
      EXPECT_EQ(std::string(e.what()), refused) << what;
    }
  };
  expect_refused([&] { (void)opt->step(sg.views); }, "step");
  expect_refused([&] { opt->begin_step(); }, "begin_step");
  expect_refused([&] { test::read_all(*opt); }, "read_state");
  expect_refused([&] { opt->save(dir_.file("ckpt")); }, "save");
  expect_refused([&] { opt->load(dir_.file("ckpt")); }, "load");
  expect_refused([&] { opt->set_params(2, std::vector<float>(3)); }, "set_params");
}

TEST_P(OptimizerFault, ZeroByteWriteIsAShortTransferThatFailsTheOptimizer) {
  FaultRule r = on_record(IoOp::kWrite, 0, 1);  // embed#0's write-back in step 1
  r.kind = FaultKind::kShort;
  r.short_bytes = 0;
  auto opt = make({r});
  test::StepGrads sg(test::odd_groups(), 1, DType::kF32);
  try {
    (void)opt->step(sg.views);
    FAIL() << "a zero-byte write was not reported";
  } catch (const IoError& e) {
    EXPECT_EQ(e.code(), ErrorCode::kShortTransfer) << e.what();
    EXPECT_EQ(std::string(e.what()).rfind("swap_out of key 'embed#0': write failed: " +
                                              opt->swap_file_paths()[0] + " offset=0 length=53248 ",
                                          0),
              0u)
        << e.what();
  }
  EXPECT_TRUE(opt->failed());
  EXPECT_THROW((void)opt->step(sg.views), EngineFailed);
}

TEST_P(OptimizerFault, ShortWritesAreResubmittedAndNothingIsLost) {
  FaultRule r;
  r.kind = FaultKind::kShort;
  r.op = IoOp::kWrite;
  r.short_bytes = 8192;
  r.times = 1000;
  auto opt = make({r});
  test::run_steps(*opt, 1, 2);
  EXPECT_GT(plan_->injected(), 0u);
  EXPECT_EQ(test::diff(test::read_all(*opt),
                       test::reference_run(test::odd_groups(), test::test_hyper(), 2, DType::kF32)),
            "");
}

TEST_P(OptimizerFault, FailedReadBeforeAnyWriteBackUndoesTheStep) {
  // Match 0 is step 1's read of embed#0, the first read of the step: nothing written yet.
  auto opt = make({on_record(IoOp::kRead, 0, 0)});
  const auto groups = test::odd_groups();
  test::StepGrads sg(groups, 1, DType::kF32);
  try {
    (void)opt->step(sg.views);
    FAIL() << "a failed read was not reported";
  } catch (const IoError& e) {
    EXPECT_EQ(e.sys_errno(), EIO);
    EXPECT_EQ(std::string(e.what()).rfind("swap_in of key 'embed#0': read failed: " +
                                              opt->swap_file_paths()[0] + " offset=0 length=53248 ",
                                          0),
              0u)
        << e.what();
  }
  EXPECT_FALSE(opt->failed());
  EXPECT_EQ(opt->step_count(), 0u);
  // The state is the initial one, and training goes on as if the failed step never happened.
  EXPECT_EQ(test::diff(test::read_all(*opt), test::reference_run(groups, test::test_hyper(), 0, DType::kF32)), "");
  test::run_steps(*opt, 1, 2);
  EXPECT_EQ(test::diff(test::read_all(*opt), test::reference_run(groups, test::test_hyper(), 2, DType::kF32)), "");
}

TEST_P(OptimizerFault, FailedReadAfterWriteBacksFailsTheOptimizer) {
  // w1#1 is the fifth record: by the time it is read, earlier records have been written back.
  auto opt = make({on_record(IoOp::kRead, kW1Sub1Offset, 0)});
  test::StepGrads sg(test::odd_groups(), 1, DType::kF32);
  try {
    (void)opt->step(sg.views);
    FAIL() << "a failed read was not reported";
  } catch (const IoError& e) {
    EXPECT_EQ(e.sys_errno(), EIO);
    EXPECT_EQ(e.status().offset(), kW1Sub1Offset);
  }
  EXPECT_TRUE(opt->failed());
  EXPECT_THROW((void)opt->step(sg.views), EngineFailed);
}

TEST_P(OptimizerFault, FailedCheckpointSaveLeavesTheOptimizerUsable) {
  FaultRule r;
  r.kind = FaultKind::kError;
  r.op = IoOp::kWrite;
  r.file = swap::FileId{1};  // the checkpoint's state file
  r.err = EIO;
  auto opt = make({r});
  test::run_steps(*opt, 1, 1);
  const std::string ckpt = dir_.file("ckpt");
  try {
    opt->save(ckpt);
    FAIL() << "a failed checkpoint write was not reported";
  } catch (const IoError& e) {
    EXPECT_EQ(e.sys_errno(), EIO);
    EXPECT_NE(std::string(e.what()).find("/state.bin offset="), std::string::npos) << e.what();
  }
  EXPECT_FALSE(opt->failed());
  // The rule fired once: the next save works, and loads back.
  opt->save(ckpt);
  test::run_steps(*opt, 2, 2);
  opt->load(ckpt);
  EXPECT_EQ(opt->step_count(), 1u);
  EXPECT_EQ(test::diff(test::read_all(*opt),
                       test::reference_run(test::odd_groups(), test::test_hyper(), 1, DType::kF32)),
            "");
}

INSTANTIATE_TEST_SUITE_P(Backends, OptimizerFault,
                         ::testing::Values(IoEngineKind::kThreads, IoEngineKind::kUring),
                         [](const auto& p) { return std::string(swap::io_engine_kind_name(p.param)); });

}  // namespace
}  // namespace zinf::offload
