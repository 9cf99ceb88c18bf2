// SPDX-License-Identifier: Apache-2.0
// OffloadedOptimizer::save_async: the checkpoint written while steps run is byte for byte the
// one save() writes of the same state (state file and manifest), on both tiers; a step copies
// a record the save still needs (and only such a record) and waits for one the save holds in
// flight; the commit ends with steps back to back and without steps; the contract's corners
// (a second save, a save inside a step, destruction with a save in flight, a failed write
// reported by wait_save with file, offset and length and no half version left); and a process
// killed during an asynchronous save leaves the previous checkpoint loadable.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "optimizer_test_util.h"
#include "support/private_tmpfs.h"
#include "support/test_dir.h"
#include "zinf/common/error.h"
#include "zinf/optim/optimizer.h"
#include "zinf/optim/testing.h"
#include "zinf/swap/fault_injection.h"

namespace zinf::optim {
namespace {

namespace fs = std::filesystem;

// The streaming path, also where ZINF_TEST_DIR is on XFS or btrfs: these tests count the
// steps' copies and inject faults into the save's writes, which a save by reflink does
// without (reflink_checkpoint_test tests that path).
OptimizerOptions options_for(StateTier tier, const test::TestDir& dir,
                             const std::string& nvme = "nvme") {
  OptimizerOptions o = test::checkpoint_options(tier, dir, nvme);
  o.checkpoint_reflink = false;
  return o;
}
using test::entries;
using test::expect_same_checkpoint;
using test::latest_version;

// Holds the save's thread inside its first "data" phase (its first record, the last one,
// written and not yet marked done) until release(): the steps the test runs meanwhile meet a save that has written
// nothing else, so which records they must copy is known.
struct SaverGate {
  std::promise<void> go;
  std::shared_future<void> opened = go.get_future().share();
  void install(OffloadedOptimizer& opt) {
    auto gate = opened;
    auto first = std::make_shared<bool>(true);
    test_hooks::set_checkpoint_hook(opt, [gate, first](std::string_view phase, std::uint64_t) {
      if (phase == "data" && *first) {
        *first = false;
        gate.wait();
      }
    });
  }
  void release() { go.set_value(); }
};

class AsyncCheckpoint : public ::testing::TestWithParam<StateTier> {
 protected:
  test::TestDir dir_;
};

TEST_P(AsyncCheckpoint, WritesTheStateAtTheCallWhileStepsGoOnBytewiseAsSave) {
  const auto groups = test::odd_groups();
  const std::string sync_dir = dir_.file("sync");
  const std::string async_dir = dir_.file("async");
  test::State at_save, after;
  test::StepGrads sg3(groups, 3, ElementType::kF32);
  test::StepGrads sg4(groups, 4, ElementType::kF32);
  {  // the checkpoint directories are locked for `a` until it is gone
    OffloadedOptimizer a(options_for(GetParam(), dir_), groups);
    test::init_all(a);
    test::run_steps(a, 1, 2);
    at_save = test::read_all(a);
    a.save(sync_dir);

    SaverGate gate;
    gate.install(a);
    a.save_async(async_dir);
    EXPECT_TRUE(a.save_in_flight());
    // Step 3 over the first group only ("embed", three records the save, which goes from the
    // last record down, has not reached): the step copies them, as they are, before updating
    // them; step 4 finds them copied already.
    const StepStats s3 = a.step(std::span(&sg3.views[0], 1));
    EXPECT_GT(s3.snapshot_copy_bytes, 0u);
    EXPECT_EQ(s3.snapshot_copy_bytes % 4096, 0u);
    EXPECT_EQ(a.step(std::span(&sg4.views[0], 1)).snapshot_copy_bytes, 0u);
    gate.release();
    // Every group from here on, while the save may still be writing: each record is either
    // written already, being written (waited for) or copied first.
    test::run_steps(a, 5, 7);
    a.wait_save();
    EXPECT_FALSE(a.save_in_flight());
    after = test::read_all(a);
  }

  expect_same_checkpoint(async_dir, sync_dir);
  OffloadedOptimizer b(options_for(GetParam(), dir_, "nvme-b"), groups);
  b.load(async_dir);
  EXPECT_EQ(b.step_count(), 2u);
  EXPECT_EQ(test::diff(test::read_all(b), at_save), "");
  // The steps after the save were not disturbed by it: 7 steps of which 3 and 4 gave only
  // "embed" match the same run without a save.
  OffloadedOptimizer c(options_for(GetParam(), dir_, "nvme-c"), groups);
  c.load(sync_dir);
  (void)c.step(std::span(&sg3.views[0], 1));
  (void)c.step(std::span(&sg4.views[0], 1));
  test::run_steps(c, 5, 7);
  EXPECT_EQ(test::diff(after, test::read_all(c)), "");
}

TEST_P(AsyncCheckpoint, ASecondSaveWaitsForTheFirstAndReplacesIt) {
  const auto groups = test::odd_groups();
  const std::string ckpt = dir_.file("ckpt");
  test::State at_second;
  {
    OffloadedOptimizer a(options_for(GetParam(), dir_), groups);
    test::init_all(a);
    test::run_steps(a, 1, 1);
    a.save_async(ckpt);
    test::run_steps(a, 2, 2);
    at_second = test::read_all(a);
    a.save_async(ckpt);  // waits for the first, which is then this optimizer's to remove
    test::run_steps(a, 3, 4);
    a.wait_save();
    a.wait_save();  // nothing in flight: returns at once
  }
  EXPECT_EQ(entries(ckpt), (std::vector<std::string>{"LATEST", latest_version(ckpt)}));
  OffloadedOptimizer b(options_for(GetParam(), dir_, "nvme-b"), groups);
  b.load(ckpt);
  EXPECT_EQ(b.step_count(), 2u);
  EXPECT_EQ(test::diff(test::read_all(b), at_second), "");
}

TEST_P(AsyncCheckpoint, DestructionFinishesTheSaveInFlight) {
  const auto groups = test::odd_groups();
  const std::string ckpt = dir_.file("ckpt");
  test::State at_save;
  {
    OffloadedOptimizer a(options_for(GetParam(), dir_), groups);
    test::init_all(a);
    test::run_steps(a, 1, 3);
    at_save = test::read_all(a);
    a.save_async(ckpt);
    test::run_steps(a, 4, 4);
  }
  OffloadedOptimizer b(options_for(GetParam(), dir_, "nvme-b"), groups);
  b.load(ckpt);
  EXPECT_EQ(b.step_count(), 3u);
  EXPECT_EQ(test::diff(test::read_all(b), at_save), "");
}

TEST_P(AsyncCheckpoint, RefusesAnEmptyDirectoryAndASaveInsideAStep) {
  const auto groups = test::odd_groups();
  OffloadedOptimizer a(options_for(GetParam(), dir_), groups);
  test::init_all(a);
  try {
    a.save_async("");
    FAIL() << "no UsageError";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()).find("OffloadedOptimizer::save_async"), 0u) << e.what();
  }
  a.begin_step();
  try {
    a.save_async(dir_.file("ckpt"));
    FAIL() << "no UsageError";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(), "OffloadedOptimizer::save_async inside an open step");
  }
  (void)a.end_step();
  EXPECT_FALSE(a.save_in_flight());
  EXPECT_FALSE(fs::exists(dir_.file("ckpt")));
}

