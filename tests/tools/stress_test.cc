// SPDX-License-Identifier: Apache-2.0
// End-to-end checks of `zinf stress` as a user runs it: a short clean run passes with data
// verified; a run with injected faults passes with every hard fault surfaced; a planted
// corruption (the hidden self-test flag) fails the run and says what was found, with and
// without checksums; bad options are one-line errors with status 2.
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
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

// The unsigned value of `key` in the run's JSON summary. A summary that does not parse or
// lacks the key fails the test here, so a renamed field cannot pass as "0 <= 0".
long long json_uint(const std::string& out, const std::string& key) {
  const auto j = nlohmann::json::parse(out, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    ADD_FAILURE() << "not one JSON document: " << out;
    return -1;
  }
  const auto it = j.find(key);
  if (it == j.end() || !it->is_number_unsigned()) {
    ADD_FAILURE() << "no unsigned field '" << key << "' in " << out;
    return -1;
  }
  return it->get<long long>();
}

TEST(StressCli, ShortCleanRunPassesWithEveryByteVerified) {
  zinf::test::TestDir dir;
  ToolRun r = run_zinf("stress --dir " + dir.path() + " --duration 1500ms --seed 3 --json",
                       /*merge_stderr=*/false);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("\"result\":\"pass\""), std::string::npos) << r.out;
  EXPECT_EQ(json_uint(r.out, "mismatches"), 0) << r.out;
  EXPECT_EQ(json_uint(r.out, "faults_injected"), 0) << r.out;
  EXPECT_EQ(json_uint(r.out, "unexpected_errors"), 0) << r.out;
  EXPECT_GT(json_uint(r.out, "operations"), 0) << r.out;
  EXPECT_GT(json_uint(r.out, "swap_ins"), 0) << r.out;
  EXPECT_GT(json_uint(r.out, "optimizer_steps"), 0) << r.out;
  EXPECT_GT(json_uint(r.out, "prefetch_acquires"), 0) << r.out;
  EXPECT_GT(json_uint(r.out, "bytes_verified"), 0) << r.out;
  EXPECT_LE(json_uint(r.out, "pinned_peak_bytes"), json_uint(r.out, "pinned_budget_bytes"));
  EXPECT_NE(r.out.find("\"budget_overrun\":false"), std::string::npos) << r.out;
}

TEST(StressCli, FaultsAreInjectedAndEveryHardOneSurfaces) {
  zinf::test::TestDir dir;
  ToolRun r =
      run_zinf("stress --dir " + dir.path() + " --duration 3s --faults 0.05 --seed 5 --json",
               /*merge_stderr=*/false);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(json_uint(r.out, "mismatches"), 0) << r.out;
  EXPECT_EQ(json_uint(r.out, "hard_faults_unsurfaced"), 0) << r.out;
  EXPECT_EQ(json_uint(r.out, "unexpected_errors"), 0) << r.out;
  // Every kind was injected, and every hard fault counted was surfaced by its operation.
  for (const char* kind :
       {"faults_eio", "faults_enospc", "faults_short", "faults_eagain", "faults_delay"}) {
    EXPECT_GT(json_uint(r.out, kind), 0) << kind << " in " << r.out;
  }
  const long long hard = json_uint(r.out, "hard_faults");
  EXPECT_EQ(hard, json_uint(r.out, "faults_eio") + json_uint(r.out, "faults_enospc"));
  EXPECT_EQ(json_uint(r.out, "hard_faults_surfaced"), hard) << r.out;
  EXPECT_GT(json_uint(r.out, "failed_operations"), 0) << r.out;
  EXPECT_GT(json_uint(r.out, "bytes_verified"), 0) << r.out;
}

// Under a small simulated GPU (--gpu-mem: the host device is made that size, so going over it
// fails as a full GPU would) the run passes, its device peak within the budget, with the
// verified rate sampled per --interval and judged for a fall.
TEST(StressCli, SmallGpuMemoryBudgetHoldsAndTheRateIsSampledPerInterval) {
  zinf::test::TestDir dir;
  ToolRun r = run_zinf(
      "stress --dir " + dir.path() + " --duration 2s --interval 250ms --gpu-mem 4M --seed 7 --json",
      /*merge_stderr=*/false);
  ASSERT_EQ(r.status, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["device"], "host");
  EXPECT_EQ(j["device_memory_budget_bytes"], 4u << 20);
  EXPECT_GT(json_uint(r.out, "device_memory_peak_bytes"), 0) << r.out;
  EXPECT_LE(json_uint(r.out, "device_memory_peak_bytes"), 4 << 20) << r.out;
  EXPECT_EQ(j["device_overrun"], false);
  EXPECT_EQ(j["interval_s"], 0.25);
  // 8 intervals of 250 ms; the last may be dropped when the deadline cut it under half.
  ASSERT_GE(j["samples"].size(), 7u) << r.out;
  EXPECT_LE(j["samples"].size(), 8u) << r.out;
  // The samples end with the last interval at least half long: their bytes are at most the total.
  std::uint64_t sum = 0;
  for (const auto& s : j["samples"]) sum += s["bytes"].get<std::uint64_t>();
  EXPECT_GT(sum, 0u) << r.out;
  EXPECT_LE(sum, j["bytes_verified"].get<std::uint64_t>()) << r.out;
  EXPECT_TRUE(j.contains("steady_gbps")) << r.out;
  EXPECT_TRUE(j.contains("cliff")) << r.out;
  r = run_zinf("stress --dir " + dir.path() + " --duration 1s --gpu-mem 4M");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("  device memory     host: peak "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(", budget 4.0 MiB\n  verified over time ("), std::string::npos) << r.out;
}

