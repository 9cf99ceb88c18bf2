// SPDX-License-Identifier: Apache-2.0
// OffloadedOptimizer checkpoints: round trips (every byte, step counter, hyper-parameters,
// each group's too, across tiers), resuming continues bitwise identical to an uninterrupted
// run, a checkpoint of format 1 (one set of hyper-parameters) still loads, a save replaces
// the previous version, corruption is detected (state file: kCorrupt naming file and offset;
// manifest), a mismatched layout is refused, and a process killed at any point of a save
// leaves a loadable checkpoint (the previous one until the LATEST switch, the new one after).
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "optimizer_test_util.h"
#include "support/log_capture.h"
#include "support/child_process.h"
#include "support/test_dir.h"
#include "zinf/common/error.h"
#include "zinf/optim/optimizer.h"
#include "zinf/swap/crc32c.h"
#include "zinf/swap/dir.h"
#include "zinf/optim/testing.h"

namespace zinf::optim {
namespace {

namespace fs = std::filesystem;

OptimizerOptions options_for(StateTier tier, const test::TestDir& dir) {
  return test::checkpoint_options(tier, dir);
}
using test::entries;
using test::latest_version;

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
    adam::AdamParams hp = a.hyper();
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
    EXPECT_EQ(b.hyper().mode, adam::AdamMode::kAdamW);
    EXPECT_EQ(test::diff(test::read_all(b), saved), "") << state_tier_name(tier);
  }
}

