// SPDX-License-Identifier: Apache-2.0
// `mpirun -np N zinf bench step`: weak scaling. Every rank keeps its shard of the sharded
// optimizer's state in its own <dir>/rank<R>, and rank 0 alone prints one JSON document with
// the one-rank step, the sharded step (the slowest rank's), each rank's and their ratio. The
// figures are the machine's; the test checks their shape and consistency, not their size.
// Options that time one process are refused under mpirun. The N comes from --np N.
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "np_main.h"
#include "support/test_dir.h"
#include "support/tool_process.h"
#include "support/tool_run.h"

namespace {

zinf::test::ToolRun mpirun_bench_step(int np, const std::string& args, bool merge_stderr) {
  return zinf::test::run_shell(std::string(ZINF_MPI_ENV) + " " + ZINF_MPIRUN_COMMAND + " -np " +
                                   std::to_string(np) + " " + ZINF_TOOL_PATH + " bench step " +
                                   args,
                               merge_stderr);
}

TEST(BenchStepMpi, ShardsOverTheRanksFoldersAndRankZeroReportsTheRatio) {
  const int np = zinf::test::mpi_np();
  zinf::test::TestDir dir;
  // 128K elements per rank in sub-groups of 32K: 4 records of 393216 bytes each, per rank.
  const zinf::test::ToolRun run = mpirun_bench_step(
      np,
      "--dir " + dir.path() +
          " --numel 128K --sub-group 32K --depth 3 --steps 3 --engine threads --threads 1 --json",
      false);
  ASSERT_EQ(run.status, 0) << run.out;
  const auto doc = nlohmann::json::parse(run.out);  // one document: only rank 0 prints
  EXPECT_EQ(doc["mode"], "weak_scaling");
  EXPECT_EQ(doc["ranks"], np);
  EXPECT_EQ(doc["collectives"], "mpi");
  EXPECT_EQ(doc["numel"], 131072);
  EXPECT_EQ(doc["global_numel"], 131072 * np);
  const double alone = doc["alone_step_s"], sharded = doc["sharded_step_s"];
  EXPECT_GT(alone, 0);
  EXPECT_GT(sharded, 0);
  EXPECT_DOUBLE_EQ(doc["weak_scaling_ratio"].get<double>(), sharded / alone);
  EXPECT_EQ(doc["alone_step_s_all"].size(), 3u);
  EXPECT_EQ(doc["sharded_step_s_all"].size(), 3u);
  // A step's sharded time is its slowest rank's, so its median is at least every rank's own.
  ASSERT_EQ(doc["per_rank_step_s"].size(), static_cast<std::size_t>(np));
  ASSERT_EQ(doc["per_rank_optimizer_s"].size(), static_cast<std::size_t>(np));
  for (int r = 0; r < np; ++r) {
    const double mine = doc["per_rank_step_s"][r];
    EXPECT_GT(mine, 0) << r;
    EXPECT_LE(mine, sharded) << r;
    // The rank's optimizer is part of its sharded step.
    EXPECT_GT(doc["per_rank_optimizer_s"][r].get<double>(), 0) << r;
    EXPECT_LE(doc["per_rank_optimizer_s"][r].get<double>(), mine) << r;
  }
  // Weak scaling: rank 0's shard is as large as the optimizer it steps alone, and both move
  // every record once each way (12 bytes an element, fp32 state).
  for (const char* part : {"alone", "rank0_optimizer"}) {
    SCOPED_TRACE(part);
    EXPECT_EQ(doc[part]["bytes_read"], 1572864);
    EXPECT_EQ(doc[part]["bytes_written"], 1572864);
  }
  // Every rank's state went to its own rank<R> folder (unnamed files), which the sharded
  // optimizer removes once empty: nothing is left.
  EXPECT_TRUE(zinf::test::dir_entries(dir.path()).empty());
}

TEST(BenchStepMpi, RefusesWhatTimesOneProcessAndNamesIt) {
  const int np = zinf::test::mpi_np();
  zinf::test::TestDir dir;
  const zinf::test::ToolRun run =
      mpirun_bench_step(np,
                        "--dir " + dir.path() +
                            " --numel 128K --sub-group 32K --depth 3 --steps 1 --reference 1 "
                            "--copy-out bf16",
                        true);
  EXPECT_NE(run.status, 0) << run.out;
  EXPECT_NE(run.out.find("under mpirun bench step measures weak scaling"), std::string::npos)
      << run.out;
  EXPECT_NE(run.out.find("for one process: --reference, --copy-out"), std::string::npos) << run.out;
}

}  // namespace

int main(int argc, char** argv) { return zinf::test::np_test_main(argc, argv); }