// --device cuda on a machine without a GPU says why, in one line, before doing anything.
TEST(StressCli, CudaDeviceWithoutAGpuIsRefusedWithTheRuntimesReason) {
  zinf::test::TestDir dir;
  ToolRun r = run_zinf("stress --dir " + dir.path() + " --duration 1s --device cuda");
  if (r.status == 0) GTEST_SKIP() << "a CUDA device is visible: the run went ahead and passed";
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_EQ(r.out.rfind("zinf stress: error: --device cuda: no CUDA device (", 0), 0u) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  EXPECT_TRUE(dir_entries(dir.path()).empty());
}

TEST(StressCli, PlantedCorruptionIsReportedAsAMismatch) {
  zinf::test::TestDir dir;
  ToolRun r =
      run_zinf("stress --dir " + dir.path() + " --duration 500ms --workers 1 --plant-corruption");
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("planted           flipped bytes [0, 64) of "), std::string::npos) << r.out;
  EXPECT_NE(
      r.out.find("problem: swap_in w0-t1 [0, +274489) of 274489: mismatch at tensor offset 0:"),
      std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("mismatches        0\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("FAIL"), std::string::npos) << r.out;
}

TEST(StressCli, PlantedCorruptionWithChecksumsSurfacesAsACorruptionError) {
  zinf::test::TestDir dir;
  ToolRun r = run_zinf("stress --dir " + dir.path() +
                           " --duration 500ms --workers 1 --checksums --plant-corruption --json",
                       /*merge_stderr=*/false);
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("\"result\":\"fail\""), std::string::npos) << r.out;
  EXPECT_GT(json_uint(r.out, "corruption_errors"), 0) << r.out;
  EXPECT_EQ(json_uint(r.out, "mismatches"), 0) << r.out;  // caught before any byte was used
  EXPECT_NE(r.out.find("swap_in w0-t1 [0, +274489) of 274489: corruption surfaced: "),
            std::string::npos)
      << r.out;
}

TEST(StressCli, BadOptionsAreOneLineErrors) {
  ToolRun r = run_zinf("stress --duration 10parsecs");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.out,
            "zinf stress: error: invalid --duration '10parsecs': expected a duration such as "
            "250ms, 10s, 5m or 1h\n");
  r = run_zinf("stress --faults 0.9");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.out, "zinf stress: error: invalid --faults: must be a probability in [0, 0.5]\n");
  r = run_zinf("stress --budget 1M");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.out, "zinf stress: error: invalid --budget: at least 4M\n");
  r = run_zinf("stress --duration 2s --interval 3s");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.out,
            "zinf stress: error: invalid --interval 3s: must be at least 100ms and at most "
            "--duration (2s)\n");
  r = run_zinf("stress --device gpu");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.out.rfind("zinf stress: error: invalid --device 'gpu': expected host or cuda", 0), 0u)
      << r.out;
  zinf::test::TestDir dir;
  r = run_zinf("stress --dir " + dir.path() + " --gpu-mem 1M");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.out,
            "zinf stress: error: invalid --gpu-mem 1M: at least 1449088 (the optimizer worker's "
            "gradients, 400512, and 1 MiB for the prefetch window)\n");
}

TEST(StressCli, FollowsNoLinkPlantedAtTheNamesItUsedToUse) {
  zinf::test::TestDir dir;
  zinf::test::expect_follows_no_probe_link(
      ZINF_TOOL_PATH, {"stress", "--duration", "300ms", "--workers", "1", "--json"}, dir.path());
}

TEST(StressCli, SignalsStopTheSoakAndLeaveNothingBehind) {
  zinf::test::TestDir dir;
  zinf::test::expect_signals_stop_cleanly(
      ZINF_TOOL_PATH, "stress", {"--duration", "60s", "--workers", "1"}, dir.path(), 100, 600);
}

}  // namespace