TEST_P(Checkpoint, ResumingContinuesBitwiseIdenticalToAnUninterruptedRun) {
  const auto groups = test::odd_groups();
  const std::string ckpt = dir_.file("ckpt");
  OffloadedOptimizer a(options_for(GetParam(), dir_), groups);
  test::init_all(a);
  test::run_steps(a, 1, 2, ElementType::kBF16);
  a.save(ckpt);
  test::run_steps(a, 3, 5, ElementType::kBF16);

  // `a` holds ckpt (one owner per directory): b resumes from a copy, which loads as well.
  const std::string copy = dir_.file("copy");
  fs::copy(ckpt, copy, fs::copy_options::recursive);
  OffloadedOptimizer b(options_for(GetParam(), dir_), groups);
  b.load(copy);
  EXPECT_EQ(b.step_count(), 2u);
  test::run_steps(b, 3, 5, ElementType::kBF16);
  EXPECT_EQ(test::diff(test::read_all(b), test::read_all(a)), "");
  EXPECT_EQ(test::diff(test::read_all(b),
                       test::reference_run(groups, test::test_hyper(), 5, ElementType::kBF16)),
            "");
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
  EXPECT_EQ(entries(ckpt + "/" + second),
            (std::vector<std::string>{"manifest", "run", "state.bin"}));
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
    EXPECT_EQ(what.rfind("checkpoint load failed: " + state +
                             " offset=53248 length=49188: CRC32C "
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
    EXPECT_EQ(std::string(e.what()).rfind(
                  "checkpoint load failed: " + manifest + ": bad manifest: CRC32C mismatch", 0),
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

TEST_P(Checkpoint, PerGroupHyperParametersRoundTripAndResumeBitwise) {
  const auto groups = test::groups_with_own_hyper();
  const std::string ckpt = dir_.file("ckpt");
  OffloadedOptimizer a(options_for(GetParam(), dir_), groups);
  test::init_all(a);
  test::run_steps(a, 1, 2);
  adam::AdamParams embed = test::test_hyper();
  embed.lr = 0.1234567;  // a value with a long binary expansion survives exactly
  embed.beta2 = 0.95;
  embed.mode = adam::AdamMode::kAdam;
  a.set_hyper(0, embed);
  a.save(ckpt);
  test::run_steps(a, 3, 4);

  // b is built without sets of its own and with other defaults: the checkpoint's replace them.
  const std::string copy = dir_.file("copy");
  fs::copy(ckpt, copy, fs::copy_options::recursive);
  auto o = options_for(GetParam(), dir_);
  o.hyper.lr = 0.5;
  OffloadedOptimizer b(o, test::odd_groups());
  b.load(copy);
  EXPECT_EQ(b.step_count(), 2u);
  EXPECT_TRUE(test::same_hyper(b.hyper(), test::test_hyper()));
  EXPECT_TRUE(test::same_hyper(b.hyper(0), embed));
  for (std::size_t g = 1; g < groups.size(); ++g) {
    EXPECT_TRUE(test::same_hyper(b.hyper(g), *groups[g].hyper)) << "group " << g;
  }
  test::run_steps(b, 3, 4);
  EXPECT_EQ(test::diff(test::read_all(b), test::read_all(a)), "");
  EXPECT_EQ(test::diff(test::read_all(b), test::reference_run_with(
                                              groups,
                                              [&](std::size_t g, std::uint64_t t) {
                                                return g == 0 && t >= 3 ? embed
                                                                        : groups[g].hyper.value_or(
                                                                              test::test_hyper());
                                              },
                                              4, ElementType::kF32)),
            "");
}

std::string hex32(std::uint32_t v) {
  char b[16];
  std::snprintf(b, sizeof b, "%08x", v);
  return b;
}

// A manifest's text: `body` and its closing line, the CRC32C of the body.
std::string signed_manifest(const std::string& body) {
  return body + "crc32c " +
         hex32(swap::crc32c(std::as_bytes(std::span<const char>(body.data(), body.size())))) + "\n";
}

// A checkpoint as zinf wrote it before hyper-parameters per group (manifest format 1: one set,
// in the header), built here by that format's rules from a given state rather than by today's
// writer. The rules: LATEST names "v<step, 12 digits>-<pid>-<hex>"; state.bin holds each
// sub-group's record [params | m | v] padded to 4096 bytes (the cpu tier's alignment) one after
// the other; the manifest's lines are as below, values of doubles in %a, the CRC32C of each
// record's unpadded bytes and, last, of the text before the crc32c line. (Checked against a
// checkpoint the format-1 code wrote for the same state: the same manifest, byte for byte.)
void write_format1_checkpoint(const std::string& ckpt, const std::vector<ParamGroupSpec>& groups,
                              std::uint64_t sub_group, std::uint64_t step,
                              const adam::AdamParams& hp, const test::State& state) {
  auto hex = [](double v) {
    char b[64];
    std::snprintf(b, sizeof b, "%a", v);
    return std::string(b);
  };
  constexpr std::uint64_t kAlign = 4096;
  std::string data;
  std::ostringstream records;
  std::size_t record_count = 0;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    for (std::uint64_t off = 0, s = 0; off < groups[g].numel; off += sub_group, ++s) {
      const std::uint64_t n = std::min(sub_group, groups[g].numel - off);
      std::string rec;
      for (const auto* a : {&state.p[g], &state.m[g], &state.v[g]}) {
        rec.append(reinterpret_cast<const char*>(a->data() + off), n * sizeof(float));
      }
      const std::uint32_t crc =
          swap::crc32c(std::as_bytes(std::span<const char>(rec.data(), rec.size())));
      const std::uint64_t padded = (rec.size() + kAlign - 1) / kAlign * kAlign;
      records << "record " << g << ' ' << s << ' ' << n << ' ' << data.size() << ' ' << padded
              << ' ' << hex32(crc) << '\n';
      rec.resize(padded, '\0');
      data += rec;
      ++record_count;
    }
  }
  std::ostringstream o;
  o << "zinf-optimizer-checkpoint 1\ntier cpu\nstep " << step << "\nlr " << hex(hp.lr) << "\nbeta1 "
    << hex(hp.beta1) << "\nbeta2 " << hex(hp.beta2) << "\neps " << hex(hp.eps) << "\nweight_decay "
    << hex(hp.weight_decay) << "\ngrad_scale " << hex(hp.grad_scale) << "\nbias_correction "
    << (hp.bias_correction ? 1 : 0) << "\nmode "
    << (hp.mode == adam::AdamMode::kAdamW ? "adamw" : "adam") << "\nsub_group_elements "
    << sub_group << "\ngroups " << groups.size() << '\n';
  for (std::size_t g = 0; g < groups.size(); ++g) {
    o << "group " << g << ' ' << groups[g].numel << ' ' << groups[g].name << '\n';
  }
  o << "records " << record_count << '\n' << records.str();
  const std::string body = o.str();
  const std::string manifest = signed_manifest(body);

  char version[64];
  std::snprintf(version, sizeof version, "v%012llu-1-0123456789abcdef",
                static_cast<unsigned long long>(step));
  fs::create_directories(ckpt + "/" + version);
  std::ofstream(ckpt + "/" + version + "/state.bin", std::ios::binary) << data;
  std::ofstream(ckpt + "/" + version + "/manifest", std::ios::binary) << manifest;
  std::ofstream(ckpt + "/LATEST") << version << '\n';
}

TEST_P(Checkpoint, AFormat1CheckpointLoadsWithItsOneSetForEveryGroup) {
  const auto groups = test::odd_groups();
  // Any state will do (the checkpoint is not the result of a run): stamped values, v >= 0.
  test::State state;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    state.p.push_back(test::initial_params(g, groups[g].numel));
    state.m.push_back(test::grads_f32(g, 100, groups[g].numel));
    state.v.push_back(test::grads_f32(g, 200, groups[g].numel));
    for (float& x : state.v.back()) x *= x;
  }
  adam::AdamParams hp = test::test_hyper();
  hp.lr = 0.1234567;
  hp.beta1 = 0.8;
  hp.weight_decay = 0.03;
  const std::string ckpt = dir_.file("ckpt");
  write_format1_checkpoint(ckpt, groups, test::kOddSubGroup, 7, hp, state);

  // Built with sets of its own per group: the checkpoint's one set replaces them all.
  OffloadedOptimizer b(options_for(GetParam(), dir_), test::groups_with_own_hyper());
  b.load(ckpt);
  EXPECT_FALSE(b.failed());
  EXPECT_EQ(b.step_count(), 7u);
  EXPECT_TRUE(test::same_hyper(b.hyper(), hp));
  for (std::size_t g = 0; g < groups.size(); ++g) {
    EXPECT_TRUE(test::same_hyper(b.hyper(g), hp)) << "group " << g;
  }
  EXPECT_EQ(test::diff(test::read_all(b), state), "");

  // The next step is step 8 of the plain kernel with that set, from that state.
  test::run_steps(b, 8, 8);
  adam::CpuAdam adam;
  test::StepGrads sg(groups, 8, ElementType::kF32);
  adam::AdamParams hp8 = hp;
  hp8.step = 8;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    adam.step(hp8, state.p[g], state.m[g], state.v[g], sg.views[g].grads);
  }
  EXPECT_EQ(test::diff(test::read_all(b), state), "");

  // Saving writes today's format, which loads with the same sets.
  b.save(ckpt);
  OffloadedOptimizer c(options_for(GetParam(), dir_), groups);
  const std::string copy = dir_.file("copy");
  fs::copy(ckpt, copy, fs::copy_options::recursive);
  c.load(copy);
  for (std::size_t g = 0; g < groups.size(); ++g) EXPECT_TRUE(test::same_hyper(c.hyper(g), hp));
  EXPECT_EQ(test::diff(test::read_all(c), state), "");
}

// A manifest that passes its CRC but holds a group's set out of range (or a format this code
// does not know) is refused before any state changes.
TEST_P(Checkpoint, ABadGroupSetOrAnUnknownFormatIsRefusedBeforeTheStateIsTouched) {
  const std::string ckpt = dir_.file("ckpt");
  const auto groups = test::groups_with_own_hyper();
  OffloadedOptimizer a(options_for(GetParam(), dir_), groups);
  test::init_all(a);
  a.save(ckpt);
  test::run_steps(a, 1, 1);
  const test::State before = test::read_all(a);
  const std::string manifest = ckpt + "/" + latest_version(ckpt) + "/manifest";
  std::string text;
  {
    std::ifstream in(manifest);
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  const std::string body = text.substr(0, text.rfind("crc32c "));
  auto write_manifest = [&](const std::string& new_body) {
    std::ofstream(manifest, std::ios::trunc) << signed_manifest(new_body);
  };

  // Group 2's learning rate, the first value on its line, becomes -1.
  std::string bad = body;
  const std::size_t lr_at = bad.find("\nhyper 2 ") + 9;
  bad.replace(lr_at, bad.find(' ', lr_at) - lr_at, "-0x1p+0");
  write_manifest(bad);
  try {
    a.load(ckpt);
    ADD_FAILURE() << "loaded lr -1";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("OffloadedOptimizer: group 'bias': lr must be in ", 0),
              0u)
        << e.what();
  }

  std::string future = body;
  future.replace(0, future.find('\n'), "zinf-optimizer-checkpoint 4");
  write_manifest(future);
  try {
    a.load(ckpt);
    ADD_FAILURE() << "loaded format 4";
  } catch (const IoError& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCorrupt);
    EXPECT_NE(std::string(e.what()).find("bad manifest: unsupported format version 4"),
              std::string::npos)
        << e.what();
  }

  EXPECT_FALSE(a.failed());
  EXPECT_EQ(a.step_count(), 1u);
  EXPECT_TRUE(test::same_hyper(a.hyper(2), *groups[2].hyper));
  EXPECT_EQ(test::diff(test::read_all(a), before), "");
}

