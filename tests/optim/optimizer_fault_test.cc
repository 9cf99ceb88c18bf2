// SPDX-License-Identifier: Apache-2.0
// OffloadedOptimizer under faults injected inside each I/O backend (FaultPlan): a failed
// write-back throws IoError naming file, offset and length once and then refuses every call
// with EngineFailed quoting it; a failed read before any write-back leaves the optimizer
// usable with its state untouched; short writes are resubmitted and nothing is lost; a failed
// checkpoint save leaves the optimizer usable. With the default options, a byte flipped in the
// swap file between steps fails the step and any save as kCorrupt: never trained on, never
// checkpointed.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "optimizer_test_util.h"
#include "support/corrupt_swap_file.h"
#include "support/test_dir.h"
#include "zinf/common/error.h"
#include "zinf/optim/optimizer.h"
#include "zinf/swap/crc32c.h"
#include "zinf/swap/fault_injection.h"
#include "zinf/swap/io_engine.h"

namespace zinf::optim {
namespace {

using swap::FaultKind;
using swap::FaultRule;
using swap::IoEngineKind;
using swap::IoOp;

// Records of odd_groups() in the single swap file, allocated in order: embed#0, embed#1
// (53248 bytes each), embed#2 (1809 elements: 24576), w1#0 (53248), w1#1 ...
constexpr std::uint64_t kRecordBytes = 53248;
constexpr std::uint64_t kW1Sub1Offset = 2 * kRecordBytes + 24576 + kRecordBytes;  // 184320
// The same with checksums (the default): the stripe is one padded record, and records of a
// stripe start on stripe boundaries, so w1#0 follows embed#2 at 3 x 53248 and w1#1 is at 4 x.
constexpr std::uint64_t kW1Sub1OffsetWithChecksums = 4 * kRecordBytes;  // 212992

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
  // Checksums off: the record offsets above are the packed layout without them (with them,
  // records of a stripe or more start on stripe boundaries); these tests are about the I/O
  // failure paths, which are the same either way (optimizer_fault_test's corruption tests and
  // swap_store_fault_test cover a failure with checksums on).
  std::unique_ptr<OffloadedOptimizer> make(std::vector<FaultRule> rules) {
    plan_ = std::make_shared<swap::FaultPlan>(std::move(rules), 1);
    OptimizerOptions o;
    o.tier = StateTier::kNvme;
    o.swap_checksums = false;
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

  // An nvme-tier optimizer with the default options (integrity on), initialised.
  std::unique_ptr<OffloadedOptimizer> make_default(const std::string& subdir) {
    OptimizerOptions o;
    o.tier = StateTier::kNvme;
    o.sub_group_elements = test::kOddSubGroup;
    o.hyper = test::test_hyper();
    o.io.kind = GetParam();
    o.directories = {dir_.subdir(subdir)};
    auto opt = std::make_unique<OffloadedOptimizer>(o, test::odd_groups());
    test::init_all(*opt);
    return opt;
  }

  // Checks that `e` is the swap store's corruption error for `key` caused by `flip`: kCorrupt,
  // naming the swap file, the offset and length of the stripe unit, and the CRC32C written and
  // read, both recomputed here from the file's bytes. `prefix`: what the text starts with
  // before the store's error ("save of checkpoint <dir>: " for a save).
  void expect_corrupt(const IoError& e, const std::string& path, const std::string& subdir,
                      const std::string& key, const test::FlippedByte& flip,
                      const std::string& prefix = "") {
    EXPECT_EQ(e.code(), ErrorCode::kCorrupt) << e.what();
    EXPECT_EQ(e.status().path(), path);
    const std::uint64_t offset = e.status().offset();
    const std::uint64_t length = e.status().length();
    EXPECT_LE(offset, flip.offset);
    ASSERT_LT(flip.offset, offset + length) << e.what();
    const std::vector<std::byte> read = test::read_swap_file(dir_.file(subdir), offset, length);
    std::vector<std::byte> written = read;
    written[flip.offset - offset] = flip.before;
    char crcs[64];
    std::snprintf(crcs, sizeof crcs, "crc32c written 0x%08x, read 0x%08x", swap::crc32c(written),
                  swap::crc32c(read));
    const std::string text = e.what();
    EXPECT_EQ(text.rfind(prefix + "swap_in of key '" + key + "' failed: " + path +
                             " offset=" + std::to_string(offset) +
                             " length=" + std::to_string(length) + ": checksum mismatch",
                         0),
              0u)
        << text;
    EXPECT_TRUE(text.ends_with(crcs)) << text << "\nexpected the end: " << crcs;
  }

  static std::string latest(const std::string& ckpt) {
    std::ifstream in(ckpt + "/LATEST");
    std::string name;
    std::getline(in, name);
    return name;
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
  test::StepGrads sg(groups, 1, ElementType::kF32);
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
                             " offset=184320 length=53248 done=0 engine=" +
                             std::string(opt->engine_name()) + ": ",
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
  test::StepGrads sg(test::odd_groups(), 1, ElementType::kF32);
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
  EXPECT_EQ(
      test::diff(test::read_all(*opt),
                 test::reference_run(test::odd_groups(), test::test_hyper(), 2, ElementType::kF32)),
      "");
}

TEST_P(OptimizerFault, FailedReadBeforeAnyWriteBackUndoesTheStep) {
  // Match 0 is step 1's read of embed#0, the first read of the step: nothing written yet.
  auto opt = make({on_record(IoOp::kRead, 0, 0)});
  const auto groups = test::odd_groups();
  test::StepGrads sg(groups, 1, ElementType::kF32);
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
  EXPECT_EQ(test::diff(test::read_all(*opt),
                       test::reference_run(groups, test::test_hyper(), 0, ElementType::kF32)),
            "");
  test::run_steps(*opt, 1, 2);
  EXPECT_EQ(test::diff(test::read_all(*opt),
                       test::reference_run(groups, test::test_hyper(), 2, ElementType::kF32)),
            "");
}

TEST_P(OptimizerFault, FailedReadAfterWriteBacksFailsTheOptimizer) {
  // w1#1 is the fifth record: by the time it is read, earlier records have been written back.
  auto opt = make({on_record(IoOp::kRead, kW1Sub1Offset, 0)});
  test::StepGrads sg(test::odd_groups(), 1, ElementType::kF32);
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
  EXPECT_EQ(
      test::diff(test::read_all(*opt),
                 test::reference_run(test::odd_groups(), test::test_hyper(), 1, ElementType::kF32)),
      "");
}

// The default options keep CRC32C over the state: a byte flipped in the swap file between two
// steps (here the top byte of embed's first master weight, whose record is read first) fails
// the next step as kCorrupt before any state is updated. The step does not happen, a retry
// fails the same way, and a save refuses to checkpoint the bad state: LATEST still names the
// last good checkpoint, which loads back exactly.
TEST_P(OptimizerFault, DefaultOptionsRefuseAStateByteFlippedBetweenSteps) {
  auto opt = make_default("nvme");
  const std::string path = opt->swap_file_paths()[0];
  const auto groups = test::odd_groups();
  test::run_steps(*opt, 1, 1);
  const std::string ckpt = dir_.file("ckpt");
  opt->save(ckpt);
  const std::string good = latest(ckpt);
  ASSERT_FALSE(good.empty());
  const test::State after1 = test::read_all(*opt);

  const auto flip = test::flip_swap_file_byte(dir_.file("nvme"), 3);
  // The byte is embed's first master weight's exponent: what the step would train on.
  std::uint32_t bits;
  std::memcpy(&bits, &after1.p[0][0], 4);
  ASSERT_EQ(static_cast<std::uint32_t>(flip.before), bits >> 24) << "the flip missed the state";

  test::StepGrads sg(groups, 2, ElementType::kF32);
  for (int attempt = 0; attempt < 2; ++attempt) {
    SCOPED_TRACE("attempt " + std::to_string(attempt));
    try {
      (void)opt->step(sg.views);
      FAIL() << "step 2 trained on a corrupt swap file";
    } catch (const IoError& e) {
      expect_corrupt(e, path, "nvme", "embed#0", flip);
    }
    EXPECT_FALSE(opt->failed());  // nothing was written: the step did not happen
    EXPECT_EQ(opt->step_count(), 1u);
  }
  try {
    opt->save(ckpt);
    FAIL() << "a checkpoint was written from state that failed verification";
  } catch (const IoError& e) {
    expect_corrupt(e, path, "nvme", "embed#0", flip, "save of checkpoint " + ckpt + ": ");
  }
  EXPECT_EQ(latest(ckpt), good);
  opt.reset();  // it holds the checkpoint directory (one owner per directory) until destroyed
  auto fresh = make_default("nvme2");
  fresh->load(ckpt);
  EXPECT_EQ(fresh->step_count(), 1u);
  EXPECT_EQ(test::diff(test::read_all(*fresh), after1), "");
  EXPECT_EQ(
      test::diff(after1, test::reference_run(groups, test::test_hyper(), 1, ElementType::kF32)),
      "");
}

// A corrupt record read after earlier records were written back (w1#1, the fifth record with a
// ring of 4) leaves a mix of old and new sub-groups: the optimizer is failed, and every later
// call refuses with EngineFailed quoting the corruption.
TEST_P(OptimizerFault, DefaultOptionsFailTheOptimizerOnACorruptRecordAfterWriteBacks) {
  auto opt = make_default("nvme");
  const std::string path = opt->swap_file_paths()[0];
  test::run_steps(*opt, 1, 1);
  const auto flip = test::flip_swap_file_byte(dir_.file("nvme"), kW1Sub1OffsetWithChecksums + 7);
  test::StepGrads sg(test::odd_groups(), 2, ElementType::kF32);
  std::string text;
  try {
    (void)opt->step(sg.views);
    FAIL() << "step 2 trained on a corrupt swap file";
  } catch (const IoError& e) {
    text = e.what();
    expect_corrupt(e, path, "nvme", "w1#1", flip);
    EXPECT_EQ(e.status().offset(), kW1Sub1OffsetWithChecksums);
  }
  EXPECT_TRUE(opt->failed());
  for (const char* what : {"step", "save"}) {
    try {
      if (std::string(what) == "step") {
        (void)opt->step(sg.views);
      } else {
        opt->save(dir_.file("ckpt"));
      }
      ADD_FAILURE() << what << " ran on a failed optimizer";
    } catch (const EngineFailed& e) {
      EXPECT_EQ(e.cause().code(), ErrorCode::kCorrupt) << what;
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << what << ": " << e.what();
    }
  }
}

// Records of four stripe units, whose checksums the update folds into its own pass: a byte
// flipped in the padding of the first record (its last unit) fails the step before any
// write-back, which leaves the optimizer usable; one flipped inside the m array of the second
// record (unit 2, after the first record was written back) fails the optimizer. Either way
// the error names the unit's file offset and length and both CRCs, as the store's own does.
TEST_P(OptimizerFault, ChecksumsFoldedIntoTheUpdateCatchAFlipInAnyStripeUnit) {
  const std::vector<ParamGroupSpec> groups = {{"big", 2 * 300007 + 11}};
  constexpr std::uint64_t kMiB = 1 << 20;
  struct Case {
    const char* name;
    std::uint64_t flip;  // file offset (one directory: file offsets are store addresses)
    const char* key;
    std::uint64_t unit_offset;
    std::uint64_t unit_length;
    bool fails_optimizer;
  };
  // big#0 takes [0, 3600384) (3600084 bytes of state, padded); big#1 follows it at once.
  const Case cases[] = {
      {"padding", 3600100, "big#0", 3 * kMiB, 3600384 - 3 * kMiB, false},
      {"moments", 3600384 + 2 * kMiB + 100, "big#1", 3600384 + 2 * kMiB, kMiB, true}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string subdir = std::string("nvme-") + c.name;
    OptimizerOptions o;
    o.tier = StateTier::kNvme;
    o.sub_group_elements = 300007;
    o.fit_sub_groups_to_stripes = false;  // records that end part-way into a unit, as named
    o.hyper = test::test_hyper();
    o.io.kind = GetParam();
    o.directories = {dir_.subdir(subdir)};
    OffloadedOptimizer opt(o, groups);
    test::init_all(opt);
    test::run_steps(opt, 1, 1);
    const std::string path = opt.swap_file_paths()[0];
    const auto flip = test::flip_swap_file_byte(dir_.file(subdir), c.flip);
    test::StepGrads sg(groups, 2, ElementType::kF32);
    try {
      (void)opt.step(sg.views);
      ADD_FAILURE() << "step 2 trained on a corrupt swap file";
    } catch (const IoError& e) {
      expect_corrupt(e, path, subdir, c.key, flip);
      EXPECT_EQ(e.status().offset(), c.unit_offset);
      EXPECT_EQ(e.status().length(), c.unit_length);
    }
    EXPECT_EQ(opt.failed(), c.fails_optimizer);
    if (!c.fails_optimizer) {
      EXPECT_EQ(opt.step_count(), 1u);  // the step was undone
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, OptimizerFault,
                         ::testing::Values(IoEngineKind::kThreads, IoEngineKind::kUring),
                         [](const auto& p) {
                           return std::string(swap::io_engine_kind_name(p.param));
                         });

}  // namespace
}  // namespace zinf::optim
