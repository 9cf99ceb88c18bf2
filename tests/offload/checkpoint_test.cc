// SPDX-License-Identifier: Apache-2.0
// OffloadedOptimizer checkpoints: round trips (every byte, step counter, hyper-parameters,
// across tiers), resuming continues bitwise identical to an uninterrupted run, a save replaces
// the previous version, corruption is detected (state file: kCorrupt naming file and offset;
// manifest), a mismatched layout is refused, and a process killed at any point of a save
// leaves a loadable checkpoint (the previous one until the LATEST switch, the new one after).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "optimizer_test_util.h"
#include "support/test_dir.h"
#include "zinf/common/error.h"
#include "zinf/offload/optimizer.h"

namespace zinf::offload {
namespace {

namespace fs = std::filesystem;

OptimizerOptions options_for(StateTier tier, const test::TestDir& dir) {
  OptimizerOptions o;
  o.tier = tier;
  o.sub_group_elements = test::kOddSubGroup;
  o.hyper = test::test_hyper();
  o.io.kind = swap::IoEngineKind::kThreads;
  o.io.queue_depth = 8;
  if (tier == StateTier::kNvme) o.directories = {dir.subdir("nvme")};
  return o;
}

std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::string latest_version(const std::string& ckpt) {
  std::ifstream in(ckpt + "/LATEST");
  std::string name;
  std::getline(in, name);
  return name;
}

class Checkpoint : public ::testing::TestWithParam<StateTier> {
 protected:
  test::TestDir dir_;
};

TEST_P(Checkpoint, RoundTripRestoresEveryByteTheStepAndTheHyperParameters) {
  const auto groups = test::odd_groups();
  const std::string ckpt = dir_.file("ckpt");
  test::State saved;
  {
    OffloadedOptimizer a(options_for(GetParam(), dir_), groups);
    test::init_all(a);
    test::run_steps(a, 1, 3);
    AdamParams hp = a.hyper();
    hp.lr = 0.1234567;  // a value with a long binary expansion survives exactly
    a.set_hyper(hp);
    a.save(ckpt);
    saved = test::read_all(a);
  }
  // Into both tiers: the checkpoint does not depend on where the state lived.
  for (StateTier tier : {StateTier::kCpu, StateTier::kNvme}) {
    OffloadedOptimizer b(options_for(tier, dir_), groups);
    b.load(ckpt);
    EXPECT_EQ(b.step_count(), 3u);
    EXPECT_EQ(b.hyper().lr, 0.1234567);
    EXPECT_EQ(b.hyper().weight_decay, test::test_hyper().weight_decay);
    EXPECT_EQ(b.hyper().mode, AdamMode::kAdamW);
    EXPECT_EQ(test::diff(test::read_all(b), saved), "") << state_tier_name(tier);
  }
}

TEST_P(Checkpoint, ResumingContinuesBitwiseIdenticalToAnUninterruptedRun) {
  const auto groups = test::odd_groups();
  const std::string ckpt = dir_.file("ckpt");
  OffloadedOptimizer a(options_for(GetParam(), dir_), groups);
  test::init_all(a);
  test::run_steps(a, 1, 2, DType::kBF16);
  a.save(ckpt);
  test::run_steps(a, 3, 5, DType::kBF16);

  // `a` holds ckpt (one owner per directory): b resumes from a copy, which loads as well.
  const std::string copy = dir_.file("copy");
  fs::copy(ckpt, copy, fs::copy_options::recursive);
  OffloadedOptimizer b(options_for(GetParam(), dir_), groups);
  b.load(copy);
  EXPECT_EQ(b.step_count(), 2u);
  test::run_steps(b, 3, 5, DType::kBF16);
  EXPECT_EQ(test::diff(test::read_all(b), test::read_all(a)), "");
  EXPECT_EQ(test::diff(test::read_all(b), test::reference_run(groups, test::test_hyper(), 5, DType::kBF16)), "");
}

TEST_P(Checkpoint, ASaveReplacesThePreviousVersion) {
  const std::string ckpt = dir_.file("ckpt");
  OffloadedOptimizer a(options_for(GetParam(), dir_), test::odd_groups());
  EXPECT_THROW(a.save(ckpt), UsageError);  // no state yet
  test::init_all(a);
  a.save(ckpt);
  const std::string first = latest_version(ckpt);
  // Files of the user's in the same directory are left alone.
  std::ofstream(ckpt + "/vacation.txt") << "not a checkpoint";
  test::run_steps(a, 1, 1);
  a.save(ckpt);
  const std::string second = latest_version(ckpt);
  EXPECT_NE(first, second);
  EXPECT_EQ(entries(ckpt), (std::vector<std::string>{"LATEST", second, "vacation.txt"}));
  EXPECT_EQ(entries(ckpt + "/" + second), (std::vector<std::string>{"manifest", "state.bin"}));
}

TEST_P(Checkpoint, CorruptStateIsDetectedNamingFileAndOffset) {
  const std::string ckpt = dir_.file("ckpt");
  {
    OffloadedOptimizer a(options_for(GetParam(), dir_), test::odd_groups());
    test::init_all(a);
    test::run_steps(a, 1, 1);
    a.save(ckpt);
  }
  // Flip one byte inside the second record (embed#1 at offset 53248).
  const std::string state = ckpt + "/" + latest_version(ckpt) + "/state.bin";
  {
    std::fstream f(state, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(53248 + 100);
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x10);
    f.seekp(53248 + 100);
    f.write(&c, 1);
  }
  OffloadedOptimizer b(options_for(GetParam(), dir_), test::odd_groups());
  test::init_all(b);
  try {
    b.load(ckpt);
    FAIL() << "a corrupt checkpoint loaded";
  } catch (const IoError& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCorrupt);
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("checkpoint load failed: " + state + " offset=53248 length=49188: CRC32C "
                         "mismatch in group 'embed' sub-group 1: stored ",
                         0),
              0u)
        << what;
  }
  // The load had begun to overwrite the state: the optimizer refuses to train on it.
  EXPECT_TRUE(b.failed());
  EXPECT_THROW(test::run_steps(b, 1, 1), EngineFailed);
}