// ---- Files: nothing outside zinf's own is touched, one owner per directory ----------------

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Files outside the checkpoint directory that planted links point at: must never change.
struct Outside {
  test::TestDir dir;
  std::string file = dir.file("victim");
  std::string subdir = dir.subdir("victim-dir");
  Outside() { std::ofstream(file) << "precious"; }
  void expect_untouched() const {
    EXPECT_EQ(read_text(file), "precious");
    EXPECT_TRUE(fs::is_empty(subdir)) << subdir << " was written into";
    EXPECT_EQ(entries(dir.path()), (std::vector<std::string>{"victim", "victim-dir"}));
  }
};

// Runs `fn` on another thread and returns the status of the IoError it threw (nothing if it
// did not throw). If it has not returned within 10 s it is blocked on one of `fifos`: the
// test fails, and each FIFO is opened from the other side, which lets a blocked open return,
// held for a while (a writer's bytes fit in the pipe) and closed (a reader sees the end).
std::optional<Status> io_error_within_10s(const std::function<void()>& fn,
                                          const std::vector<std::string>& fifos) {
  auto result = std::async(std::launch::async, [&]() -> std::optional<Status> {
    try {
      fn();
    } catch (const IoError& e) {
      return e.status();
    }
    return std::nullopt;
  });
  if (result.wait_for(std::chrono::seconds(10)) == std::future_status::timeout) {
    ADD_FAILURE() << "blocked for 10 s (on a FIFO?)";
    std::vector<int> held;
    for (const auto& f : fifos) held.push_back(::open(f.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC));
    result.wait_for(std::chrono::seconds(2));
    for (int fd : held) {
      if (fd >= 0) ::close(fd);
    }
  }
  return result.get();
}

