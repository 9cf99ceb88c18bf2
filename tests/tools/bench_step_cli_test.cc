// SPDX-License-Identifier: Apache-2.0
// End-to-end checks of `zinf bench step` as a user runs it: a small run of each tier prints
// the JSON keys compare_step.sh reads, and bad arguments are one-line errors with status 2.
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <fstream>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/test_dir.h"
#include "support/tool_process.h"
#include "support/tool_run.h"

namespace {

using zinf::test::dir_entries;
using zinf::test::make_victims;
using zinf::test::plant_links;
using zinf::test::run_shell;
using zinf::test::run_zinf;
using zinf::test::spawn_tool;
using zinf::test::ToolEnd;
using zinf::test::ToolProcess;
using zinf::test::ToolRun;
using zinf::test::Victims;
using zinf::test::victims_changed;
using zinf::test::wait_tool;

TEST(BenchStepCli, SmallRunOfEachTierPrintsTheJsonKeys) {
  zinf::test::TestDir dir;
  for (const char* tier : {"nvme", "cpu"}) {
    // 128K elements in sub-groups of 32K: 4 records of 393216 bytes, a ring of 3.
    ToolRun r = run_zinf("bench step --dir " + dir.path() + " --numel 128K --sub-group 32K " +
                         "--depth 3 --steps 2 --engine threads --json --tier " + tier);
    ASSERT_EQ(r.status, 0) << r.out;
    const bool nvme = std::string(tier) == "nvme";
    for (std::string key : {std::string("\"tier\":\"") + tier + "\"",
                            std::string("\"numel\":131072"), std::string("\"sub_groups\":4"),
                            std::string("\"step_seconds\":"), std::string("\"read_seconds\":"),
                            std::string("\"write_seconds\":"), std::string("\"compute_seconds\":"),
                            std::string("\"bytes_read\":") + (nvme ? "1572864" : "0"),
                            std::string("\"bytes_written\":") + (nvme ? "1572864" : "0"),
                            std::string("\"pinned_bytes_peak\":") + (nvme ? "1179648" : "1572864")}) {
      EXPECT_NE(r.out.find(key), std::string::npos) << key << " missing in " << r.out;
    }
  }
}

// --reference K measures the drive and the kernel around every block of K steps and judges
// the steps by them; its data files go when the run ends. The cpu tier has no I/O: its ideal
// is the kernel alone.
TEST(BenchStepCli, ReferenceReportsTheIdealAndRemovesItsFiles) {
  zinf::test::TestDir dir;
  for (const char* tier : {"nvme", "cpu"}) {
    ToolRun r =
        run_zinf("bench step --dir " + dir.path() + " --numel 128K --sub-group 32K " +
                 "--depth 3 --steps 2 --engine threads --reference 1 --json --tier " + tier);
    ASSERT_EQ(r.status, 0) << r.out;
    const nlohmann::json j = nlohmann::json::parse(r.out);
    // Before each of the 2 steps and after the last.
    EXPECT_EQ(j.at("references"), 3) << r.out;
    EXPECT_GT(j.at("ref_adam_seconds").get<double>(), 0.0) << r.out;
    EXPECT_GT(j.at("ideal_seconds").get<double>(), 0.0) << r.out;
    EXPECT_GT(j.at("ratio_to_ideal").get<double>(), 0.0) << r.out;
    if (std::string(tier) == "nvme") {
      EXPECT_GT(j.at("ref_read_gbps").get<double>(), 0.0) << r.out;
      EXPECT_GT(j.at("ref_write_gbps").get<double>(), 0.0) << r.out;
    } else {
      // Without I/O the ideal is the kernel alone.
      EXPECT_EQ(j.at("ref_read_gbps").get<double>(), 0.0) << r.out;
      EXPECT_EQ(j.at("ref_write_gbps").get<double>(), 0.0) << r.out;
    }
    // One ratio per timed step.
    EXPECT_EQ(j.at("ratio_to_ideal_all").size(), 2u) << r.out;
  }
  // Nothing of the reference's is left in the directory.
  EXPECT_FALSE(std::ifstream(dir.path() + "/zinf-bench-step-ref.0.dat").good());
}

// Blocks of K back-to-back steps: a reference before each block and one after the last, a
// partial last block included.
TEST(BenchStepCli, ReferenceEveryKStepsBracketsEachBlock) {
  zinf::test::TestDir dir;
  ToolRun r =
      run_zinf("bench step --dir " + dir.path() + " --numel 128K --sub-group 32K --depth 3 " +
               "--steps 5 --engine threads --reference 2 --json");
  ASSERT_EQ(r.status, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("reference_every"), 2) << r.out;
  EXPECT_EQ(j.at("references"), 4) << r.out;  // before 1, 3, 5 and after 5
  EXPECT_EQ(j.at("ratio_to_ideal_all").size(), 5u) << r.out;
  r = run_zinf("bench step --dir " + dir.path() + " --steps 2 --reference 3");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.out,
            "zinf bench step: error: --reference 3 exceeds --steps 2: the references must "
            "bracket at least one block of steps\n");
}

TEST(BenchStepCli, BadArgumentsAreOneLineErrors) {
  ToolRun r = run_zinf("bench step --tier disk");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.out, "zinf bench step: error: invalid --tier 'disk': expected cpu or nvme\n");
  r = run_zinf("bench step --depth 2");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.out, "zinf bench step: error: --depth must be in [3, 64]\n");
  r = run_zinf("bench step --dir /nonexistent/zinf-nowhere");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.out, "zinf bench step: error: not a directory: /nonexistent/zinf-nowhere\n");
}

// A link planted at the name bench step's --reference file used to have: not followed.
TEST(BenchStepCli, ReferenceFollowsNoLinkPlantedAtItsOldName) {
  zinf::test::TestDir dir;
  const std::string work = dir.subdir("work");
  const Victims v = make_victims(dir.subdir("victims"));
  const std::vector<std::string> planted = {"zinf-bench-step-ref.0.dat"};
  plant_links(work, planted, v);
  ToolRun r = run_zinf("bench step --dir " + work +
                       " --numel 128K --sub-group 32K --steps 2 "
                       "--reference 1 --json");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(victims_changed(v), "");
  EXPECT_EQ(dir_entries(work), planted);
}

TEST(BenchStepCli, SignalsStopTheRunAndLeaveNothingBehind) {
  zinf::test::TestDir dir;
  zinf::test::expect_signals_stop_cleanly(
      ZINF_TOOL_PATH, "bench step",
      {"--numel", "256K", "--sub-group", "64K", "--steps", "1000000", "--reference", "1000"},
      dir.path(), 100, 600);
}

}  // namespace

// The sub-group limit of a ds_config (zero_optimization.sub_group_size) holds on this door too:
// one element per sub-group took 341x the state's room in padding.
TEST(BenchStepCli, ASubGroupBelowTheConfigMinimumExits2) {
  zinf::test::TestDir dir;
  for (const char* n : {"1", "32767"}) {
    const ToolRun r = run_zinf("bench step --dir " + dir.path() + " --numel 1M --steps 1 " +
                               "--sub-group " + n);
    EXPECT_EQ(r.status, 2) << r.out;
    EXPECT_EQ(r.out, std::string("zinf bench step: error: invalid --sub-group '") + n +
                         "': at least 32768 elements (as zero_optimization.sub_group_size), or 0 "
                         "for the default\n");
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}