TEST_P(Checkpoint, CorruptManifestIsRefusedBeforeTheStateIsTouched) {
  const std::string ckpt = dir_.file("ckpt");
  OffloadedOptimizer a(options_for(GetParam(), dir_), test::odd_groups());
  test::init_all(a);
  a.save(ckpt);
  const std::string manifest = ckpt + "/" + latest_version(ckpt) + "/manifest";
  std::string text;
  {
    std::ifstream in(manifest);
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  text.replace(text.find("step 0"), 6, "step 9");
  {
    std::ofstream out(manifest, std::ios::trunc);
    out << text;
  }
  try {
    a.load(ckpt);
    FAIL() << "a corrupt manifest loaded";
  } catch (const IoError& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCorrupt);
    EXPECT_EQ(std::string(e.what()).rfind("checkpoint load failed: " + manifest +
                                              ": bad manifest: CRC32C mismatch",
                                          0),
              0u)
        << e.what();
  }
  EXPECT_FALSE(a.failed());
  test::run_steps(a, 1, 1);
}

TEST_P(Checkpoint, MismatchedLayoutIsAUsageError) {
  const std::string ckpt = dir_.file("ckpt");
  {
    OffloadedOptimizer a(options_for(GetParam(), dir_), test::odd_groups());
    test::init_all(a);
    a.save(ckpt);
  }
  auto other = test::odd_groups();
  other[1].numel += 1;
  {
    OffloadedOptimizer b(options_for(GetParam(), dir_), other);
    EXPECT_THROW(b.load(ckpt), UsageError);
    EXPECT_FALSE(b.failed());
  }
  auto o = options_for(GetParam(), dir_);
  o.sub_group_elements = 5000;
  OffloadedOptimizer c(o, test::odd_groups());
  EXPECT_THROW(c.load(ckpt), UsageError);
  EXPECT_FALSE(c.failed());
}

TEST_P(Checkpoint, MissingCheckpointIsNotFound) {
  OffloadedOptimizer a(options_for(GetParam(), dir_), test::odd_groups());
  // No directory, then a directory without LATEST: each error names what is missing.
  const std::string empty = dir_.subdir("empty");
  for (const auto& [load_from, missing] :
       {std::pair{dir_.file("nothing-here"), dir_.file("nothing-here")},
        std::pair{empty, empty + "/LATEST"}}) {
    try {
      a.load(load_from);
      ADD_FAILURE() << load_from << " loaded";
    } catch (const IoError& e) {
      EXPECT_EQ(e.code(), ErrorCode::kNotFound) << e.what();
      EXPECT_EQ(e.status().path(), missing) << e.what();
    }
  }
  EXPECT_FALSE(a.failed());
}