OptimizerOptions cpu_options(const test::TestDir& dir) { return options_for(StateTier::kCpu, dir); }

class CheckpointFiles : public ::testing::Test {
 protected:
  // A checkpoint of an optimizer at step 1 in `ckpt`, written by an optimizer that is gone.
  test::State save_one(const std::string& ckpt) {
    OffloadedOptimizer a(cpu_options(dir_), test::odd_groups());
    test::init_all(a);
    test::run_steps(a, 1, 1);
    a.save(ckpt);
    return test::read_all(a);
  }
  test::TestDir dir_;
};

// Links at every name a save used to write through (LATEST, LATEST.tmp, the version
// directories' old predictable names v<step>-<pid>-<n>.tmp) are replaced or left alone,
// never followed; the checkpoint is complete and loads.
TEST_F(CheckpointFiles, SaveNeverFollowsALinkAtAnyName) {
  Outside out;
  const std::string ckpt = dir_.subdir("ckpt");
  ASSERT_EQ(::symlink(out.file.c_str(), (ckpt + "/LATEST").c_str()), 0);
  ASSERT_EQ(::symlink(out.file.c_str(), (ckpt + "/LATEST.tmp").c_str()), 0);
  const std::string pid = std::to_string(::getpid());
  for (int n = 0; n < 64; ++n) {
    const std::string old_name = ckpt + "/v000000000001-" + pid + "-" + std::to_string(n);
    ASSERT_EQ(::symlink(out.subdir.c_str(), (old_name + ".tmp").c_str()), 0);
  }
  const test::State saved = save_one(ckpt);
  out.expect_untouched();
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(ckpt + "/LATEST")));
  EXPECT_TRUE(fs::is_symlink(ckpt + "/LATEST.tmp")) << "not a name zinf gives: left alone";
  OffloadedOptimizer b(cpu_options(dir_), test::odd_groups());
  b.load(ckpt);
  EXPECT_EQ(test::diff(test::read_all(b), saved), "");
  out.expect_untouched();
}

