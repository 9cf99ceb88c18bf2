// SPDX-License-Identifier: Apache-2.0
// ShardedEngine with 1-3 ranks as threads (callback collectives): every rank fetches, before
// every step, bitwise the full layers one OffloadEngine fetches when fed the averaged gradients,
// skips the same steps and ends with bitwise its master weights, on the cpu and nvme tiers and
// in both step modes (staged: clipped on the global norm, an overflow on one rank skipped by
// all); a checkpoint reloads on the same world size and is refused on another; one rank's failed
// I/O fails every rank, naming it. Gradients are handed in from host or device memory, fp32,
// bf16 or fp16 (device fp32 over device collectives moves only the rank's slice to the host;
// misused device gradients are refused on their rank before any collective). Each case runs
// twice: over collectives on host memory, and over collectives on device memory (each rank's a
// host simulation, whose callbacks fail the test for any buffer that is not that device's), the
// NCCL adapter's kind.
#include "zinf/dist/sharded_engine.h"

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <ostream>
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

// gtest shows a MemoryKind parameter by name (found by ADL, so in MemoryKind's namespace).
inline void PrintTo(MemoryKind m, std::ostream* os) {
  *os << (m == MemoryKind::kDevice ? "device" : "host");
}

namespace {

using offload::OffloadDevice;
using test::GradPlace;
using test::ShardedCase;

// The memory kinds every test below runs over, with the name gtest shows.
const auto kMemoryKinds = ::testing::Values(MemoryKind::kHost, MemoryKind::kDevice);
std::string memory_param_name(const ::testing::TestParamInfo<MemoryKind>& p) {
  return ::testing::PrintToString(p.param);
}

class ShardedEngineRanks
    : public ::testing::TestWithParam<std::tuple<MemoryKind, int, ShardedCase>> {};

TEST_P(ShardedEngineRanks, EveryRankFetchesAndEndsBitwiseAsOneEngine) {
  const auto [memory, size, c] = GetParam();
  zinf::test::TestDir dir;
  const test::Trace want = test::reference_trace(c, dir.subdir("reference"));
  const std::string swap_dir = dir.subdir("nvme");
  test::ThreadGroup group(size);
  group.run(memory, [&](Collectives& comm, cuda::Device& device) {
    test::RankDevice d(device);
    test::check_sharded_engine(comm, d, c, swap_dir, want);
  });
  if (c.staged) {
    EXPECT_EQ(want.skipped, (std::vector<bool>{false, true, false}));
    EXPECT_LT(want.grad_scale[0], 1.0);  // clipped
    EXPECT_LT(want.grad_scale[2], 1.0);
  }
  // Each rank's swap files were in its own folder, removed with the engine once empty (one
  // rank uses the directory as the plain engine does): nothing is left.
  EXPECT_TRUE(std::filesystem::is_empty(swap_dir));
}

INSTANTIATE_TEST_SUITE_P(
    WorldSizes, ShardedEngineRanks,
    ::testing::Combine(
        kMemoryKinds, ::testing::Values(1, 2, 3),
        ::testing::Values(ShardedCase{OffloadDevice::kCpu, OffloadDevice::kCpu, false},
                          ShardedCase{OffloadDevice::kNvme, OffloadDevice::kNvme, true},
                          ShardedCase{OffloadDevice::kNone, OffloadDevice::kCpu, true},
                          // Device gradients: fp32 (reduce-scattered in place by a
                          // device-memory backend where the layer needs no padding), and
                          // bf16/fp16, widened on the host, in both step modes.
                          ShardedCase{OffloadDevice::kCpu, OffloadDevice::kCpu, false,
                                      GradPlace::kDevice, ElementType::kF32},
                          ShardedCase{OffloadDevice::kNone, OffloadDevice::kCpu, true,
                                      GradPlace::kDevice, ElementType::kF32},
                          ShardedCase{OffloadDevice::kCpu, OffloadDevice::kCpu, false,
                                      GradPlace::kDevice, ElementType::kBF16},
                          ShardedCase{OffloadDevice::kNvme, OffloadDevice::kNvme, true,
                                      GradPlace::kDevice, ElementType::kF16},
                          ShardedCase{OffloadDevice::kCpu, OffloadDevice::kCpu, true,
                                      GradPlace::kHost, ElementType::kBF16},
                          // Stages 1 and 2: whole parameters on every rank, refreshed once a
                          // step; gradients all-reduced (1) or reduce-scattered (2), from the
                          // host or the device (fp32 in place over device collectives at stage
                          // 2; stage 1 takes the host path), with either optimizer tier, the
                          // staged overflow skipped by all and dynamic loss scaling.
                          ShardedCase{OffloadDevice::kNone, OffloadDevice::kCpu, false,
                                      GradPlace::kHost, ElementType::kF32, false, 2},
                          ShardedCase{OffloadDevice::kNone, OffloadDevice::kCpu, true,
                                      GradPlace::kHost, ElementType::kF32, false, 1},
                          ShardedCase{OffloadDevice::kNone, OffloadDevice::kCpu, true,
                                      GradPlace::kDevice, ElementType::kF32, true, 2},
                          ShardedCase{OffloadDevice::kNone, OffloadDevice::kNvme, false,
                                      GradPlace::kDevice, ElementType::kF32, false, 1},
                          ShardedCase{OffloadDevice::kNone, OffloadDevice::kNvme, true,
                                      GradPlace::kHost, ElementType::kBF16, false, 2})),
    [](const auto& p) {
      return ::testing::PrintToString(std::get<0>(p.param)) + "_" + std::to_string(std::get<1>(p.param)) +
             "ranks_" + test::case_name(std::get<2>(p.param));
    });

class ShardedEngineGroup : public ::testing::TestWithParam<MemoryKind> {};

// Saved after two steps by three ranks and loaded by new engines: the third step is the
// uninterrupted run's, bitwise.
TEST_P(ShardedEngineGroup, ACheckpointReloadsOnTheSameWorldSize) {
  const ShardedCase c{OffloadDevice::kNvme, OffloadDevice::kNvme, false};
  zinf::test::TestDir dir;
  const test::Trace want = test::reference_trace(c, dir.subdir("reference"));
  const std::string swap_dir = dir.subdir("nvme");
  const std::string ckpt = dir.file("ckpt");
  test::ThreadGroup three(3);
  three.run(GetParam(), [&](Collectives& comm, cuda::Device& device) {
    test::RankDevice d(device);
    test::check_sharded_engine(comm, d, c, swap_dir, want, ckpt);
  });
  EXPECT_TRUE(std::filesystem::exists(ckpt + "/zinf-sharded"));
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(std::filesystem::exists(ckpt + "/rank" + std::to_string(r) + "/zinf-sharded"));
    EXPECT_TRUE(
        std::filesystem::exists(ckpt + "/rank" + std::to_string(r) + "/zinf-engine-layers"));
  }
}

