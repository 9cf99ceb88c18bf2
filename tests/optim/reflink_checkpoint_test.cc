// SPDX-License-Identifier: Apache-2.0
// OffloadedOptimizer::save_async by reflink: where the swap files and the checkpoint share a
// file system that clones ranges (XFS, btrfs), the snapshot is a clone of the records taken
// at the call. The checkpoint then equals the state at the call bitwise (and save()'s files
// byte for byte) however many steps overwrite the swap files before the save reads it, the
// steps copy nothing for the save, a kill -9 at any phase leaves a loadable checkpoint, and
// a clone that cannot be made (another file system, ext4, tmpfs, kCpu) falls back to the
// streaming save with one log line saying why.
//
// The reflink tests need a directory on such a file system: ZINF_TEST_REFLINK_DIR (set by
// scripts/test.sh, as root, to a loop-mounted XFS image). Without it they skip, saying why;
// the fallback tests run everywhere.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "optimizer_test_util.h"
#include "support/corrupt_swap_file.h"
#include "support/log_capture.h"
#include "support/test_dir.h"
#include "zinf/common/error.h"
#include "zinf/optim/optimizer.h"
#include "zinf/optim/testing.h"

namespace zinf::optim {
namespace {

using test::expect_same_checkpoint;
using test::latest_version;
using test::read_file;

bool any_line_has(const test::LogCapture& log, const std::string& text) {
  const auto lines = log.lines();
  return std::any_of(lines.begin(), lines.end(),
                     [&](const std::string& l) { return l.find(text) != std::string::npos; });
}

// The reflink directory, or a skip saying why there is none.
#define ZINF_REFLINK_DIR_OR_SKIP(var)     \
  std::string var;                        \
  {                                       \
    std::string why;                      \
    var = test::reflink_test_dir(why);    \
    if (var.empty()) GTEST_SKIP() << why; \
  }

// Holds the save's thread at its first "data" phase (its first record read back and checked)
// until release(), so that the steps the test runs meanwhile overwrite every record in the
// swap files before the save reads the rest of the clone.
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

TEST(ReflinkCheckpoint, TheCloneIsTheStateAtTheCallAndStepsCopyNothing) {
  ZINF_REFLINK_DIR_OR_SKIP(parent);
  test::TestDir dir(parent);
  const auto groups = test::odd_groups();
  const std::string sync_dir = dir.file("sync");
  const std::string async_dir = dir.file("async");
  test::State at_save;
  test::State after;
  {
    OffloadedOptimizer a(test::checkpoint_options(StateTier::kNvme, dir), groups);
    test::init_all(a);
    test::run_steps(a, 1, 2);
    at_save = test::read_all(a);
    a.save(sync_dir);
    EXPECT_EQ(a.last_save_snapshot(), SaveSnapshot::kNone);

    SaverGate gate;
    gate.install(a);
    test::LogCapture log(LogLevel::kInfo);
    a.save_async(async_dir);
    EXPECT_EQ(a.last_save_snapshot(), SaveSnapshot::kReflink);
    EXPECT_TRUE(any_line_has(log, "snapshot by reflink")) << "no log line";
    // Every record is overwritten in the swap files while the save has read one: the steps
    // neither copy nor wait, and the clone keeps the bytes of the call.
    for (std::uint64_t t = 3; t <= 5; ++t) {
      test::StepGrads sg(groups, t, ElementType::kF32);
      const StepStats s = a.step(sg.views);
      EXPECT_EQ(s.snapshot_copy_bytes, 0u) << "step " << t;
      EXPECT_EQ(s.snapshot_wait_seconds, 0.0) << "step " << t;
    }
    EXPECT_TRUE(a.save_in_flight());
    gate.release();
    a.wait_save();
    after = test::read_all(a);
  }
  expect_same_checkpoint(async_dir, sync_dir);
  OffloadedOptimizer b(test::checkpoint_options(StateTier::kNvme, dir, "nvme-b"), groups);
  b.load(async_dir);
  EXPECT_EQ(b.step_count(), 2u);
  EXPECT_EQ(test::diff(test::read_all(b), at_save), "");
  // And the steps after the save are those of a run without one.
  OffloadedOptimizer c(test::checkpoint_options(StateTier::kNvme, dir, "nvme-c"), groups);
  c.load(sync_dir);
  test::run_steps(c, 3, 5);
  EXPECT_EQ(test::diff(test::read_all(c), after), "");
}

// Saves one after another into one directory, each a clone: each replaces the last and loads
// as the state at its call.
TEST(ReflinkCheckpoint, RepeatedSavesEachLoadAsTheirStep) {
  ZINF_REFLINK_DIR_OR_SKIP(parent);
  test::TestDir dir(parent);
  const auto groups = test::odd_groups();
  const std::string ckpt = dir.file("ckpt");
  test::State at_second;
  {
    OffloadedOptimizer a(test::checkpoint_options(StateTier::kNvme, dir), groups);
    test::init_all(a);
    test::run_steps(a, 1, 1);
    test::LogCapture log;  // notices only
    a.save_async(ckpt);
    EXPECT_EQ(a.last_save_snapshot(), SaveSnapshot::kReflink);
    test::run_steps(a, 2, 2);
    at_second = test::read_all(a);
    a.save_async(ckpt);
    EXPECT_EQ(a.last_save_snapshot(), SaveSnapshot::kReflink);
    test::run_steps(a, 3, 4);
    // The path did not change: the second save's line is not a notice.
    const auto lines = log.lines();
    EXPECT_EQ(
        std::count_if(lines.begin(), lines.end(),
                      [](const std::string& l) { return l.find("snapshot by reflink") != l.npos; }),
        1);
  }  // the destructor finishes the save
  EXPECT_EQ(test::entries(ckpt), (std::vector<std::string>{"LATEST", latest_version(ckpt)}));
  OffloadedOptimizer b(test::checkpoint_options(StateTier::kNvme, dir, "nvme-b"), groups);
  b.load(ckpt);
  EXPECT_EQ(b.step_count(), 2u);
  EXPECT_EQ(test::diff(test::read_all(b), at_second), "");
}

// Swap files on the reflink file system, the checkpoint on another (EXDEV): streamed, with
// the reason logged, and the checkpoint still the state at the call.
TEST(ReflinkCheckpoint, AnotherFileSystemFallsBackToStreaming) {
  ZINF_REFLINK_DIR_OR_SKIP(parent);
  test::TestDir swap_dir(parent);
  test::TestDir other;  // ZINF_TEST_DIR or the temp directory
  struct stat a {
  }, b{};
  ASSERT_EQ(::stat(swap_dir.path().c_str(), &a), 0);
  ASSERT_EQ(::stat(other.path().c_str(), &b), 0);
  if (a.st_dev == b.st_dev) GTEST_SKIP() << "the test directory is on the reflink file system";
  const auto groups = test::odd_groups();
  const std::string ckpt = other.file("ckpt");
  test::State at_save;
  {
    OffloadedOptimizer o(test::checkpoint_options(StateTier::kNvme, swap_dir), groups);
    test::init_all(o);
    test::run_steps(o, 1, 2);
    at_save = test::read_all(o);
    test::LogCapture log;
    o.save_async(ckpt);
    EXPECT_EQ(o.last_save_snapshot(), SaveSnapshot::kStreamed);
    EXPECT_TRUE(any_line_has(log,
                             "notice: checkpoint: streamed, not snapshot by reflink: "
                             "FICLONERANGE from "))
        << (log.lines().empty() ? "no log line" : log.lines().front());
    EXPECT_TRUE(any_line_has(log, std::strerror(EXDEV))) << "not EXDEV";
    test::run_steps(o, 3, 4);
    o.wait_save();
  }
  OffloadedOptimizer c(test::checkpoint_options(StateTier::kNvme, swap_dir, "nvme-c"), groups);
  c.load(ckpt);
  EXPECT_EQ(c.step_count(), 2u);
  EXPECT_EQ(test::diff(test::read_all(c), at_save), "");
}

// Runs everywhere: the path taken where the tests' own directory is (ext4 or tmpfs here:
// streamed, steps copying records as before; reflink where it is XFS or btrfs) is the one
// its file system allows, said in one log line, and the checkpoint is right either way.
TEST(ReflinkCheckpoint, TakesThePathTheFileSystemAllows) {
  test::TestDir dir;
  std::string why;
  const bool reflink = test::supports_reflink(dir.path(), why);
  const auto groups = test::odd_groups();
  const std::string ckpt = dir.file("ckpt");
  test::State at_save;
  {
    OffloadedOptimizer a(test::checkpoint_options(StateTier::kNvme, dir), groups);
    test::init_all(a);
    test::run_steps(a, 1, 2);
    at_save = test::read_all(a);
    test::LogCapture log(LogLevel::kInfo);
    SaverGate gate;  // the save has read or written one record when step 3 comes
    gate.install(a);
    a.save_async(ckpt);
    EXPECT_EQ(a.last_save_snapshot(), reflink ? SaveSnapshot::kReflink : SaveSnapshot::kStreamed)
        << why;
    EXPECT_TRUE(any_line_has(log, reflink ? "notice: checkpoint: snapshot by reflink"
                                          : "notice: checkpoint: streamed, not snapshot by "
                                            "reflink: FICLONERANGE from "));
    // The first group only: streaming goes from the last record down, and the gate holds
    // it on the last record, which a step would wait for.
    test::StepGrads sg(groups, 3, ElementType::kF32);
    const StepStats s = a.step(std::span(&sg.views[0], 1));
    // Streaming: the records the save has not read yet are copied before the step updates
    // them.
    if (reflink) {
      EXPECT_EQ(s.snapshot_copy_bytes, 0u);
    } else {
      EXPECT_GT(s.snapshot_copy_bytes, 0u);
    }
    gate.release();
    a.wait_save();
  }
  OffloadedOptimizer b(test::checkpoint_options(StateTier::kNvme, dir, "nvme-b"), groups);
  b.load(ckpt);
  EXPECT_EQ(b.step_count(), 2u);
  EXPECT_EQ(test::diff(test::read_all(b), at_save), "");
}

// checkpoint_reflink = false streams also where a clone would work, and says so.
TEST(ReflinkCheckpoint, SwitchedOffItStreams) {
  ZINF_REFLINK_DIR_OR_SKIP(parent);
  test::TestDir dir(parent);
  const auto groups = test::odd_groups();
  OptimizerOptions o = test::checkpoint_options(StateTier::kNvme, dir);
  o.checkpoint_reflink = false;
  OffloadedOptimizer a(o, groups);
  test::init_all(a);
  test::run_steps(a, 1, 1);
  const test::State at_save = test::read_all(a);
  test::LogCapture log;
  a.save_async(dir.file("ckpt"));
  EXPECT_EQ(a.last_save_snapshot(), SaveSnapshot::kStreamed);
  EXPECT_TRUE(any_line_has(log,
                           "streamed, not snapshot by reflink: "
                           "OptimizerOptions::checkpoint_reflink is off"));
  test::run_steps(a, 2, 2);
  a.load(dir.file("ckpt"));  // waits for the save
  EXPECT_EQ(test::diff(test::read_all(a), at_save), "");
}

// A byte that changed in a swap file is cloned with the rest; the save's check against the
// store's unit checksums fails it (kCorrupt, from wait_save) and no version is left: corrupt
// bytes are never saved, as on the streaming path.
TEST(ReflinkCheckpoint, ACorruptRecordFailsTheSave) {
  ZINF_REFLINK_DIR_OR_SKIP(parent);
  test::TestDir dir(parent);
  const auto groups = test::odd_groups();
  const std::string ckpt = dir.file("ckpt");
  OffloadedOptimizer a(test::checkpoint_options(StateTier::kNvme, dir), groups);
  test::init_all(a);
  test::run_steps(a, 1, 1);
  (void)test::flip_swap_file_byte(dir.file("nvme"), 100);
  a.save_async(ckpt);
  EXPECT_EQ(a.last_save_snapshot(), SaveSnapshot::kReflink);
  try {
    a.wait_save();
    FAIL() << "no IoError";
  } catch (const IoError& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCorrupt) << e.what();
  }
  EXPECT_EQ(test::entries(ckpt), std::vector<std::string>{});
}

TEST(ReflinkCheckpoint, TheCpuTierStreamsAndSaysWhy) {
  test::TestDir dir;
  const auto groups = test::odd_groups();
  OffloadedOptimizer a(test::checkpoint_options(StateTier::kCpu, dir), groups);
  test::init_all(a);
  test::LogCapture log;
  a.save_async(dir.file("ckpt"));
  EXPECT_EQ(a.last_save_snapshot(), SaveSnapshot::kStreamed);
  a.wait_save();
  EXPECT_TRUE(any_line_has(log, "streamed, not snapshot by reflink: the state is in memory"));
  // The same reason again is not repeated as a notice.
  a.save_async(dir.file("ckpt"));
  a.wait_save();
  const auto lines = log.lines();
  EXPECT_EQ(std::count_if(lines.begin(), lines.end(),
                          [](const std::string& l) { return l.find("streamed") != l.npos; }),
            1);
}

// A process killed during a save by reflink (SIGKILL from the save's hook, in a forked child
// that keeps stepping) leaves the previous checkpoint loadable byte for byte; one killed
// after the LATEST switch the new one. As async_checkpoint_test's kill tests, with the
// clone's own phase ("cloned": inside save_async, after the last clone) added.
struct KillPoint {
  const char* phase;
  bool expect_new;
};

void PrintTo(const KillPoint& kp, std::ostream* os) { *os << kp.phase; }

class ReflinkCheckpointKill : public ::testing::TestWithParam<KillPoint> {};

constexpr int kNotReflinked = 4;  // the child's exit status if its save streamed

TEST_P(ReflinkCheckpointKill, LeavesALoadableCheckpoint) {
  ZINF_REFLINK_DIR_OR_SKIP(parent);
  const KillPoint kp = GetParam();
  test::TestDir dir(parent);
  const auto groups = test::odd_groups();
  const std::string ckpt = dir.file("ckpt");
  const auto [old_state, new_state] =
      test::checkpoint_then_step(test::checkpoint_options(StateTier::kNvme, dir), groups, ckpt);
  const int status = test::wait_status_of_child([&] {
    OffloadedOptimizer b(test::checkpoint_options(StateTier::kNvme, dir), groups);
    test_hooks::set_checkpoint_hook(b, [kp](std::string_view phase, std::uint64_t) {
      if (phase == kp.phase) ::raise(SIGKILL);
    });
    b.load(ckpt);
    test::StepGrads sg(groups, 3, ElementType::kF32);
    (void)b.step(sg.views);
    b.save_async(ckpt);
    if (b.last_save_snapshot() != SaveSnapshot::kReflink) ::_exit(kNotReflinked);
    for (std::uint64_t t = 4; t < 8; ++t) {
      test::StepGrads more(groups, t, ElementType::kF32);
      (void)b.step(more.views);
    }
    b.wait_save();
  });
  ASSERT_TRUE(WIFSIGNALED(status)) << "child exited with status " << WEXITSTATUS(status)
                                   << (WEXITSTATUS(status) == kNotReflinked ? " (streamed)" : "");
  EXPECT_EQ(WTERMSIG(status), SIGKILL);

  OffloadedOptimizer c(test::checkpoint_options(StateTier::kNvme, dir), groups);
  c.load(ckpt);
  EXPECT_EQ(c.step_count(), kp.expect_new ? 3u : 2u);
  EXPECT_EQ(test::diff(test::read_all(c), kp.expect_new ? new_state : old_state), "");
}

INSTANTIATE_TEST_SUITE_P(Phases, ReflinkCheckpointKill,
                         ::testing::Values(KillPoint{"cloned", false}, KillPoint{"data", false},
                                           KillPoint{"synced", false},
                                           KillPoint{"committed", false},
                                           KillPoint{"latest", true}),
                         [](const auto& p) { return std::string(p.param.phase); });

}  // namespace
}  // namespace zinf::optim