// Each name a load reads (LATEST, the version directory, manifest, state.bin) replaced by a
// link to a good copy outside: refused, naming the link, before the state is touched.
TEST_F(CheckpointFiles, LoadNeverFollowsALink) {
  const std::string ckpt = dir_.file("ckpt");
  const test::State saved = save_one(ckpt);
  const std::string version = latest_version(ckpt);
  test::TestDir outside;
  OffloadedOptimizer b(cpu_options(dir_), test::odd_groups());
  for (const std::string& rel :
       std::vector<std::string>{"LATEST", version, version + "/manifest", version + "/state.bin"}) {
    SCOPED_TRACE(rel);
    const std::string path = ckpt + "/" + rel;
    const std::string moved = outside.file("moved");
    fs::rename(path, moved);
    ASSERT_EQ(::symlink(moved.c_str(), path.c_str()), 0);
    try {
      b.load(ckpt);
      ADD_FAILURE() << "loaded through a link at " << path;
    } catch (const IoError& e) {
      EXPECT_EQ(e.status().path(), path) << e.what();
    }
    EXPECT_FALSE(b.failed());
    fs::remove(path);
    fs::rename(moved, path);
  }
  b.load(ckpt);
  EXPECT_EQ(test::diff(test::read_all(b), saved), "");
}

// A FIFO where a load expects LATEST, the manifest or state.bin fails the load at once,
// naming it, instead of blocking until someone writes to it.
TEST_F(CheckpointFiles, LoadRefusesAFifoWithoutBlocking) {
  const std::string ckpt = dir_.file("ckpt");
  const test::State saved = save_one(ckpt);
  const std::string version = latest_version(ckpt);
  test::TestDir outside;
  OffloadedOptimizer b(cpu_options(dir_), test::odd_groups());
  for (const std::string& rel :
       std::vector<std::string>{"LATEST", version + "/manifest", version + "/state.bin"}) {
    SCOPED_TRACE(rel);
    const std::string path = ckpt + "/" + rel;
    const std::string moved = outside.file("moved");
    fs::rename(path, moved);
    ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
    const auto err = io_error_within_10s([&] { b.load(ckpt); }, {path});
    ASSERT_TRUE(err.has_value()) << "a FIFO at " << path << " loaded";
    EXPECT_EQ(err->path(), path) << err->to_string();
    EXPECT_NE(err->to_string().find("a FIFO"), std::string::npos) << err->to_string();
    EXPECT_FALSE(b.failed());
    fs::remove(path);
    fs::rename(moved, path);
  }
  b.load(ckpt);
  EXPECT_EQ(test::diff(test::read_all(b), saved), "");
}

// What a save finds at LATEST: a FIFO is replaced (never opened), a directory is refused
// with an error naming LATEST and left as it was. FIFOs at the old fixed temporary name
// LATEST.tmp never block a save.
TEST_F(CheckpointFiles, SaveReplacesAFifoAtLatestAndRefusesADirectory) {
  const std::string ckpt = dir_.subdir("ckpt");
  ASSERT_EQ(::mkfifo((ckpt + "/LATEST").c_str(), 0600), 0);
  ASSERT_EQ(::mkfifo((ckpt + "/LATEST.tmp").c_str(), 0600), 0);
  OffloadedOptimizer a(cpu_options(dir_), test::odd_groups());
  test::init_all(a);
  auto err = io_error_within_10s([&] { a.save(ckpt); }, {ckpt + "/LATEST", ckpt + "/LATEST.tmp"});
  EXPECT_FALSE(err.has_value()) << err->to_string();
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(ckpt + "/LATEST")));

  fs::remove(ckpt + "/LATEST");
  fs::create_directory(ckpt + "/LATEST");
  std::ofstream(ckpt + "/LATEST/keep") << "mine";
  err = io_error_within_10s([&] { a.save(ckpt); }, {ckpt + "/LATEST.tmp"});
  ASSERT_TRUE(err.has_value()) << "a save replaced a directory";
  EXPECT_NE(err->to_string().find(ckpt + "/LATEST"), std::string::npos) << err->to_string();
  EXPECT_EQ(read_text(ckpt + "/LATEST/keep"), "mine");
  for (const auto& n : entries(ckpt)) EXPECT_FALSE(n.starts_with(".zinf-tmp-")) << n;
  EXPECT_FALSE(a.failed()) << "a failed save leaves the optimizer usable";
}