// The saver keeps two records in flight (one read while the one before is written) and steps
// update records meanwhile: a step finds the records the saver holds (waited for), those it
// has not reached (copied) and those it wrote. Many records and two saves: the saver held in
// its first record while a step updates the first group (copies), then held for a while in
// its first record, the next one in flight, while a step updates that record (waits for it).
// Full steps follow back to back; each checkpoint equals save()'s bytes.
TEST_P(AsyncCheckpoint, RecordsInFlightWhileStepsUpdateThemAreSavedAsSaveWritesThem) {
  const std::vector<ParamGroupSpec> groups{
      {"head", 8 * test::kOddSubGroup}, {"body", 32 * test::kOddSubGroup + 5}, {"tail", 3}};
  OffloadedOptimizer a(options_for(GetParam(), dir_), groups);
  test::init_all(a);
  test::run_steps(a, 1, 1);
  std::uint64_t step = 1;
  auto full_steps = [&](int count) {  // back to back, while the save may still be writing
    for (int i = 0; i < count; ++i) {
      test::StepGrads sg(groups, ++step, ElementType::kF32);
      (void)a.step(sg.views);
    }
  };
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    const std::string sync_dir = dir_.file("sync" + std::to_string(round));
    const std::string async_dir = dir_.file("async" + std::to_string(round));
    const test::State at_save = test::read_all(a);
    a.save(sync_dir);
    SaverGate gate;
    std::promise<void> entered;
    if (round == 0) {
      // Held in its first record's "data" phase: a step over "head" alone copies its records
      // (the saver holds the last record and the one before, of "tail" and "body").
      gate.install(a);
    } else {
      // Held there for 300 ms, not until release(): the step below waits for the record the
      // saver holds, so it cannot return before the saver goes on.
      auto opened = gate.opened;
      auto first = std::make_shared<bool>(true);
      test_hooks::set_checkpoint_hook(
          a, [opened, first, &entered](std::string_view phase, std::uint64_t) {
            if (phase == "data" && *first) {
              *first = false;
              entered.set_value();
              (void)opened.wait_for(std::chrono::milliseconds(300));
            }
          });
    }
    a.save_async(async_dir);
    if (round == 0) {
      test::StepGrads head(groups, ++step, ElementType::kF32);
      const std::uint64_t copied = a.step(std::span(&head.views[0], 1)).snapshot_copy_bytes;
      EXPECT_GT(copied, 0u);
      EXPECT_EQ(copied % 4096, 0u);
      gate.release();
    } else {
      entered.get_future().wait();  // "tail", the last record, is written and not yet done
      test::StepGrads tail(groups, ++step, ElementType::kF32);
      const StepStats st = a.step(std::span(&tail.views[2], 1));
      EXPECT_GT(st.snapshot_wait_seconds, 0.0);
      EXPECT_EQ(st.snapshot_copy_bytes, 0u);
      gate.release();
    }
    full_steps(3);
    a.wait_save();
    test_hooks::set_checkpoint_hook(a, {});  // it refers to this round's `entered`
    expect_same_checkpoint(async_dir, sync_dir);
    // The next round saves this state again, from where the load puts the optimizer.
    a.load(async_dir);
    EXPECT_EQ(test::diff(test::read_all(a), at_save), "");
  }
}

