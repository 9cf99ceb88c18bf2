// SPDX-License-Identifier: Apache-2.0
// End-to-end checks of `zinf demo` as a user runs it: a tiny model trained with each offload
// tier (none, cpu, nvme) ends with bitwise the same fp32 master weights — the same as the
// in-memory CpuAdam reference trainer — and a loss well below where it started; the Adam
// thread count does not change the result; a config file is honoured and overridden; bad
// arguments are one-line errors with status 2.
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstdio>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "demo_model.h"
#include "sha256.h"
#include "support/test_dir.h"
#include "support/tool_process.h"
#include "support/tool_run.h"

namespace {

using zinf::test::dir_entries;
using zinf::test::make_victims;
using zinf::test::plant_links;
using zinf::test::run_zinf;
using zinf::test::spawn_tool;
using zinf::test::ToolEnd;
using zinf::test::ToolProcess;
using zinf::test::ToolRun;
using zinf::test::Victims;
using zinf::test::victims_changed;
using zinf::test::wait_tool;

// The raw text of a top-level field of the one-line JSON summary ("" if absent).
std::string field(const std::string& json, const std::string& key) {
  const std::string k = "\"" + key + "\":";
  const std::size_t at = json.find(k);
  if (at == std::string::npos) return "";
  std::size_t begin = at + k.size();
  std::size_t end = begin;
  if (json[begin] == '"') {
    end = json.find('"', begin + 1);
    return json.substr(begin + 1, end - begin - 1);
  }
  while (end < json.size() && json[end] != ',' && json[end] != '}') ++end;
  return json.substr(begin, end - begin);
}

// The tiny model every run here trains (seconds, even in the debug build).
constexpr const char* kTiny = "--layers 3 --hidden 32 --batch 8 --steps 30 --lr 1e-2 --seed 5";

// The reference run's weights_sha256 (kTiny's model, 30 steps at lr 1e-2, then `change`).
std::string reference_sha256(std::optional<zinf::tools::demo::RateChange> change = std::nullopt) {
  zinf::adam::AdamParams hyper;
  hyper.lr = 1e-2;
  const auto run = zinf::tools::demo::train_reference({3, 32, 8}, 5, 30, hyper, change);
  zinf::tools::Sha256 h;
  for (const auto& layer : run.master) {
    std::string bytes;
    for (float f : layer) {
      const auto u = std::bit_cast<std::uint32_t>(f);
      for (int b = 0; b < 4; ++b) bytes += static_cast<char>((u >> (8 * b)) & 0xff);
    }
    h.update(bytes);
  }
  return zinf::tools::to_hex(h.finish());
}

TEST(DemoCli, EveryTierGivesTheReferenceWeightsAndTheLossFalls) {
  zinf::test::TestDir dir;
  const std::string expected = reference_sha256();
  for (const char* tier : {"none", "cpu", "nvme"}) {
    const ToolRun r = run_zinf(
        std::string("demo --json --offload ") + tier + " --dir " + dir.path() + " " + kTiny, false);
    ASSERT_EQ(r.status, 0) << tier << ": "
                           << run_zinf(std::string("demo --offload ") + tier + " --dir " +
                                           dir.path() + " " + kTiny,
                                       true)
                                  .out;
    EXPECT_EQ(field(r.out, "offload"), tier);
    EXPECT_EQ(field(r.out, "steps"), "30");
    EXPECT_EQ(field(r.out, "layers"), "3");
    EXPECT_EQ(field(r.out, "hidden"), "32");
    EXPECT_EQ(field(r.out, "weights_sha256"), expected) << tier << ": " << r.out;
    const double initial = std::atof(field(r.out, "initial_loss").c_str());
    const double final_loss = std::atof(field(r.out, "final_loss").c_str());
    EXPECT_GT(initial, 0.0) << r.out;
    EXPECT_LT(final_loss, 0.5 * initial) << r.out;
    for (const char* key : {"step_seconds", "nvme_read_gbps", "nvme_write_gbps", "stall_share",
                            "pinned_bytes_peak"}) {
      EXPECT_FALSE(field(r.out, key).empty()) << key << " missing in " << r.out;
    }
    const bool nvme = std::string(tier) == "nvme";
    EXPECT_EQ(field(r.out, "nvme_bytes_read") != "0", nvme) << r.out;
    EXPECT_EQ(field(r.out, "nvme_bytes_written") != "0", nvme) << r.out;
  }
}

TEST(DemoCli, AdamThreadCountDoesNotChangeTheWeights) {
  zinf::test::TestDir dir;
  std::string first;
  for (const char* threads : {"1", "2", "3"}) {
    const ToolRun r = run_zinf(
        std::string("demo --json --offload cpu --adam-threads ") + threads + " " + kTiny, false);
    ASSERT_EQ(r.status, 0) << r.out;
    const std::string sha = field(r.out, "weights_sha256");
    ASSERT_EQ(sha.size(), 64u) << r.out;
    if (first.empty()) first = sha;
    EXPECT_EQ(sha, first) << threads << " threads";
  }
}

// The "losses" array of the JSON summary.
std::vector<double> losses_of(const std::string& json) {
  std::vector<double> out;
  const std::size_t at = json.find("\"losses\":[");
  if (at == std::string::npos) return out;
  const char* p = json.c_str() + at + 10;
  while (*p != ']' && *p != '\0') {
    char* end = nullptr;
    out.push_back(std::strtod(p + 1, &end));
    p = end;
  }
  return out;
}

// zinf.state_precision bf16 and int8 train the demo's model (nvme tier, 4 x 128, 100 steps)
// along fp32's loss curve. Tolerance (docs/engine.md, "Compact optimizer state"): at every
// step within 5% of fp32's loss at that step or 1% of the initial loss, whichever is larger,
// and the final loss below 1% of the initial. Measured when written: at most 1.6% apart over
// the first 40 steps and 0.5% of the initial loss anywhere (bf16 and int8 alike).
TEST(DemoCli, CompactStatePrecisionsFollowTheFp32LossCurve) {
  zinf::test::TestDir dir;
  const std::string model = " --layers 4 --hidden 128 --batch 32 --steps 100 --lr 1e-2 --seed 5";
  std::vector<double> fp32;
  double fp32_read = 0;
  for (const char* precision : {"fp32", "bf16", "int8"}) {
    SCOPED_TRACE(precision);
    const std::string cfg = dir.file(std::string(precision) + ".json");
    std::ofstream(cfg) << R"({"zinf": {"state_precision": ")" << precision << R"("}})";
    const ToolRun r = run_zinf("demo --json --offload nvme --dir " + dir.subdir(precision) +
                                   " --config " + cfg + model,
                               false);
    ASSERT_EQ(r.status, 0) << r.out;
    const std::vector<double> losses = losses_of(r.out);
    ASSERT_EQ(losses.size(), 100u) << r.out;
    if (fp32.empty()) {
      fp32 = losses;
      fp32_read = std::atof(field(r.out, "nvme_bytes_read").c_str());
      continue;
    }
    for (std::size_t t = 0; t < losses.size(); ++t) {
      const double tol = std::max(0.05 * fp32[t], 0.01 * fp32[0]);
      EXPECT_LE(std::abs(losses[t] - fp32[t]), tol)
          << "step " << t + 1 << ": " << losses[t] << " against fp32's " << fp32[t];
    }
    EXPECT_LT(losses.back(), 0.01 * losses.front());
    // The optimizer's records shrink (8 or 6.125 bytes per parameter against 12), so the
    // run reads less from the drive than fp32's (the parameters' own reads are the same).
    EXPECT_LT(std::atof(field(r.out, "nvme_bytes_read").c_str()), fp32_read) << r.out;
  }
}

TEST(DemoCli, ProgressWithoutATerminalIsOneLinePerNSteps) {
  const ToolRun r = run_zinf(std::string("demo --offload none --every 10 ") + kTiny, true);
  ASSERT_EQ(r.status, 0) << r.out;
  // Step 1, then every 10th: 1, 10, 20, 30; no carriage returns.
  std::size_t lines = 0;
  for (std::size_t at = r.out.find("step "); at != std::string::npos;
       at = r.out.find("\nstep ", at + 1)) {
    ++lines;
  }
  EXPECT_EQ(lines, 4u) << r.out;
  EXPECT_EQ(r.out.find('\r'), std::string::npos);
  EXPECT_NE(r.out.find("step   30/30  loss "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("weights_sha256 "), std::string::npos) << r.out;
}

TEST(DemoCli, ConfigFileIsReadAndTheCommandLineOverridesIt) {
  zinf::test::TestDir dir;
  const std::string nvme_dir = dir.subdir("from-config");
  const std::string path = dir.file("ds_config.json");
  std::ofstream(path) << R"({
  "zero_optimization": {"stage": 3,
    "offload_param": {"device": "nvme", "nvme_path": ")"
                      << nvme_dir << R"("},
    "offload_optimizer": {"device": "nvme", "nvme_path": ")"
                      << nvme_dir << R"("}},
  "optimizer": {"type": "Adam", "params": {"lr": 0.02}}
})";
  ToolRun r = run_zinf(
      "demo --json --config " + path + " --layers 2 --hidden 16 --batch 4 --steps 3", false);
  ASSERT_EQ(r.status, 0) << run_zinf("demo --config " + path, true).out;
  EXPECT_EQ(field(r.out, "offload"), "nvme");
  EXPECT_EQ(field(r.out, "dir"), nvme_dir);
  EXPECT_EQ(field(r.out, "lr"), "0.02");
  r = run_zinf("demo --json --config " + path +
                   " --offload cpu --lr 0.005 --layers 2 --hidden 16 "
                   "--batch 4 --steps 3",
               false);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(field(r.out, "offload"), "cpu");
  EXPECT_EQ(field(r.out, "lr"), "0.005");
  EXPECT_EQ(field(r.out, "nvme_bytes_read"), "0");
}