// A save that fails on one rank (a link planted at its folder) fails on every rank and leaves
// the committed checkpoint: rank 0, whose folder holds the failed save, kept the committed
// one beside it (manifest, engine version with its loss scale), which loads, and the third
// step is the uninterrupted run's, bitwise (issue #52: it used to be refused as torn).
TEST_P(ShardedEngineGroup, ASaveThatFailsOnOneRankLeavesTheCommittedCheckpoint) {
  const ShardedCase c{OffloadDevice::kNone,
                      OffloadDevice::kCpu,
                      true,
                      GradPlace::kDevice,
                      ElementType::kF32,
                      true,
                      2};
  zinf::test::TestDir dir;
  const test::Trace want = test::reference_trace(c, dir.subdir("reference"));
  const std::string swap_dir = dir.subdir("nvme");
  const std::string ckpt = dir.file("ckpt");
  const std::string elsewhere = dir.subdir("elsewhere");
  test::ThreadGroup two(2);
  two.run(GetParam(), [&](Collectives& comm, cuda::Device& device) {
    test::RankDevice d(device);
    test::check_sharded_engine_steps(comm, d, c, swap_dir, want, 1, test::kSteps - 1, "", ckpt);
  });
  std::filesystem::rename(ckpt + "/rank1", dir.file("rank1-away"));
  std::filesystem::create_directory_symlink(elsewhere, ckpt + "/rank1");
  std::atomic<int> thrown{0};
  two.run(GetParam(), [&](Collectives& comm, cuda::Device& device) {
    test::RankDevice d(device);
    ShardedEngine e(test::sharded_config(c, swap_dir), test::sharded_layers(), *d.device,
                    d.compute.ref(), comm);
    test::init_masters(e);
    try {
      e.save(ckpt);
      ADD_FAILURE() << "rank " << comm.rank() << " reported a save that failed on rank 1";
    } catch (const IoError&) {
      ++thrown;
    }
  });
  EXPECT_EQ(thrown.load(), 2);
  EXPECT_TRUE(std::filesystem::is_empty(elsewhere));
  std::filesystem::remove(ckpt + "/rank1");
  std::filesystem::rename(dir.file("rank1-away"), ckpt + "/rank1");
  EXPECT_TRUE(std::filesystem::exists(ckpt + "/rank0/zinf-sharded.previous"));
  two.run(GetParam(), [&](Collectives& comm, cuda::Device& device) {
    test::RankDevice d(device);
    test::check_sharded_engine_steps(comm, d, c, swap_dir, want, test::kSteps, test::kSteps, ckpt,
                                     "");
  });
}