// The commit's syncs start between steps; steps back to back leave no moment without one, and
// the save still ends (at a step's close) without wait_save. Without steps it ends by itself.
TEST_P(AsyncCheckpoint, CommitsWhileStepsRunBackToBackAndWithoutSteps) {
  const auto groups = test::odd_groups();
  const std::string ckpt = dir_.file("ckpt");
  test::State at_second;
  {  // the checkpoint directory is locked for `a` until it is gone
    OffloadedOptimizer a(options_for(GetParam(), dir_), groups);
    test::init_all(a);
    test::run_steps(a, 1, 1);
    a.save_async(ckpt);
    std::uint64_t t = 2;
    for (; a.save_in_flight() && t < 2000; ++t) test::run_steps(a, t, t);
    EXPECT_FALSE(a.save_in_flight()) << "still saving after " << t << " steps";
    a.wait_save();
    at_second = test::read_all(a);
    a.save_async(ckpt);
    for (int i = 0; a.save_in_flight() && i < 20000; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_FALSE(a.save_in_flight());
    a.wait_save();
  }
  OffloadedOptimizer b(options_for(GetParam(), dir_, "nvme-b"), groups);
  b.load(ckpt);
  EXPECT_EQ(test::diff(test::read_all(b), at_second), "");
}

INSTANTIATE_TEST_SUITE_P(Tiers, AsyncCheckpoint,
                         ::testing::Values(StateTier::kNvme, StateTier::kCpu),
                         [](const auto& p) { return std::string(state_tier_name(p.param)); });

// A failed write of the checkpoint file (the drive full): wait_save() throws it once, naming
// the checkpoint asked for and then the file, offset and length that failed (the new version's
// temporary state file); the half-written version is gone and the previous checkpoint stays
// current; the optimizer and its steps are untouched, and a later save works.
TEST(AsyncCheckpointFault, AFailedWriteIsReportedOnceAndLeavesThePreviousCheckpoint) {
  test::TestDir dir;
  const auto groups = test::odd_groups();
  const std::string ckpt = dir.file("ckpt");
  swap::FaultRule rule;
  rule.kind = swap::FaultKind::kError;
  rule.op = swap::IoOp::kWrite;
  rule.file = swap::FileId{1};  // the swap file is 0; the checkpoint file the next one
  rule.first_match = 8;         // the first save writes 8 records (one piece each); the next fails
  rule.times = 1;
  rule.err = ENOSPC;
  auto plan = std::make_shared<swap::FaultPlan>(std::vector<swap::FaultRule>{rule}, 1);
  OptimizerOptions o = options_for(StateTier::kNvme, dir);
  o.swap_checksums = false;
  o.io.faults = plan;
  OffloadedOptimizer a(o, groups);
  test::init_all(a);
  test::run_steps(a, 1, 1);
  a.save(ckpt);  // write 0 on file 1: passes
  const std::string previous = latest_version(ckpt);
  const test::State at_previous = test::read_all(a);
  a.save_async(ckpt);  // its first write fails
  test::run_steps(a, 2, 3);
  try {
    a.wait_save();
    FAIL() << "no IoError";
  } catch (const IoError& e) {
    const std::string text = e.what();
    EXPECT_EQ(e.code(), ErrorCode::kNoSpace) << text;
    EXPECT_EQ(text.rfind("save of checkpoint " + ckpt + ": write failed: " + ckpt + "/v", 0), 0u)
        << text;
    EXPECT_NE(text.find(": No space left on device"), std::string::npos) << text;
    EXPECT_TRUE(text.ends_with("(ENOSPC)")) << text;
    EXPECT_EQ(e.status().path().substr(e.status().path().size() - 14), ".tmp/state.bin") << text;
    EXPECT_NE(e.status().offset(), Status::kUnset) << text;
    EXPECT_NE(e.status().length(), Status::kUnset) << text;
    EXPECT_NE(text.find(e.status().path()), std::string::npos) << text;
    EXPECT_NE(text.find("offset="), std::string::npos) << text;
    EXPECT_NE(text.find("length="), std::string::npos) << text;
  }
  EXPECT_EQ(plan->injected_errors(), 1u);
  a.wait_save();  // reported once
  EXPECT_EQ(entries(ckpt), (std::vector<std::string>{"LATEST", previous}));
  // The previous checkpoint, read as load() would (a second optimizer cannot take the lock).
  EXPECT_FALSE(a.failed());
  const test::State now = test::read_all(a);
  a.load(ckpt);
  EXPECT_EQ(a.step_count(), 1u);
  EXPECT_EQ(test::diff(test::read_all(a), at_previous), "");
  // And a later save works.
  test::run_steps(a, 2, 3);
  EXPECT_EQ(test::diff(test::read_all(a), now), "");
  a.save_async(ckpt);
  a.wait_save();
  a.load(ckpt);
  EXPECT_EQ(a.step_count(), 3u);
  EXPECT_EQ(test::diff(test::read_all(a), now), "");
}

// A real full drive (a private tmpfs with room for one checkpoint of odd_groups, about 300 KB,
// and not two): save() and save_async() fail at the new version's preallocation, before a
// record is written, with kNoSpace naming the checkpoint asked for, then the temporary state
// file and the bytes it needed; nothing of theirs is left, and the previous checkpoint stays
// current and loads with its step.
TEST(AsyncCheckpointFault, AFullDriveNamesTheCheckpointAskedForAndKeepsThePreviousOne) {
  test::TestDir dir;
  const std::string mount = dir.subdir("small");
  const std::string ckpt = mount + "/ckpt";
  ZINF_EXPECT_IN_PRIVATE_TMPFS(mount, "448k", [&]() -> int {
    OffloadedOptimizer a(options_for(StateTier::kCpu, dir), test::odd_groups());
    test::init_all(a);
    test::run_steps(a, 1, 1);
    a.save(ckpt);
    const std::string previous = latest_version(ckpt);
    test::run_steps(a, 2, 2);
    const std::string head = "save of checkpoint " + ckpt + ": preallocate failed: " + ckpt + "/v";
    int code = 10;
    for (const bool async : {false, true}) {
      try {
        if (async) {
          a.save_async(ckpt);
          a.wait_save();
        } else {
          a.save(ckpt);
        }
        return code + 1;
      } catch (const IoError& e) {
        const std::string text = e.what();
        if (e.code() != ErrorCode::kNoSpace) return code + 2;
        if (text.rfind(head, 0) != 0) return code + 3;
        if (text.find(".tmp/state.bin offset=0 length=") == std::string::npos) return code + 4;
        if (!text.ends_with("(ENOSPC)")) return code + 5;
      }
      if (entries(ckpt) != std::vector<std::string>{"LATEST", previous}) return code + 6;
      code += 10;
    }
    a.load(ckpt);
    if (a.step_count() != 1u) return 40;
    return 0;
  });
}

// A second save_async after a failed one throws that failure and starts nothing.
TEST(AsyncCheckpointFault, ANewSaveAfterAFailedOneThrowsTheFailure) {
  test::TestDir dir;
  const auto groups = test::odd_groups();
  swap::FaultRule rule;
  rule.kind = swap::FaultKind::kError;
  rule.op = swap::IoOp::kWrite;
  rule.file = swap::FileId{0};  // no swap file on the cpu tier: the checkpoint file is the first
  rule.err = ENOSPC;
  auto plan = std::make_shared<swap::FaultPlan>(std::vector<swap::FaultRule>{rule}, 1);
  OptimizerOptions o = options_for(StateTier::kCpu, dir);
  o.io.faults = plan;
  OffloadedOptimizer a(o, groups);
  test::init_all(a);
  a.save_async(dir.file("ckpt"));
  try {
    a.save_async(dir.file("ckpt"));
    FAIL() << "no IoError";
  } catch (const IoError& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNoSpace) << e.what();
  }
  EXPECT_FALSE(a.save_in_flight());
  EXPECT_EQ(entries(dir.file("ckpt")), std::vector<std::string>{});
}