// A file planted inside the new version directory (under its unpredictable name; the test
// uses the hook to learn it) is refused, not written through, and the partial version removed.
TEST_F(CheckpointFiles, SaveRefusesFilesPlantedInItsNewVersion) {
  Outside out;
  const std::string ckpt = dir_.subdir("ckpt");
  for (const std::string planted : {"state.bin", "manifest"}) {
    SCOPED_TRACE(planted);
    const std::string phase = planted == "state.bin" ? "created" : "data";
    std::string where;
    OffloadedOptimizer a(cpu_options(dir_), test::odd_groups());
    test_hooks::set_checkpoint_hook(a, [&](std::string_view p, std::uint64_t) {
      if (p != phase || !where.empty()) return;
      for (const auto& n : entries(ckpt)) {
        if (n.ends_with(".tmp")) where = ckpt + "/" + n + "/" + planted;
      }
      ASSERT_EQ(::symlink(out.file.c_str(), where.c_str()), 0) << where;
    });
    test::init_all(a);
    try {
      a.save(ckpt);
      ADD_FAILURE() << "saved over a planted " << planted;
    } catch (const IoError& e) {
      EXPECT_EQ(e.sys_errno(), EEXIST) << e.what();
      EXPECT_EQ(e.status().path(), where) << e.what();
    }
    out.expect_untouched();
    EXPECT_EQ(entries(ckpt), std::vector<std::string>{}) << "the partial version stays";
  }
}

// One owner per directory: while one optimizer uses a checkpoint directory, another one's
// save and load fail at once naming the directory and the holder's pid, and the first one's
// checkpoint stays intact and loadable.
TEST_F(CheckpointFiles, ASecondOptimizerOnTheDirectoryFailsNamingTheHolder) {
  const std::string ckpt = dir_.file("ckpt");
  test::State saved;
  {
    OffloadedOptimizer a(cpu_options(dir_), test::odd_groups());
    test::init_all(a);
    test::run_steps(a, 1, 2);
    a.save(ckpt);
    saved = test::read_all(a);
    const std::string version = latest_version(ckpt);

    OffloadedOptimizer b(cpu_options(dir_), test::odd_groups());
    test::init_all(b);
    const std::string holder = "in use by zinf process " + std::to_string(::getpid());
    for (const bool save : {true, false}) {
      try {
        save ? b.save(ckpt) : b.load(ckpt);
        ADD_FAILURE() << (save ? "save" : "load") << " into a directory in use";
      } catch (const IoError& e) {
        EXPECT_EQ(e.status().path(), ckpt) << e.what();
        EXPECT_NE(std::string(e.what()).find(holder), std::string::npos) << e.what();
      }
    }
    EXPECT_FALSE(b.failed());
    EXPECT_EQ(latest_version(ckpt), version);
    EXPECT_EQ(entries(ckpt), (std::vector<std::string>{"LATEST", version}));
    // Saves into another directory still work, and a's next save is unaffected.
    b.save(dir_.file("elsewhere"));
    test::run_steps(a, 3, 3);
    a.save(ckpt);
    saved = test::read_all(a);
  }
  OffloadedOptimizer c(cpu_options(dir_), test::odd_groups());
  c.load(ckpt);
  EXPECT_EQ(c.step_count(), 3u);
  EXPECT_EQ(test::diff(test::read_all(c), saved), "");
}

// The same across processes: a forked child holding the directory is named by its pid, and
// its death (even by SIGKILL) frees the directory.
TEST_F(CheckpointFiles, AnotherProcessHoldingTheDirectoryIsNamed) {
  const std::string ckpt = dir_.file("ckpt");
  test::Child child([&](const std::function<void()>& ready) {
    OffloadedOptimizer a(cpu_options(dir_), test::odd_groups());
    test::init_all(a);
    a.save(ckpt);
    ready();
    for (;;) ::pause();
  });
  ASSERT_TRUE(child.ready()) << "the child could not save";
  OffloadedOptimizer b(cpu_options(dir_), test::odd_groups());
  test::init_all(b);
  try {
    b.save(ckpt);
    ADD_FAILURE() << "saved into a directory another process holds";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("in use by zinf process " + std::to_string(child.pid())),
              std::string::npos)
        << e.what();
  }
  child.kill_and_reap();
  b.save(ckpt);
  b.load(ckpt);
}

