// SPDX-License-Identifier: Apache-2.0
// End-to-end checks of `zinf bench step` as a user runs it: a small run of each tier prints
// the JSON keys compare_step.sh reads, and bad arguments are one-line errors with status 2.
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "support/test_dir.h"
#include "support/tool_run.h"

namespace {

using zinf::test::run_shell;
using zinf::test::run_zinf;
using zinf::test::ToolRun;

TEST(BenchStepCli, SmallRunOfEachTierPrintsTheJsonKeys) {
  zinf::test::TestDir dir;
  for (const char* tier : {"nvme", "cpu"}) {
    // 64K elements in sub-groups of 16K: 4 records of 196608 bytes, a ring of 3.
    ToolRun r = run_zinf("bench step --dir " + dir.path() + " --numel 64K --sub-group 16K " +
                         "--depth 3 --steps 2 --engine threads --json --tier " + tier);
    ASSERT_EQ(r.status, 0) << r.out;
    const bool nvme = std::string(tier) == "nvme";
    for (std::string key :
         {std::string("\"tier\":\"") + tier + "\"", std::string("\"numel\":65536"),
          std::string("\"sub_groups\":4"), std::string("\"step_seconds\":"),
          std::string("\"read_seconds\":"), std::string("\"write_seconds\":"),
          std::string("\"compute_seconds\":"),
          std::string("\"bytes_read\":") + (nvme ? "786432" : "0"),
          std::string("\"bytes_written\":") + (nvme ? "786432" : "0"),
          std::string("\"pinned_bytes_peak\":") + (nvme ? "589824" : "786432")}) {
      EXPECT_NE(r.out.find(key), std::string::npos) << key << " missing in " << r.out;
    }
  }
}

// The number after "key": in a one-line JSON object (-1 if absent).
double json_number(const std::string& out, const std::string& key) {
  const auto at = out.find("\"" + key + "\":");
  if (at == std::string::npos) return -1;
  return std::stod(out.substr(at + key.size() + 3));
}

// --reference K measures the drive and the kernel around every block of K steps and judges
// the steps by them; its data files go when the run ends. The cpu tier has no I/O: its ideal
// is the kernel alone.
TEST(BenchStepCli, ReferenceReportsTheIdealAndRemovesItsFiles) {
  zinf::test::TestDir dir;
  for (const char* tier : {"nvme", "cpu"}) {
    ToolRun r = run_zinf("bench step --dir " + dir.path() + " --numel 64K --sub-group 16K " +
                         "--depth 3 --steps 2 --engine threads --reference 1 --json --tier " + tier);
    ASSERT_EQ(r.status, 0) << r.out;
    // Before each of the 2 steps and after the last.
    EXPECT_EQ(json_number(r.out, "references"), 3.0) << r.out;
    const bool nvme = std::string(tier) == "nvme";
    for (const char* key : {"ref_read_gbps", "ref_write_gbps", "ref_adam_seconds", "ideal_seconds",
                            "ratio_to_ideal"}) {
      EXPECT_GE(json_number(r.out, key), 0.0) << key << " missing in " << r.out;
    }
    EXPECT_GT(json_number(r.out, "ref_adam_seconds"), 0.0) << r.out;
    EXPECT_GT(json_number(r.out, "ideal_seconds"), 0.0) << r.out;
    EXPECT_GT(json_number(r.out, "ratio_to_ideal"), 0.0) << r.out;
    if (nvme) {
      EXPECT_GT(json_number(r.out, "ref_read_gbps"), 0.0) << r.out;
      EXPECT_GT(json_number(r.out, "ref_write_gbps"), 0.0) << r.out;
    } else {
      // Without I/O the ideal is the kernel alone.
      EXPECT_EQ(json_number(r.out, "ref_read_gbps"), 0.0) << r.out;
      EXPECT_EQ(json_number(r.out, "ref_write_gbps"), 0.0) << r.out;
    }
    // One ratio per timed step.
    const auto all = r.out.find("\"ratio_to_ideal_all\":[");
    ASSERT_NE(all, std::string::npos) << r.out;
    const std::string list = r.out.substr(all, r.out.find(']', all) - all);
    EXPECT_EQ(std::count(list.begin(), list.end(), ','), 1) << list;
  }
  // Nothing of the reference's is left in the directory.
  EXPECT_FALSE(std::ifstream(dir.path() + "/zinf-bench-step-ref.0.dat").good());
}

// Blocks of K back-to-back steps: a reference before each block and one after the last, a
// partial last block included.
TEST(BenchStepCli, ReferenceEveryKStepsBracketsEachBlock) {
  zinf::test::TestDir dir;
  ToolRun r = run_zinf("bench step --dir " + dir.path() + " --numel 64K --sub-group 16K --depth 3 " +
                       "--steps 5 --engine threads --reference 2 --json");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(json_number(r.out, "reference_every"), 2.0) << r.out;
  EXPECT_EQ(json_number(r.out, "references"), 4.0) << r.out;  // before 1, 3, 5 and after 5
  const auto all = r.out.find("\"ratio_to_ideal_all\":[");
  ASSERT_NE(all, std::string::npos) << r.out;
  const std::string list = r.out.substr(all, r.out.find(']', all) - all);
  EXPECT_EQ(std::count(list.begin(), list.end(), ','), 4) << list;
  r = run_zinf("bench step --dir " + dir.path() + " --steps 2 --reference 3");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.out, "zinf bench step: error: --reference 3 exceeds --steps 2: the references must "
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

}  // namespace
