// SPDX-License-Identifier: Apache-2.0
// `mpirun -np N zinf bench io`: every rank tests its own <dir>/rank<R>, and rank 0 alone reports
// rank 0's rate alone, every rank's rate together, the aggregate and the scaling efficiency
// (aggregate / N x alone), one JSON document with --json; the rank folders go at the end. The figures are the drive's; the
// test checks their shape and consistency, not their size. The N comes from --np N.
#include <cstdlib>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/test_dir.h"
#include "np_main.h"
#include "support/tool_run.h"

namespace {

TEST(BenchIoMpi, EveryRankTestsItsOwnFolderAndRankZeroReportsTheAggregate) {
  const int np = zinf::test::mpi_np();
  zinf::test::TestDir dir;
  const zinf::test::ToolRun run =
      zinf::test::run_shell(std::string(ZINF_MPI_ENV) + " " + ZINF_MPIRUN_COMMAND + " -np " +
                                std::to_string(np) + " " + ZINF_TOOL_PATH + " bench io --dir " +
                                dir.path() + " --size 8M --block-size 1M --loops 1 --json",
                            false);
  ASSERT_EQ(run.status, 0) << run.out;
  const auto doc = nlohmann::json::parse(run.out);  // one document: only rank 0 prints
  EXPECT_EQ(doc["ranks"], np);
  ASSERT_EQ(doc["jobs"].size(), 2u) << run.out;
  for (const auto& job : doc["jobs"]) {
    SCOPED_TRACE(job.dump());
    ASSERT_EQ(job["per_rank_gbps"].size(), static_cast<std::size_t>(np));
    double sum = 0;
    for (const auto& r : job["per_rank_gbps"]) {
      EXPECT_GT(r.get<double>(), 0);
      sum += r.get<double>();
    }
    const double alone = job["alone_gbps"], aggregate = job["aggregate_gbps"];
    EXPECT_GT(alone, 0);
    // Every rank's bytes over the slowest rank's time: at most the sum of the rates.
    EXPECT_GT(aggregate, 0);
    EXPECT_LE(aggregate, sum * 1.0001);
    EXPECT_DOUBLE_EQ(job["scaling_efficiency"].get<double>(), aggregate / (np * alone));
  }
  // Each rank's folder goes with its files: the run leaves nothing it made.
  EXPECT_TRUE(std::filesystem::is_empty(dir.path())) << "left behind in " << dir.path();
}

}  // namespace

int main(int argc, char** argv) { return zinf::test::np_test_main(argc, argv); }