// Whose versions a save removes: only those this optimizer wrote or loaded in the directory.
// A run that starts afresh in a directory keeps the checkpoint it found there (another run's,
// restorable by hand), though LATEST now names its own; a run that loaded replaces it.
TEST_F(CheckpointFiles, ASaveRemovesOnlyVersionsOfItsOwnChain) {
  const std::string ckpt = dir_.file("ckpt");
  save_one(ckpt);
  const std::string from_a = latest_version(ckpt);
  test::State b_state;
  {
    OffloadedOptimizer b(cpu_options(dir_), test::odd_groups());
    test::init_all(b);
    b.save(ckpt);
    test::run_steps(b, 1, 2);
    b.save(ckpt);
    b_state = test::read_all(b);
  }
  const std::string from_b = latest_version(ckpt);
  auto sorted = [](std::vector<std::string> v) {
    std::sort(v.begin(), v.end());
    return v;
  };
  EXPECT_EQ(entries(ckpt), sorted({"LATEST", from_a, from_b})) << "b's first version is gone";

  OffloadedOptimizer c(cpu_options(dir_), test::odd_groups());
  c.load(ckpt);  // LATEST: b's
  EXPECT_EQ(c.step_count(), 2u);
  EXPECT_EQ(test::diff(test::read_all(c), b_state), "");
  c.save(ckpt);
  EXPECT_EQ(entries(ckpt), sorted({"LATEST", from_a, latest_version(ckpt)}))
      << "the version c loaded is replaced; a's stays";
}

// The run a version records (its "run <id>" line), read as a test would.
std::string run_of(const std::string& ckpt, const std::string& version) {
  std::ifstream in(ckpt + "/" + version + "/run");
  std::string word, id;
  in >> word >> id;
  EXPECT_EQ(word, "run") << version;
  EXPECT_EQ(id.size(), 32u) << version;
  return id;
}

// Every line the capture holds, one string.
std::string joined(const test::LogCapture& log) {
  std::string text;
  for (const auto& l : log.lines()) text += l + "\n";
  return text;
}

// A save that keeps what it supersedes (the first phase of a sharded checkpoint's two-phase
// commit): LATEST names the new version and the previous ones stay, loadable by pointing
// LATEST back; remove_superseded_versions() then removes them, and with a notice a version of
// the same run that LATEST never named (what a job killed before its commit left), but never
// another run's.
TEST_F(CheckpointFiles, ASaveThatKeepsSupersededVersionsLeavesThemUntilRemoved) {
  const std::string ckpt = dir_.file("ckpt");
  save_one(ckpt);  // another run's
  const std::string from_a = latest_version(ckpt);
  const swap::Dir d = swap::Dir::open(ckpt);
  OffloadedOptimizer b(cpu_options(dir_), test::odd_groups());
  test::init_all(b);
  b.save(d, SupersededVersions::kKeep);
  const std::string first = latest_version(ckpt);
  const test::State first_state = test::read_all(b);
  test::run_steps(b, 1, 1);
  b.save(d, SupersededVersions::kKeep);
  const std::string second = latest_version(ckpt);
  const test::State second_state = test::read_all(b);
  const std::string orphan = "v000000000009-1-00000000000000aa";
  fs::copy(ckpt + "/" + first, ckpt + "/" + orphan);
  auto sorted = [](std::vector<std::string> v) {
    std::sort(v.begin(), v.end());
    return v;
  };
  EXPECT_EQ(entries(ckpt), sorted({"LATEST", from_a, first, second, orphan}));
  // The kept version is whole: LATEST pointed back at it loads it, byte for byte (by b: the
  // directory is b's while b lives).
  std::ofstream(ckpt + "/LATEST") << first << "\n";
  b.load(d);
  EXPECT_EQ(test::diff(test::read_all(b), first_state), "");
  std::ofstream(ckpt + "/LATEST") << second << "\n";
  test::LogCapture log;
  b.remove_superseded_versions();
  EXPECT_EQ(entries(ckpt), sorted({"LATEST", from_a, second}));
  EXPECT_NE(joined(log).find("notice: checkpoint: reclaimed " + ckpt + "/" + orphan +
                             ", a superseded version of this run"),
            std::string::npos)
      << joined(log);
  b.load(d);
  EXPECT_EQ(test::diff(test::read_all(b), second_state), "");
}