INSTANTIATE_TEST_SUITE_P(Tiers, Checkpoint, ::testing::Values(StateTier::kNvme, StateTier::kCpu),
                         [](const auto& p) { return std::string(state_tier_name(p.param)); });

// A save killed part way (SIGKILL from the test hook, in a forked child) leaves the previous
// checkpoint loadable, byte for byte, until LATEST is switched; after that the new one.
// The parent holds no optimizer (no threads) when it forks and the child builds its own, so
// the child may start threads (also under ThreadSanitizer, which refuses that only after a
// multi-threaded fork).
struct KillPoint {
  const char* phase;
  std::uint64_t after_bytes;  // for "data": kill once this many bytes were submitted
  bool expect_new;
};

void PrintTo(const KillPoint& kp, std::ostream* os) { *os << kp.phase << "@" << kp.after_bytes; }

class CheckpointKill : public ::testing::TestWithParam<KillPoint> {};

TEST_P(CheckpointKill, LeavesALoadableCheckpoint) {
  const KillPoint kp = GetParam();
  test::TestDir dir;
  const auto groups = test::odd_groups();
  const std::string ckpt = dir.file("ckpt");
  test::State old_state, new_state;
  {
    OffloadedOptimizer a(options_for(StateTier::kNvme, dir), groups);
    test::init_all(a);
    test::run_steps(a, 1, 2);
    a.save(ckpt);
    old_state = test::read_all(a);
    test::run_steps(a, 3, 3);
    new_state = test::read_all(a);
  }
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // Child: the same run from the checkpoint, then a save that dies at the kill point.
    try {
      auto o = options_for(StateTier::kNvme, dir);
      o.checkpoint_hook = [kp](std::string_view phase, std::uint64_t bytes) {
        if (phase == kp.phase && bytes >= kp.after_bytes) ::raise(SIGKILL);
      };
      OffloadedOptimizer b(o, groups);
      b.load(ckpt);
      test::StepGrads sg(groups, 3, DType::kF32);
      (void)b.step(sg.views);
      b.save(ckpt);
    } catch (...) {
      ::_exit(3);
    }
    ::_exit(0);  // the hook never fired
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status)) << "child exited with status " << WEXITSTATUS(status);
  EXPECT_EQ(WTERMSIG(status), SIGKILL);

  OffloadedOptimizer c(options_for(StateTier::kNvme, dir), groups);
  c.load(ckpt);
  EXPECT_EQ(c.step_count(), kp.expect_new ? 3u : 2u);
  EXPECT_EQ(test::diff(test::read_all(c), kp.expect_new ? new_state : old_state), "");
  // And the next save reclaims what the killed one left half written, and removes the
  // version c loaded. A complete version c neither wrote nor loaded stays (the killed
  // child's new one, or the one it had loaded when it died after switching LATEST): c
  // cannot tell it from another run's checkpoint.
  const std::vector<std::string> before = entries(ckpt);
  const std::string loaded = latest_version(ckpt);
  c.save(ckpt);
  std::vector<std::string> want{"LATEST", latest_version(ckpt)};
  for (const std::string& n : before) {
    if (n != "LATEST" && n != loaded && !n.ends_with(".tmp")) want.push_back(n);
  }
  std::sort(want.begin(), want.end());
  EXPECT_EQ(entries(ckpt), want);
  EXPECT_EQ(want.size(), kp.expect_new || std::string(kp.phase) == "committed" ? 3u : 2u);
}

INSTANTIATE_TEST_SUITE_P(
    Phases, CheckpointKill,
    ::testing::Values(KillPoint{"data", 1, false}, KillPoint{"data", 200000, false},
                      KillPoint{"synced", 0, false}, KillPoint{"committed", 0, false},
                      KillPoint{"latest", 0, true}),
    [](const auto& p) {
      return std::string(p.param.phase) + "_" + std::to_string(p.param.after_bytes);
    });

}  // namespace
}  // namespace zinf::offload
