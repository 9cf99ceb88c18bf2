// SPDX-License-Identifier: Apache-2.0
// ShardedOptimizer under mpirun (2 and 3 ranks, MPI collectives): the parity check of
// sharded_optimizer_test on real processes, cpu and nvme tiers (each rank's swap files in its
// own scratch folder, under rank<R>).
#include <mpi.h>

#include <chrono>
#include <memory>

#include <gtest/gtest.h>

#include "sharded_checks.h"
#include "support/test_dir.h"
#include "zinf/dist/mpi_collectives.h"

namespace zinf::dist {
namespace {

Collectives* g_collectives = nullptr;

TEST(MpiShardedOptimizer, EveryRanksParametersAreBitwiseTheOneOptimizersRun) {
  const auto want = test::reference();
  for (auto tier : {offload::StateTier::kCpu, offload::StateTier::kNvme}) {
    SCOPED_TRACE(std::string(offload::state_tier_name(tier)));
    zinf::test::TestDir dir;
    test::check_sharded_parity(*g_collectives, tier, dir.subdir("nvme"), want);
  }
}

}  // namespace
}  // namespace zinf::dist

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  ::testing::InitGoogleTest(&argc, argv);
  int rc = 1;
  {
    zinf::dist::MpiCollectivesOptions options;
    // A rank whose test failed early must not hang the others for the default ten minutes.
    options.timeout = std::chrono::seconds(60);
    std::unique_ptr<zinf::dist::Collectives> collectives =
        zinf::dist::make_mpi_collectives(options);
    zinf::dist::g_collectives = collectives.get();
    rc = RUN_ALL_TESTS();
    zinf::dist::g_collectives = nullptr;
  }
  MPI_Finalize();
  return rc;
}
