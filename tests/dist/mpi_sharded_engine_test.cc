// SPDX-License-Identifier: Apache-2.0
// ShardedEngine under mpirun (2 and 3 ranks, MPI collectives): the checks of sharded_engine_test
// on real processes. Every rank fetches and ends bitwise as one OffloadEngine fed the averaged
// gradients (cpu tiers on_arrival; nvme tiers staged, clipped, one overflow skipped by all; bf16
// device gradients; stages 2 and 1, which keep the parameters whole, with their collective
// byte counts); a checkpoint saved by every rank reloads, and a job of another world size
// refuses it; one rank's failed parameter read fails every rank's fetch, naming it.
#include <mpi.h>

#include <array>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "mpi_test_main.h"
#include "sharded_engine_checks.h"
#include "support/test_dir.h"
#include "zinf/common/error.h"
#include "zinf/dist/mpi_collectives.h"
#include "zinf/dist/testing.h"
#include "zinf/swap/fault_injection.h"

namespace zinf::dist {
namespace {

using offload::OffloadDevice;
using test::ShardedCase;

Collectives& comm() { return *test::mpi_collectives(); }

// A folder every rank sees: rank 0's scratch folder, its path broadcast (the ranks share this
// machine's file system). Removed by rank 0 after every rank is done with it.
class SharedDir {
 public:
  SharedDir() {
    std::array<char, 4096> path{};
    if (comm().rank() == 0) {
      dir_ = std::make_unique<zinf::test::TestDir>();
      std::strncpy(path.data(), dir_->path().c_str(), path.size() - 1);
    }
    broadcast<char>(comm(), std::span<char>(path), 0);
    path_ = path.data();
  }
  ~SharedDir() { comm().barrier(); }
  const std::string& path() const { return path_; }

 private:
  std::unique_ptr<zinf::test::TestDir> dir_;
  std::string path_;
};

TEST(MpiShardedEngine, EveryRankFetchesAndEndsBitwiseAsOneEngine) {
  // The third: bf16 gradients in device memory, copied to the host for MPI.
  for (const ShardedCase c :
       {ShardedCase{OffloadDevice::kCpu, OffloadDevice::kCpu, false},
        ShardedCase{OffloadDevice::kNvme, OffloadDevice::kNvme, true},
        ShardedCase{OffloadDevice::kCpu, OffloadDevice::kCpu, true, test::GradPlace::kDevice,
                    ElementType::kBF16},
        // Stages 2 and 1: whole parameters on every rank, gradients
        // reduce-scattered or all-reduced, one all-gather per step.
        ShardedCase{OffloadDevice::kNone, OffloadDevice::kCpu, true, test::GradPlace::kHost,
                    ElementType::kF32, false, 2},
        ShardedCase{OffloadDevice::kNone, OffloadDevice::kNvme, false, test::GradPlace::kDevice,
                    ElementType::kBF16, false, 1}}) {
    SCOPED_TRACE(::testing::PrintToString(c));
    zinf::test::TestDir dir;  // this rank's own
    const test::Trace want = test::reference_trace(c, dir.subdir("reference"));
    test::RankDevice d;
    test::check_sharded_engine(comm(), d, c, dir.subdir("nvme"), want);
    // The rank folder went with the engine (check_sharded_engine saw it while it lived).
    EXPECT_FALSE(
        std::filesystem::exists(dir.path() + "/nvme/rank" + std::to_string(comm().rank())));
  }
}

TEST(MpiShardedEngine, ACheckpointReloadsAcrossRanksAndReshardsIntoAWorldOfOne) {
  const ShardedCase c{OffloadDevice::kNvme, OffloadDevice::kNvme, false};
  zinf::test::TestDir dir;
  const test::Trace want = test::reference_trace(c, dir.subdir("reference"));
  SharedDir shared;
  const std::string ckpt = shared.path() + "/ckpt";
  test::RankDevice d;
  test::check_sharded_engine(comm(), d, c, dir.subdir("nvme"), want, ckpt);
  EXPECT_TRUE(
      std::filesystem::exists(ckpt + "/rank" + std::to_string(comm().rank()) + "/zinf-sharded"));
  // Each process alone (a world of 1) reshards the whole checkpoint (every saved rank's
  // folder) and takes the last step as the 1-rank run did. One process at a time: a saved
  // folder is locked by whoever loads it, and by its own rank's engine until that is gone:
  // the barrier waits for every rank's engine above to end (without it rank 0 could find
  // rank 1's folder still locked by rank 1's engine, "in use by another zinf process").
  comm().barrier();
  for (int turn = 0; turn < comm().size(); ++turn) {
    if (turn == comm().rank()) {
      auto alone = make_local_collectives();
      ShardedEngine e(test::sharded_config(c, dir.subdir("alone")), test::sharded_layers(),
                      *d.device, d.compute.ref(), *alone);
      e.load(ckpt);
      test::Trace got;
      test::run_steps(e, d, c, 0, 1, test::kSteps, test::kSteps, got);
      for (std::size_t l = 0; l < want.fetched.back().size(); ++l) {
        EXPECT_EQ(got.fetched[0][l], want.fetched.back()[l]) << "layer " << l;
      }
      const auto masters = test::read_masters(e);
      for (std::size_t l = 0; l < want.masters.size(); ++l) {
        EXPECT_TRUE(test::same_bits(masters[l], want.masters[l])) << "layer " << l;
      }
    }
    comm().barrier();
  }
}

TEST(MpiShardedEngine, ARanksFailedParameterReadFailsEveryRankNamingIt) {
  const ShardedCase c{OffloadDevice::kNvme, OffloadDevice::kCpu, false};
  zinf::test::TestDir dir;
  test::RankDevice d;
  swap::FaultRule rule;
  rule.op = swap::IoOp::kRead;
  rule.times = 1000;
  offload::test_hooks::EngineFaults faults{
      std::make_shared<swap::FaultPlan>(std::vector<swap::FaultRule>{rule}), nullptr};
  auto e = comm().rank() == 1 ? test_hooks::make_sharded_engine_with_faults(
                                    test::sharded_config(c, dir.path()), test::sharded_layers(),
                                    *d.device, d.compute.ref(), comm(), faults)
                              : std::make_unique<ShardedEngine>(test::sharded_config(c, dir.path()),
                                                                test::sharded_layers(), *d.device,
                                                                d.compute.ref(), comm());
  test::init_masters(*e);
  try {
    (void)e->fetch(0);
    ADD_FAILURE() << "rank " << comm().rank() << ": fetch returned";
  } catch (const IoError& ex) {
    if (comm().rank() != 1) {
      EXPECT_EQ(std::string(ex.what()), "ShardedEngine::fetch failed: 1 of " +
                                            std::to_string(comm().size()) +
                                            " ranks failed (rank 1); this rank (" +
                                            std::to_string(comm().rank()) + ") did not");
    } else {
      EXPECT_GT(faults.param->injected_errors(), 0u);
    }
  }
  // The group is still in step: a collective after the failure completes on every rank.
  comm().barrier();
}

}  // namespace
}  // namespace zinf::dist

int main(int argc, char** argv) {
  return zinf::dist::test::mpi_test_main(argc, argv, std::chrono::seconds(60));
}
