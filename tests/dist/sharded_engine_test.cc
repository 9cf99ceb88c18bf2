// SPDX-License-Identifier: Apache-2.0
// ShardedEngine with 1-3 ranks as threads (callback collectives): every rank fetches, before
// every step, bitwise the full layers one OffloadEngine fetches when fed the averaged gradients,
// skips the same steps and ends with bitwise its master weights, on the cpu and nvme tiers and
// in both step modes (staged: clipped on the global norm, an overflow on one rank skipped by
// all); a checkpoint reloads on the same world size and is refused on another; one rank's failed
// I/O fails every rank, naming it.
#include "zinf/dist/sharded_engine.h"

#include <atomic>
#include <filesystem>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "sharded_engine_checks.h"
#include "support/test_dir.h"
#include "thread_group.h"
#include "zinf/common/error.h"
#include "zinf/dist/testing.h"
#include "zinf/swap/fault_injection.h"

namespace zinf::dist {
namespace {

using offload::OffloadDevice;
using test::ShardedCase;

std::string case_name(const ShardedCase& c) {
  return std::string(offload::offload_device_name(c.param)) + "_" +
         std::string(offload::offload_device_name(c.optimizer)) +
         (c.staged ? "_staged" : "_on_arrival");
}

class ShardedEngineRanks : public ::testing::TestWithParam<std::tuple<int, ShardedCase>> {};

TEST_P(ShardedEngineRanks, EveryRankFetchesAndEndsBitwiseAsOneEngine) {
  const auto [size, c] = GetParam();
  zinf::test::TestDir dir;
  const test::Trace want = test::reference_trace(c, dir.subdir("reference"));
  const std::string swap_dir = dir.subdir("nvme");
  test::ThreadGroup group(size);
  group.run(/*native_reduce_scatter=*/false,
            [&](Collectives& comm) { test::check_sharded_engine(comm, c, swap_dir, want); });
  if (c.staged) {
    EXPECT_EQ(want.skipped, (std::vector<bool>{false, true, false}));
    EXPECT_LT(want.grad_scale[0], 1.0);  // clipped
    EXPECT_LT(want.grad_scale[2], 1.0);
  }
  // Each rank's swap files were in its own folder (removed with the engine; the folder stays);
  // one rank uses the directory as the plain engine does.
  const bool nvme = c.param == OffloadDevice::kNvme || c.optimizer == OffloadDevice::kNvme;
  for (int r = 0; r < size; ++r) {
    EXPECT_EQ(std::filesystem::is_directory(swap_dir + "/rank" + std::to_string(r)),
              nvme && size > 1)
        << r;
  }
}

INSTANTIATE_TEST_SUITE_P(
    WorldSizes, ShardedEngineRanks,
    ::testing::Combine(
        ::testing::Values(1, 2, 3),
        ::testing::Values(ShardedCase{OffloadDevice::kCpu, OffloadDevice::kCpu, false},
                          ShardedCase{OffloadDevice::kNvme, OffloadDevice::kNvme, true},
                          ShardedCase{OffloadDevice::kNone, OffloadDevice::kCpu, true})),
    [](const auto& p) {
      return std::to_string(std::get<0>(p.param)) + "ranks_" + case_name(std::get<1>(p.param));
    });

// Saved after two steps by three ranks and loaded by new engines: the third step is the
// uninterrupted run's, bitwise. Two ranks loading it are refused on every rank, naming both
// world sizes.
TEST(ShardedEngine, ACheckpointReloadsOnTheSameWorldSizeAndIsRefusedOnAnother) {
  const ShardedCase c{OffloadDevice::kNvme, OffloadDevice::kNvme, false};
  zinf::test::TestDir dir;
  const test::Trace want = test::reference_trace(c, dir.subdir("reference"));
  const std::string swap_dir = dir.subdir("nvme");
  const std::string ckpt = dir.file("ckpt");
  test::ThreadGroup three(3);
  three.run(false,
            [&](Collectives& comm) { test::check_sharded_engine(comm, c, swap_dir, want, ckpt); });
  EXPECT_TRUE(std::filesystem::exists(ckpt + "/zinf-sharded"));
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(std::filesystem::exists(ckpt + "/rank" + std::to_string(r) + "/zinf-sharded"));
    EXPECT_TRUE(
        std::filesystem::exists(ckpt + "/rank" + std::to_string(r) + "/zinf-engine-layers"));
  }
  test::ThreadGroup two(2);
  std::atomic<int> refused{0};
  two.run(false, [&](Collectives& comm) {
    test::RankDevice d;
    ShardedEngine e(test::sharded_config(c, swap_dir), test::sharded_layers(), *d.device,
                    d.compute.ref(), comm);
    try {
      e.load(ckpt);
      ADD_FAILURE() << "rank " << comm.rank() << " loaded a 3-rank checkpoint";
    } catch (const UsageError& ex) {
      ++refused;
      EXPECT_EQ(std::string(ex.what()),
                "ShardedEngine::load: " + ckpt +
                    "/zinf-sharded was saved by 3 ranks; this job "
                    "has 2 (loading into another world size is not supported)");
    }
  });
  EXPECT_EQ(refused.load(), 2);
}

std::shared_ptr<swap::FaultPlan> eio_on(swap::IoOp op) {
  swap::FaultRule rule;
  rule.op = op;
  rule.times = 1000;
  return std::make_shared<swap::FaultPlan>(std::vector<swap::FaultRule>{rule});
}

// Rank 1's parameter reads fail: its fetch throws its own IoError and the other ranks' fetch
// throws one naming rank 1, before any all-gather (none hangs). Its optimizer's state reads
// fail too: every rank's step throws, rank 1 its own error, the others one naming it.
TEST(ShardedEngine, ARanksFailedIoFailsEveryRankNamingIt) {
  const ShardedCase c{OffloadDevice::kNvme, OffloadDevice::kNvme, true};
  zinf::test::TestDir dir;
  const std::string swap_dir = dir.subdir("nvme");
  constexpr int kFailing = 1;
  offload::test_hooks::EngineFaults faults{eio_on(swap::IoOp::kRead), eio_on(swap::IoOp::kRead)};
  std::atomic<int> fetch_failed{0}, step_failed{0};
  test::ThreadGroup three(3);
  three.run(false, [&](Collectives& comm) {
    test::RankDevice d;
    auto e = comm.rank() == kFailing
                 ? test_hooks::make_sharded_engine_with_faults(test::sharded_config(c, swap_dir),
                                                               test::sharded_layers(), *d.device,
                                                               d.compute.ref(), comm, faults)
                 : std::make_unique<ShardedEngine>(test::sharded_config(c, swap_dir),
                                                   test::sharded_layers(), *d.device,
                                                   d.compute.ref(), comm);
    test::init_masters(*e);  // writes only: the plans fire at the first read
    const std::string others =
        "1 of 3 ranks failed (rank 1); this rank (" + std::to_string(comm.rank()) + ") did not";
    try {
      (void)e->fetch(0);
      ADD_FAILURE() << "rank " << comm.rank() << ": fetch returned";
    } catch (const IoError& ex) {
      ++fetch_failed;
      if (comm.rank() == kFailing) {
        EXPECT_NE(std::string(ex.what()).find("rank1"), std::string::npos) << ex.what();
      } else {
        EXPECT_EQ(std::string(ex.what()), "ShardedEngine::fetch failed: " + others);
      }
    }
    std::vector<std::vector<float>> grads;
    for (std::size_t l = 0; l < e->layer_count(); ++l) {
      grads.push_back(test::rank_grads(c, l, e->layer(l).numel, 1, comm.rank(), comm.size()));
      e->set_gradients(l, adam::GradView::f32(grads.back()));
    }
    try {
      (void)e->step();
      ADD_FAILURE() << "rank " << comm.rank() << ": step returned";
    } catch (const IoError& ex) {
      ++step_failed;
      if (comm.rank() != kFailing) {
        EXPECT_EQ(std::string(ex.what()), "ShardedEngine::step failed: " + others);
      }
    }
  });
  EXPECT_EQ(fetch_failed.load(), 3);
  EXPECT_EQ(step_failed.load(), 3);
  EXPECT_GT(faults.param->injected_errors(), 0u);
  EXPECT_GT(faults.optimizer->injected_errors(), 0u);
}

// A rank whose step fails before the norm's all-reduce (here: a layer still fetched) still
// joins it, so the others do not wait for it: they skip the step and throw, naming it.
TEST(ShardedEngine, ARankFailingBeforeTheNormsAllReduceDoesNotHangTheOthers) {
  const ShardedCase c{OffloadDevice::kCpu, OffloadDevice::kCpu, true};
  zinf::test::TestDir dir;
  std::atomic<int> failed{0};
  test::ThreadGroup three(3);
  three.run(false, [&](Collectives& comm) {
    test::RankDevice d;
    ShardedEngine e(test::sharded_config(c, dir.subdir("nvme")), test::sharded_layers(), *d.device,
                    d.compute.ref(), comm);
    test::init_masters(e);
    const auto before = test::read_masters(e);
    (void)e.fetch(0);
    if (comm.rank() != 1) e.release(0);
    try {
      (void)e.step();
      ADD_FAILURE() << "rank " << comm.rank() << ": step returned";
    } catch (const UsageError& ex) {
      ++failed;
      EXPECT_EQ(comm.rank(), 1) << ex.what();
    } catch (const IoError& ex) {
      ++failed;
      EXPECT_EQ(std::string(ex.what()),
                "ShardedEngine::step failed: 1 of 3 ranks failed "
                "(rank 1); this rank (" +
                    std::to_string(comm.rank()) + ") did not");
    }
    if (comm.rank() == 1) e.release(0);
    for (std::size_t l = 0; l < before.size(); ++l) {
      EXPECT_TRUE(test::same_bits(test::read_masters(e)[l], before[l])) << l;
    }
  });
  EXPECT_EQ(failed.load(), 3);
}

}  // namespace
}  // namespace zinf::dist