// Two runs saving into one directory one after the other: each version records the run that
// saved it; a save that makes LATEST name its own checkpoint instead of another run's (one it
// neither saved nor loaded) warns, naming that run, its step and its version, which is kept;
// a load says whose checkpoint, and which step, it loads, and the loading run goes on as that
// run (its save warns of nothing).
TEST_F(CheckpointFiles, TwoRunsSavingIntoOneDirectoryAreToldApart) {
  const std::string ckpt = dir_.file("ckpt");
  save_one(ckpt);  // run a, step 1
  const std::string from_a = latest_version(ckpt);
  const std::string run_a = run_of(ckpt, from_a);
  std::string run_b, from_b;
  {
    OffloadedOptimizer b(cpu_options(dir_), test::odd_groups());
    test::init_all(b);
    test::run_steps(b, 1, 2);
    test::LogCapture log;
    b.save(ckpt);
    from_b = latest_version(ckpt);
    run_b = run_of(ckpt, from_b);
    EXPECT_NE(run_b, run_a);
    EXPECT_EQ(log.lines(), std::vector<std::string>{
                               "warning: checkpoint: " + ckpt + " held step 1 of run " + run_a +
                               " (" + ckpt + "/" + from_a + "), which this run (" + run_b +
                               ") neither saved nor loaded; LATEST now names this run's "
                               "step 2, and that version is kept"});
    test::LogCapture again;
    b.save(ckpt);  // over its own: nothing to say
    EXPECT_EQ(joined(again), "");
    from_b = latest_version(ckpt);
    EXPECT_EQ(run_of(ckpt, from_b), run_b);
  }
  EXPECT_EQ(entries(ckpt).size(), 3u) << "LATEST, a's version and b's last";

  OffloadedOptimizer c(cpu_options(dir_), test::odd_groups());
  {
    test::LogCapture log;
    c.load(ckpt);
    EXPECT_EQ(log.lines(), std::vector<std::string>{"notice: checkpoint: loaded " + ckpt + "/" +
                                                    from_b + ": step 2 of run " + run_b});
  }
  EXPECT_EQ(c.step_count(), 2u);
  test::run_steps(c, 3, 3);
  test::LogCapture log;
  c.save(ckpt);
  EXPECT_EQ(joined(log), "") << "c resumed b's run";
  EXPECT_EQ(run_of(ckpt, latest_version(ckpt)), run_b);
}

// Leftovers of interrupted saves (.tmp versions, replace_file_durably's temporaries) are
// reclaimed with a notice naming them; entries with names zinf does not give, and complete
// versions of other runs, are left alone.
TEST_F(CheckpointFiles, ASaveReclaimsOnlyLeftoversOfInterruptedSaves) {
  const std::string ckpt = dir_.subdir("ckpt");
  const std::string dead_version = ckpt + "/v000000000007-1-00000000deadbeef.tmp";
  fs::create_directory(dead_version);
  std::ofstream(dead_version + "/state.bin") << "partial";
  std::ofstream(ckpt + "/.zinf-tmp-1-0000000000000001") << "partial LATEST";
  const std::vector<std::string> foreign = {"LATEST.tmp", "notes.txt",
                                            "v000000000003-1-0000000000000002", "v-draft"};
  std::ofstream(ckpt + "/LATEST.tmp") << "x";
  std::ofstream(ckpt + "/notes.txt") << "x";
  fs::create_directory(ckpt + "/v000000000003-1-0000000000000002");
  fs::create_directory(ckpt + "/v-draft");
  test::LogCapture log;
  save_one(ckpt);
  std::vector<std::string> want = foreign;
  want.push_back("LATEST");
  want.push_back(latest_version(ckpt));
  std::sort(want.begin(), want.end());
  EXPECT_EQ(entries(ckpt), want);
  std::string text;
  for (const auto& l : log.lines()) text += l + "\n";
  EXPECT_NE(text.find("notice: checkpoint: reclaimed " + dead_version), std::string::npos) << text;
  EXPECT_NE(text.find("notice: checkpoint: reclaimed " + ckpt + "/.zinf-tmp-1-0000000000000001"),
            std::string::npos)
      << text;
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
  const auto [old_state, new_state] =
      test::checkpoint_then_step(options_for(StateTier::kNvme, dir), groups, ckpt);
  // Child: the same run from the checkpoint, then a save that dies at the kill point.
  const int status = test::wait_status_of_child([&] {
    OffloadedOptimizer b(options_for(StateTier::kNvme, dir), groups);
    test_hooks::set_checkpoint_hook(b, [kp](std::string_view phase, std::uint64_t bytes) {
      if (phase == kp.phase && bytes >= kp.after_bytes) ::raise(SIGKILL);
    });
    b.load(ckpt);
    test::StepGrads sg(groups, 3, ElementType::kF32);
    (void)b.step(sg.views);
    b.save(ckpt);
  });
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
}  // namespace zinf::optim