// A process killed while its asynchronous save writes (SIGKILL from the save's own thread, in a
// forked child that keeps stepping) leaves the previous checkpoint loadable byte for byte; one
// killed after the LATEST switch leaves the new one. The parent holds no optimizer when it
// forks (see checkpoint_test's kill tests).
struct KillPoint {
  const char* phase;
  bool expect_new;
};

void PrintTo(const KillPoint& kp, std::ostream* os) { *os << kp.phase; }

class AsyncCheckpointKill : public ::testing::TestWithParam<KillPoint> {};

TEST_P(AsyncCheckpointKill, LeavesALoadableCheckpoint) {
  const KillPoint kp = GetParam();
  test::TestDir dir;
  const auto groups = test::odd_groups();
  const std::string ckpt = dir.file("ckpt");
  const auto [old_state, new_state] =
      test::checkpoint_then_step(options_for(StateTier::kNvme, dir), groups, ckpt);
  const int status = test::wait_status_of_child([&] {
    OffloadedOptimizer b(options_for(StateTier::kNvme, dir), groups);
    test_hooks::set_checkpoint_hook(b, [kp](std::string_view phase, std::uint64_t) {
      if (phase == kp.phase) ::raise(SIGKILL);
    });
    b.load(ckpt);
    test::StepGrads sg(groups, 3, ElementType::kF32);
    (void)b.step(sg.views);
    b.save_async(ckpt);
    for (std::uint64_t t = 4; t < 8; ++t) {
      test::StepGrads more(groups, t, ElementType::kF32);
      (void)b.step(more.views);
    }
    b.wait_save();
  });
  ASSERT_TRUE(WIFSIGNALED(status)) << "child exited with status " << WEXITSTATUS(status);
  EXPECT_EQ(WTERMSIG(status), SIGKILL);

  OffloadedOptimizer c(options_for(StateTier::kNvme, dir), groups);
  c.load(ckpt);
  EXPECT_EQ(c.step_count(), kp.expect_new ? 3u : 2u);
  EXPECT_EQ(test::diff(test::read_all(c), kp.expect_new ? new_state : old_state), "");
}

INSTANTIATE_TEST_SUITE_P(Phases, AsyncCheckpointKill,
                         ::testing::Values(KillPoint{"data", false}, KillPoint{"synced", false},
                                           KillPoint{"committed", false},
                                           KillPoint{"latest", true}),
                         [](const auto& p) { return std::string(p.param.phase); });

}  // namespace
}  // namespace zinf::optim