// A config key out of its range is exit 2 and one line naming the key, not an abort: a
// buffer_size near 2^64 once died in align_up (SIGABRT) before the engine existed.
TEST(DemoCli, AConfigSizeOutOfRangeIsExitTwoNamingTheKey) {
  zinf::test::TestDir dir;
  const std::string path = dir.file("huge.json");
  std::ofstream(path) << R"({"zero_optimization": {"stage": 3, "offload_param": )"
                         R"({"device": "cpu", "buffer_size": 18446744073709551615}}})";
  const ToolRun r = run_zinf("demo --config " + path + " --layers 2 --hidden 16 --steps 1", true);
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.out, "zinf demo: error: " + path +
                       ": zero_optimization.offload_param.buffer_size: at most 1125899906842624 "
                       "(2^50 elements: the largest layer zinf takes), got 18446744073709551615\n");
}

// `zinf tune --out` writes I/O settings and no offload: `demo --config` with it used to train in
// memory without a word. It keeps the demo's NVMe default, says so, and names the I/O settings.
TEST(DemoCli, AConfigWithoutOffloadKeepsTheNvmeDefaultAndTheHeaderNamesTheIoSettings) {
  zinf::test::TestDir dir;
  const std::string path = dir.file("tuned.json");
  std::ofstream(path) << R"({"aio": {"block_size": 524288, "queue_depth": 8}})";
  ToolRun r = run_zinf("demo --config " + path + " --dir " + dir.subdir("d") +
                       " --layers 2 --hidden 16 --batch 4 --steps 2");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find(path + " offloads nothing"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("offload nvme in"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("queue_depth 8, checksums on"), std::string::npos) << r.out;
  r = run_zinf("demo --json --config " + path + " --offload none --layers 2 --hidden 16 "
               "--batch 4 --steps 2", false);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(field(r.out, "offload"), "none");
}

// Training cut in two, --save after 18 steps and --resume for the other 12, ends bitwise where
// the uninterrupted 30 steps end (the moments and the step count travel with the weights), on
// both offload tiers that hold state; a checkpoint of another model is refused naming it.
TEST(DemoCli, SaveAndResumeEndBitwiseWhereTheUninterruptedRunEnds) {
  zinf::test::TestDir dir;
  const std::string expected = reference_sha256();
  const std::string model = "--layers 3 --hidden 32 --batch 8 --lr 1e-2 --seed 5 --json";
  for (const char* tier : {"cpu", "nvme"}) {
    const std::string ckpt = dir.file(std::string("ckpt-") + tier);
    const std::string common =
        std::string("demo --offload ") + tier + " --dir " + dir.path() + " " + model;
    const ToolRun first = run_zinf(common + " --steps 18 --save " + ckpt, false);
    ASSERT_EQ(first.status, 0) << first.out;
    EXPECT_EQ(field(first.out, "saved_to"), ckpt);
    EXPECT_TRUE(std::filesystem::exists(ckpt + "/zinf-sharded")) << tier;
    const ToolRun second = run_zinf(common + " --steps 12 --resume " + ckpt, false);
    ASSERT_EQ(second.status, 0) << second.out;
    EXPECT_EQ(field(second.out, "resumed_from"), ckpt);
    EXPECT_EQ(field(second.out, "weights_sha256"), expected) << tier << ": " << second.out;
    // The resumed run starts where the first ended: its first loss is below the first run's.
    EXPECT_LT(std::atof(field(second.out, "initial_loss").c_str()),
              std::atof(field(first.out, "initial_loss").c_str()));
  }
  const ToolRun other = run_zinf(
      "demo --offload cpu --layers 3 --hidden 16 --batch 8 --steps 1 "
      "--resume " +
          dir.file("ckpt-cpu"),
      true);
  EXPECT_NE(other.status, 0);
  // Refused at the commit record, before any rank folder is read.
  EXPECT_EQ(other.out, "zinf demo: error: ShardedEngine::load: " + dir.file("ckpt-cpu") +
                           "/zinf-sharded does not describe a sharded checkpoint of these layers "
                           "(world size, rank folders, layer names and sizes)\n");
}

// --lr on --resume is the user changing the resumed run's rate: the 12 steps after the
// checkpoint train with it (bitwise the uninterrupted reference whose rate changes at step 19)
// and the header and JSON say it. Without --lr the checkpoint's rate goes on and is the one
// reported (not the default 1e-3). Once the checkpoint's rate was used whatever --lr said,
// while the header and JSON reported --lr.
TEST(DemoCli, LrOnResumeReplacesTheCheckpointsRateAndIsReported) {
  zinf::test::TestDir dir;
  const std::string ckpt = dir.file("ckpt");
  const std::string common = "demo --offload cpu --layers 3 --hidden 32 --batch 8 --seed 5 --json";
  const ToolRun first = run_zinf(common + " --lr 1e-2 --steps 18 --save " + ckpt, false);
  ASSERT_EQ(first.status, 0) << first.out;

  const ToolRun changed = run_zinf(common + " --steps 12 --lr 5e-3 --resume " + ckpt, true);
  ASSERT_EQ(changed.status, 0) << changed.out;
  EXPECT_EQ(field(changed.out, "weights_sha256"),
            reference_sha256(zinf::tools::demo::RateChange{19, 5e-3}))
      << changed.out;
  EXPECT_EQ(field(changed.out, "lr"), "0.005");
  EXPECT_NE(changed.out.find(", lr 0.005\n"), std::string::npos) << changed.out;

  const ToolRun kept = run_zinf(common + " --steps 12 --resume " + ckpt, true);
  ASSERT_EQ(kept.status, 0) << kept.out;
  EXPECT_EQ(field(kept.out, "weights_sha256"), reference_sha256()) << kept.out;
  EXPECT_EQ(field(kept.out, "lr"), "0.01");
  EXPECT_NE(kept.out.find(", lr 0.01\n"), std::string::npos) << kept.out;
}

TEST(DemoCli, BadArgumentsAreOneLineErrors) {
  ToolRun r = run_zinf("demo --offload disk", true);
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.out, "zinf demo: error: invalid --offload 'disk': expected none, cpu or nvme\n");
  r = run_zinf("demo --device cuda", true);
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.out,
            "zinf demo: error: --device cuda is not supported: the demo's forward and backward "
            "are plain C++ over host memory; use --device host\n");
  r = run_zinf("demo --steps 0", true);
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.out, "zinf demo: error: --steps must be in [1, 1000000]\n");
  r = run_zinf("demo --hiden 8", true);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.out.find("--hidden"), std::string::npos) << r.out;
  // A stage below 3 asked for on the command line is not raised behind the user's back.
  r = run_zinf("demo --zero-stage 2 --offload nvme", true);
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.out,
            "zinf demo: error: --zero-stage 2 keeps the parameters whole on every rank, but "
            "--offload nvme offloads them (parameter offload needs stage 3): give --zero-stage "
            "3, or a config with offload_param none and --offload left out\n");
  r = run_zinf("demo --zero-stage 4", true);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.out.find("--zero-stage"), std::string::npos) << r.out;
}

// The demo makes no file of its own (its swap files are the library's): a link at the write
// probe's old name stays untouched all the same.
TEST(DemoCli, FollowsNoLinkPlantedInItsDirectory) {
  zinf::test::TestDir dir;
  zinf::test::expect_follows_no_probe_link(
      ZINF_TOOL_PATH, {"demo", "--steps", "2", "--layers", "2", "--hidden", "64"}, dir.path());
}

TEST(DemoCli, SignalsStopTrainingAndLeaveNothingBehind) {
  zinf::test::TestDir dir;
  zinf::test::expect_signals_stop_cleanly(
      ZINF_TOOL_PATH, "demo", {"--steps", "1000000", "--layers", "2", "--hidden", "128"},
      dir.path(), 100, 600);
}

}  // namespace
