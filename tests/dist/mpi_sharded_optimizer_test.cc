// SPDX-License-Identifier: Apache-2.0
// ShardedOptimizer under mpirun (2 and 3 ranks, MPI collectives): the parity check of
// sharded_optimizer_test on real processes, cpu and nvme tiers (each rank's swap files in its
// own scratch folder, under rank<R>), stages 2 and 1 (reduce-scattered and all-reduced
// gradients), with their collective byte counts.
#include <mpi.h>

#include <chrono>
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "mpi_test_main.h"
#include "sharded_checks.h"
#include "support/test_dir.h"
#include "zinf/dist/mpi_collectives.h"

namespace zinf::dist {
namespace {


TEST(MpiShardedOptimizer, EveryRanksParametersAreBitwiseTheOneOptimizersRun) {
  const auto want = test::reference();
  for (auto tier : {optim::StateTier::kCpu, optim::StateTier::kNvme}) {
    for (const int stage : {2, 1}) {
      SCOPED_TRACE(std::string(optim::state_tier_name(tier)) + " stage " + std::to_string(stage));
      zinf::test::TestDir dir;
      test::check_sharded_parity(*test::mpi_collectives(), tier, dir.subdir("nvme"), want, "",
                                 stage);
    }
  }
}

}  // namespace
}  // namespace zinf::dist

int main(int argc, char** argv) {
  return zinf::dist::test::mpi_test_main(argc, argv, std::chrono::seconds(60));
}