// Resharding: saved after two steps by one world size, loaded by another, the third step's
// fetches, its skip verdict and clipping factor and the final masters are the uninterrupted
// 1-rank run's, bitwise; on host and device memory; the staged case with an overflow skipped
// in step 2 and dynamic loss scaling (halved there: the loaded engines must have saved rank
// 0's scale, or the third step's unscaling differs). No scratch folder is left.
class ShardedEngineReshard
    : public ::testing::TestWithParam<std::tuple<MemoryKind, int, int, ShardedCase>> {};

TEST_P(ShardedEngineReshard, TheNextStepIsBitwiseTheUninterruptedRun) {
  const auto [memory, saved, loaded, c] = GetParam();
  zinf::test::TestDir dir;
  const test::Trace want = test::reference_trace(c, dir.subdir("reference"));
  const std::string swap_dir = dir.subdir("nvme");
  const std::string ckpt = dir.file("ckpt");
  test::ThreadGroup before(saved);
  before.run(memory, [&](Collectives& comm, cuda::Device& device) {
    test::RankDevice d(device);
    test::check_sharded_engine_steps(comm, d, c, swap_dir, want, 1, test::kSteps - 1, "", ckpt);
  });
  test::ThreadGroup after(loaded);
  std::atomic<int> scaled{0};
  after.run(memory, [&](Collectives& comm, cuda::Device& device) {
    test::RankDevice d(device);
    if (c.dynamic_scale) {
      // The scale the loaded engine starts from: the saved one (2^4 halved by step 2's
      // overflow), not the config's 2^4.
      ShardedEngine e(test::sharded_config(c, swap_dir), test::sharded_layers(), *d.device,
                      d.compute.ref(), comm);
      e.load(ckpt);
      if (e.local().loss_scale() == 8.0) ++scaled;
    }
    test::check_sharded_engine_steps(comm, d, c, swap_dir, want, test::kSteps, test::kSteps, ckpt,
                                     "");
  });
  if (c.dynamic_scale) {
    EXPECT_EQ(scaled.load(), loaded);
  }
  for (const auto& e : std::filesystem::recursive_directory_iterator(swap_dir)) {
    EXPECT_NE(e.path().filename().string().rfind("zinf-reshard-", 0), 0u) << e.path();
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, ShardedEngineReshard,
    ::testing::Combine(
        kMemoryKinds, ::testing::Values(3), ::testing::Values(2),
        ::testing::Values(ShardedCase{OffloadDevice::kCpu, OffloadDevice::kCpu, false},
                          ShardedCase{OffloadDevice::kNvme, OffloadDevice::kNvme, true,
                                      GradPlace::kHost, ElementType::kF32, true})),
    [](const auto& p) {
      return ::testing::PrintToString(std::get<0>(p.param)) + "_" +
             std::to_string(std::get<1>(p.param)) + "to" + std::to_string(std::get<2>(p.param)) +
             "_" + test::case_name(std::get<3>(p.param));
    });

INSTANTIATE_TEST_SUITE_P(
    MoreRanks, ShardedEngineReshard,
    ::testing::Combine(
        ::testing::Values(MemoryKind::kHost), ::testing::Values(1, 2), ::testing::Values(3),
        ::testing::Values(ShardedCase{OffloadDevice::kNone, OffloadDevice::kCpu, true},
                          ShardedCase{OffloadDevice::kNvme, OffloadDevice::kNvme, true,
                                      GradPlace::kHost, ElementType::kF32, true})),
    [](const auto& p) {
      return ::testing::PrintToString(std::get<0>(p.param)) + "_" +
             std::to_string(std::get<1>(p.param)) + "to" + std::to_string(std::get<2>(p.param)) +
             "_" + test::case_name(std::get<3>(p.param));
    });

// A checkpoint saved at one ZeRO stage loads at another (the checkpoint holds the same slices
// at every stage), on another world size too: the third step's fetches, verdicts and clipping
// factors and the final masters are the uninterrupted 1-rank run's, bitwise. Staged, with
// step 2's overflow and dynamic loss scaling.
struct StageChange {
  int saved_world, saved_stage, loaded_world, loaded_stage;
  OffloadDevice saved_param = OffloadDevice::kNone;
};
class ShardedEngineStageChange : public ::testing::TestWithParam<StageChange> {};

TEST_P(ShardedEngineStageChange, TheNextStepIsBitwiseTheUninterruptedRun) {
  const StageChange p = GetParam();
  ShardedCase saved{p.saved_param, OffloadDevice::kCpu, true, GradPlace::kHost, ElementType::kF32,
                    true,          p.saved_stage};
  ShardedCase loaded = saved;
  loaded.param = OffloadDevice::kNone;
  loaded.stage = p.loaded_stage;
  zinf::test::TestDir dir;
  const test::Trace want = test::reference_trace(loaded, dir.subdir("reference"));
  const std::string swap_dir = dir.subdir("nvme");
  const std::string ckpt = dir.file("ckpt");
  test::ThreadGroup before(p.saved_world);
  before.run(MemoryKind::kHost, [&](Collectives& comm, cuda::Device& device) {
    test::RankDevice d(device);
    test::check_sharded_engine_steps(comm, d, saved, swap_dir, want, 1, test::kSteps - 1, "", ckpt);
  });
  test::ThreadGroup after(p.loaded_world);
  after.run(MemoryKind::kHost, [&](Collectives& comm, cuda::Device& device) {
    test::RankDevice d(device);
    test::check_sharded_engine_steps(comm, d, loaded, swap_dir, want, test::kSteps, test::kSteps,
                                     ckpt, "");
  });
}

INSTANTIATE_TEST_SUITE_P(Stages, ShardedEngineStageChange,
                         ::testing::Values(StageChange{2, 2, 2, 3}, StageChange{3, 3, 2, 1},
                                           StageChange{2, 1, 3, 2},
                                           // Parameters offloaded at stage 3, resident at stage 2.
                                           StageChange{3, 3, 3, 2, OffloadDevice::kCpu}),
                         [](const auto& p) {
                           const StageChange& c = p.param;
                           return std::to_string(c.saved_world) + "ranks_stage" +
                                  std::to_string(c.saved_stage) +
                                  (c.saved_param == OffloadDevice::kNone ? "" : "_cpu_params") +
                                  "_to_" + std::to_string(c.loaded_world) + "ranks_stage" +
                                  std::to_string(c.loaded_stage);
                         });

// Stage 0 on several ranks is refused at construction, naming the key; parameter offload below
// stage 3 too (a config built in code, which parse_config never checked).
TEST(ShardedEngineStage, StageZeroAndParameterOffloadBelowThreeAreRefusedOnSeveralRanks) {
  zinf::test::TestDir dir;
  test::ThreadGroup two(2);
  two.run(MemoryKind::kHost, [&](Collectives& comm, cuda::Device& device) {
    test::RankDevice d(device);
    ShardedCase c{OffloadDevice::kNone, OffloadDevice::kCpu, false};
    c.stage = 0;
    try {
      ShardedEngine e(test::sharded_config(c, dir.path()), test::sharded_layers(), *d.device,
                      d.compute.ref(), comm);
      ADD_FAILURE() << "stage 0 on 2 ranks was accepted";
    } catch (const UsageError& e) {
      EXPECT_EQ(std::string(e.what()),
                "ShardedEngine: zero_optimization.stage 0 on 2 ranks: plain data parallelism is "
                "not offered; set zero_optimization.stage to 1 or 2 (each rank keeps 1/N of the "
                "optimizer state) or 3 (and of the parameters)");
    }
    c.stage = 2;
    c.param = OffloadDevice::kCpu;
    try {
      ShardedEngine e(test::sharded_config(c, dir.path()), test::sharded_layers(), *d.device,
                      d.compute.ref(), comm);
      ADD_FAILURE() << "parameter offload at stage 2 was accepted";
    } catch (const UsageError& e) {
      EXPECT_EQ(std::string(e.what()),
                "ShardedEngine: zero_optimization.offload_param (\"cpu\") needs "
                "zero_optimization.stage 3, but stage is 2");
    }
  });
  // One rank is the plain engine, whatever the stage.
  auto alone = make_local_collectives();
  test::RankDevice d;
  ShardedCase c{OffloadDevice::kNone, OffloadDevice::kCpu, false};
  c.stage = 0;
  ShardedEngine e(test::sharded_config(c, dir.path()), test::sharded_layers(), *d.device,
                  d.compute.ref(), *alone);
  EXPECT_EQ(e.zero_stage(), 0);
}

// Stage 2 keeps every layer whole on every rank: fetches move nothing, and two fetches of a
// layer in one step (forward and backward) return the same bytes; the one all-gather comes
// after the step.
TEST(ShardedEngineStage, StageTwoFetchesWithoutCollectives) {
  zinf::test::TestDir dir;
  test::ThreadGroup three(3);
  three.run(MemoryKind::kHost, [&](Collectives& comm, cuda::Device& device) {
    test::RankDevice d(device);
    ShardedCase c{OffloadDevice::kNone, OffloadDevice::kCpu, false};
    c.stage = 2;
    ShardedEngine e(test::sharded_config(c, dir.path()), test::sharded_layers(), *d.device,
                    d.compute.ref(), comm);
    test::init_masters(e);
    const auto layers = test::sharded_layers();
    std::vector<std::vector<float>> grads(layers.size());
    for (std::size_t l = 0; l < layers.size(); ++l) {
      const auto forward = test::fetch_bytes(e, d, l, layers[l]);
      EXPECT_EQ(test::fetch_bytes(e, d, l, layers[l]), forward) << layers[l].name;
      grads[l] = test::rank_grads(c, l, layers[l].numel, 1, comm.rank(), comm.size());
      e.set_gradients(l, adam::GradView::f32(grads[l]));
    }
    const offload::StepStats st = e.step();
    EXPECT_EQ(st.allgather_bytes, test::expected_collective_bytes(c, 3, false)[0]);
    // Each rank keeps its slices of the optimizer state only.
    for (std::size_t l = 0; l < layers.size(); ++l) {
      EXPECT_EQ(e.local().layer(l).numel, (layers[l].numel + 2) / 3);
    }
  });
}

// One rank's engine of case `c` on its thread's device, its master weights set.
struct RankEngine {
  RankEngine(Collectives& comm, cuda::Device& device, const ShardedCase& c,
             const std::string& swap_dir)
      : d(device),
        e(test::sharded_config(c, swap_dir), test::sharded_layers(), *d.device, d.compute.ref(),
          comm) {
    test::init_masters(e);
  }
  test::RankDevice d;
  ShardedEngine e;
};

std::shared_ptr<swap::FaultPlan> eio_on(swap::IoOp op) {
  swap::FaultRule rule;
  rule.op = op;
  rule.times = 1000;
  return std::make_shared<swap::FaultPlan>(std::vector<swap::FaultRule>{rule});
}

// Rank 1's parameter reads fail: its fetch throws its own IoError and the other ranks' fetch
// throws one naming rank 1, before any all-gather (none hangs). Its optimizer's state reads
// fail too: every rank's step throws, rank 1 its own error, the others one naming it.
TEST_P(ShardedEngineGroup, ARanksFailedIoFailsEveryRankNamingIt) {
  const ShardedCase c{OffloadDevice::kNvme, OffloadDevice::kNvme, true};
  zinf::test::TestDir dir;
  const std::string swap_dir = dir.subdir("nvme");
  constexpr int kFailing = 1;
  offload::test_hooks::EngineFaults faults{eio_on(swap::IoOp::kRead), eio_on(swap::IoOp::kRead)};
  std::atomic<int> fetch_failed{0}, step_failed{0};
  test::ThreadGroup three(3);
  three.run(GetParam(), [&](Collectives& comm, cuda::Device& device) {
    test::RankDevice d(device);
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
TEST_P(ShardedEngineGroup, ARankFailingBeforeTheNormsAllReduceDoesNotHangTheOthers) {
  const ShardedCase c{OffloadDevice::kCpu, OffloadDevice::kCpu, true};
  zinf::test::TestDir dir;
  std::atomic<int> failed{0};
  test::ThreadGroup three(3);
  three.run(GetParam(), [&](Collectives& comm, cuda::Device& device) {
    RankEngine mine(comm, device, c, dir.subdir("nvme"));
    ShardedEngine& e = mine.e;
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

// The bytes device gradients move between host and device, fp32 on a layer no rank pads (2048
// elements over 2 ranks): a device-memory backend reduce-scatters them where they are and only
// this rank's averaged slice comes to the host (plus the failure flags, one int32 a rank, each
// way); a host-memory backend copies them to the host whole, and nothing goes back.
TEST_P(ShardedEngineGroup, DeviceGradientsMoveOnlyTheSliceOverADeviceBackend) {
  const ShardedCase c{OffloadDevice::kNone, OffloadDevice::kCpu, false, GradPlace::kDevice};
  constexpr std::size_t kProj = 2;
  zinf::test::TestDir dir;
  test::ThreadGroup two(2);
  two.run(GetParam(), [&](Collectives& comm, cuda::Device& device) {
    RankEngine mine(comm, device, c, dir.subdir("nvme"));
    test::RankDevice& d = mine.d;
    ShardedEngine& e = mine.e;
    const std::uint64_t numel = e.layer(kProj).numel;
    ASSERT_EQ(numel % 2, 0u);
    const std::vector<float> g = test::rank_grads(c, kProj, numel, 1, comm.rank(), comm.size());
    cuda::DeviceBuffer buf = d.device->allocate(numel * sizeof(float));
    d.device->copy_to_device(d.compute.ref(), buf.span(), std::as_bytes(std::span(g)));
    const cuda::DeviceStats before = d.device->stats();
    e.set_gradients(kProj, buf.span(), ElementType::kF32);
    const cuda::DeviceStats after = d.device->stats();
    const std::uint64_t flags = 2 * sizeof(std::int32_t);
    if (GetParam() == MemoryKind::kDevice) {
      EXPECT_EQ(after.bytes_to_host - before.bytes_to_host, numel / 2 * sizeof(float) + flags);
      EXPECT_EQ(after.bytes_to_device - before.bytes_to_device, flags);
    } else {
      EXPECT_EQ(after.bytes_to_host - before.bytes_to_host, numel * sizeof(float));
      EXPECT_EQ(after.bytes_to_device - before.bytes_to_device, 0u);
    }
    (void)e.step();
  });
}

// A rank that hands in device gradients of the wrong size or dtype, none, another device's, or
// twice is refused with its rank in the text before any collective: it then hands them in
// right, the others (never left waiting in a collective with it) step with it, and every rank
// ends with bitwise the masters one OffloadEngine has after the same step.
TEST_P(ShardedEngineGroup, MisusedDeviceGradientsAreRefusedOnTheirRankBeforeAnyCollective) {
  const ShardedCase c{OffloadDevice::kCpu, OffloadDevice::kCpu, false, GradPlace::kDevice};
  constexpr int kMisusing = 1;
  zinf::test::TestDir dir;
  test::Trace want;
  {
    test::RankDevice d;
    offload::OffloadEngine ref(test::sharded_config(c, dir.subdir("reference")),
                               test::sharded_layers(), *d.device, d.compute.ref());
    test::init_masters(ref);
    test::run_steps(ref, d, c, 0, 0, 1, 1, want);
    want.masters = test::read_masters(ref);
  }
  std::atomic<int> refused{0};
  test::ThreadGroup three(3);
  three.run(GetParam(), [&](Collectives& comm, cuda::Device& device) {
    RankEngine mine(comm, device, c, dir.subdir("nvme"));
    test::RankDevice& d = mine.d;
    ShardedEngine& e = mine.e;
    auto refusal = [&](auto&& f) {
      try {
        f();
      } catch (const UsageError& err) {
        ++refused;
        return std::string(err.what());
      }
      return std::string("no UsageError");
    };
    std::vector<cuda::DeviceBuffer> bufs;
    std::vector<std::vector<float>> grads;
    for (std::size_t l = 0; l < e.layer_count(); ++l) {
      grads.push_back(test::rank_grads(c, l, e.layer(l).numel, 1, comm.rank(), comm.size()));
      bufs.push_back(d.device->allocate(grads.back().size() * sizeof(float)));
      d.device->copy_to_device(d.compute.ref(), bufs.back().span(),
                               std::as_bytes(std::span(grads.back())));
      const cuda::DeviceSpan span = bufs.back().span();
      if (comm.rank() == kMisusing && l == 0) {
        const std::string at = "ShardedEngine::set_gradients: layer 'embed' ";
        EXPECT_EQ(refusal([&] { e.set_gradients(0, span.subspan(0, 4000), ElementType::kF32); }),
                  at + "has 1001 elements, got 4000 bytes of fp32 gradients in device memory "
                       "(rank 1)");
        EXPECT_EQ(refusal([&] { e.set_gradients(0, span, ElementType::kBF16); }),
                  at + "has 1001 elements, got 4004 bytes of bf16 gradients in device memory "
                       "(rank 1)");
        EXPECT_EQ(refusal([&] { e.set_gradients(0, cuda::DeviceSpan(), ElementType::kF32); }),
                  at + "has 1001 elements, got 0 bytes of fp32 gradients in device memory "
                       "(rank 1)");
        // A value outside ElementType (sized as a 2-byte type), refused before the size check;
        // a host view of a reduction-only type, by check_buffer_type's text.
        adam::GradView wide = adam::GradView::f32(grads.back());
        wide.dtype = ElementType::kF64;
        EXPECT_EQ(refusal([&] { e.set_gradients(0, wide); }),
                  "ShardedEngine::set_gradients: gradients: element type fp64 is not a buffer "
                  "type (fp32, bf16 or fp16)");
        EXPECT_EQ(refusal([&] {
                    e.set_gradients(0, span.subspan(0, 2002), static_cast<ElementType>(99));
                  }),
                  "ShardedEngine::set_gradients: unknown gradient dtype for layer 'embed' (rank "
                  "1)");
        cuda::DeviceOptions o;
        o.kind = cuda::DeviceKind::kHost;
        auto other = cuda::make_device(o);
        cuda::DeviceBuffer foreign = other->allocate(span.size());
        EXPECT_EQ(refusal([&] { e.set_gradients(0, foreign.span(), ElementType::kF32); }),
                  "ShardedEngine::set_gradients: layer 'embed': the gradients are not in the "
                  "memory of device " +
                      std::string(d.device->name()) + " (rank 1)");
      }
      e.set_gradients(l, span, ElementType::kF32);
      if (comm.rank() == kMisusing && l == 0) {
        EXPECT_EQ(refusal([&] { e.set_gradients(0, span, ElementType::kF32); }),
                  "ShardedEngine::set_gradients: layer 'embed' already has gradients for this "
                  "step");
      }
    }
    (void)e.step();
    const auto masters = test::read_masters(e);
    for (std::size_t l = 0; l < masters.size(); ++l) {
      EXPECT_TRUE(test::same_bits(masters[l], want.masters[l]))
          << "rank " << comm.rank() << ": master weights of layer " << l;
    }
  });
  EXPECT_EQ(refused.load(), 7);
}

INSTANTIATE_TEST_SUITE_P(Memory, ShardedEngineGroup, kMemoryKinds, memory_param_name);

}  // namespace
}  // namespace zinf::dist
