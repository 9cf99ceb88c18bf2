// SPDX-License-Identifier: Apache-2.0
// ShardedOptimizer with 1-4 ranks as threads (callback collectives): every rank's full
// parameters after each step are bitwise those of one OffloadedOptimizer over the whole groups
// fed the ranks' averaged gradients (chosen so that the average is exact), on the cpu and nvme
// tiers; each rank's swap files sit in its own rank<R> folder; misuse is refused.
#include "zinf/dist/sharded_optimizer.h"

#include <algorithm>
#include <bit>
#include <array>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include "sharded_checks.h"
#include "support/log_capture.h"
#include "support/test_dir.h"
#include "thread_group.h"
#include "zinf/adam/compact_state.h"
#include "zinf/common/error.h"
#include "zinf/optim/testing.h"

namespace zinf::dist {
namespace {

using optim::StateTier;

class ShardedRanks : public ::testing::TestWithParam<std::tuple<int, StateTier, int>> {};

// At stage 2 (reduce-scattered gradients) and stage 1 (all-reduced) alike.
TEST_P(ShardedRanks, EveryRanksParametersAreBitwiseTheOneOptimizersRun) {
  const auto [size, tier, stage] = GetParam();
  const auto want = test::reference();
  zinf::test::TestDir dir;
  const std::string swap_dir = dir.subdir("nvme");
  test::ThreadGroup group(size);
  group.run(/*native_reduce_scatter=*/false, [&](Collectives& c) {
    test::check_sharded_parity(c, tier, swap_dir, want, "", stage);
  });
  // The swap files were in rank<R> folders (run_sharded_steps checks), which go with the
  // optimizers once empty: nothing is left.
  EXPECT_TRUE(std::filesystem::is_empty(swap_dir));
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, ShardedRanks,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4),
                                            ::testing::Values(StateTier::kCpu, StateTier::kNvme),
                                            ::testing::Values(2, 1)),
                         [](const auto& p) {
                           return std::to_string(std::get<0>(p.param)) + "ranks_" +
                                  std::string(optim::state_tier_name(std::get<1>(p.param))) +
                                  "_stage" + std::to_string(std::get<2>(p.param));
                         });

// Saved after two steps by three ranks and loaded by new optimizers: the third step is the
// uninterrupted run's, bitwise.
TEST(ShardedOptimizer, ACheckpointReloadsOnTheSameWorldSize) {
  const auto want = test::reference();
  zinf::test::TestDir dir;
  const std::string swap_dir = dir.subdir("nvme");
  const std::string ckpt = dir.file("ckpt");
  test::ThreadGroup three(3);
  three.run(false, [&](Collectives& c) {
    test::check_sharded_parity(c, StateTier::kNvme, swap_dir, want, ckpt);
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(std::filesystem::exists(ckpt + "/rank" + std::to_string(r) + "/zinf-sharded"));
  }
  EXPECT_TRUE(std::filesystem::exists(ckpt + "/zinf-sharded"));

  // A rank folder whose manifest names another rank: that rank refuses it, and the other two
  // throw too (the failure is all-reduced), naming the rank that failed, so none goes on alone.
  std::filesystem::copy_file(ckpt + "/rank1/zinf-sharded", ckpt + "/rank2/zinf-sharded",
                             std::filesystem::copy_options::overwrite_existing);
  std::atomic<int> thrown{0};
  three.run(false, [&](Collectives& c) {
    ShardedOptimizer opt(test::options_for(StateTier::kCpu, ""), test::groups(), c);
    try {
      opt.load(ckpt);
      ADD_FAILURE() << "rank " << c.rank() << " loaded past a bad rank folder";
    } catch (const UsageError& e) {
      ++thrown;
      EXPECT_EQ(c.rank(), 2);
      EXPECT_EQ(std::string(e.what()),
                "ShardedOptimizer::load: " + ckpt + "/rank2/zinf-sharded does not describe "
                "this rank and these groups (world size, rank, group names and sizes)");
    } catch (const IoError& e) {
      ++thrown;
      EXPECT_NE(c.rank(), 2);
      EXPECT_EQ(std::string(e.what()),
                "ShardedOptimizer::load failed: 1 of 3 ranks failed "
                "(rank 2); this rank (" +
                    std::to_string(c.rank()) + ") did not");
    }
  });
  EXPECT_EQ(thrown.load(), 3);
}

// One optimizer over the whole groups fed the base gradients of `grad_steps` (one update each),
// each update clipped to `clip` (0: not) with the global norm computed in double; the full
// parameters after each update.
std::vector<std::vector<std::vector<float>>> clipped_reference(
    const std::vector<std::uint64_t>& grad_steps, double clip) {
  const auto gs = test::groups();
  optim::OffloadedOptimizer opt(test::options_for(StateTier::kCpu, ""), gs);
  for (std::size_t g = 0; g < gs.size(); ++g) {
    opt.set_params(g, zinf::test::initial_params(g, gs[g].numel));
  }
  std::vector<std::vector<std::vector<float>>> out;
  for (const std::uint64_t t : grad_steps) {
    std::vector<std::vector<float>> grads(gs.size());
    double sum_sq = 0;
    for (std::size_t g = 0; g < gs.size(); ++g) {
      for (std::size_t i = 0; i < gs[g].numel; ++i) {
        grads[g].push_back(test::base_grad(g, i, t));
        sum_sq += static_cast<double>(grads[g].back()) * grads[g].back();
      }
    }
    opt.begin_step(optim::clip_coefficient(clip, std::sqrt(sum_sq)));
    for (std::size_t g = 0; g < gs.size(); ++g) opt.step_group(g, adam::GradView::f32(grads[g]));
    (void)opt.end_step();
    std::vector<std::vector<float>> params(gs.size());
    for (std::size_t g = 0; g < gs.size(); ++g) {
      params[g].resize(gs[g].numel);
      std::vector<float> m(gs[g].numel), v(gs[g].numel);
      opt.read_state(g, params[g], m, v);
    }
    out.push_back(std::move(params));
  }
  return out;
}

// Rank r's gradients of step t, times `scale`, and spans over them and over `params`.
struct RankStep {
  std::vector<std::vector<float>> grads, params;
  std::vector<std::span<const float>> gv;
  std::vector<std::span<float>> pv;
  RankStep(int rank, int size, std::uint64_t t, float scale) {
    const auto gs = test::groups();
    grads.resize(gs.size());
    params.resize(gs.size());
    for (std::size_t g = 0; g < gs.size(); ++g) {
      for (std::size_t i = 0; i < gs[g].numel; ++i) {
        grads[g].push_back(test::rank_grad(test::base_grad(g, i, t), rank, size) * scale);
      }
      params[g].assign(gs[g].numel, -1.0f);
      gv.emplace_back(grads[g]);
      pv.emplace_back(params[g]);
    }
  }
};

// Three ranks, loss scale 4 and clipping to 1 (the norm here is well above 1, so the
// coefficient is well below 1): every rank sees the global norm of the averaged, unscaled gradients, and the
// parameters are bitwise one optimizer's clipped run (the norm is exact in double for these
// dyadic gradients, whatever the order of the partial sums).
TEST(ShardedOptimizer, ClippingAndLossScaleUseTheGlobalNormOnEveryRank) {
  const auto want = clipped_reference({1, 2, 3}, 1.0);
  test::ThreadGroup group(3);
  group.run(false, [&](Collectives& c) {
    ShardedOptimizer opt(test::options_for(StateTier::kCpu, ""), test::groups(), c);
    const auto gs = test::groups();
    for (std::size_t g = 0; g < gs.size(); ++g) {
      opt.set_params(g, zinf::test::initial_params(g, gs[g].numel));
    }
    for (std::uint64_t t = 1; t <= 3; ++t) {
      RankStep step(c.rank(), c.size(), t, 4.0f);
      const optim::StepStats st = opt.step(step.gv, step.pv, {.clip = 1.0, .loss_scale = 4.0});
      EXPECT_FALSE(st.skipped);
      EXPECT_GT(st.global_grad_norm, 1.0);
      EXPECT_EQ(st.grad_scale_applied, optim::clip_coefficient(1.0, st.global_grad_norm) / 4);
      for (std::size_t g = 0; g < gs.size(); ++g) {
        EXPECT_EQ(step.params[g], want[t - 1][g]) << "rank " << c.rank() << " step " << t;
      }
    }
  });
}

// An inf in one rank's gradients skips the step on every rank (parameters untouched, state
// unchanged); the next step is the one optimizer's second update, bitwise.
TEST(ShardedOptimizer, AnOverflowOnOneRankSkipsTheStepOnEveryRank) {
  const auto want = clipped_reference({1, 3}, 0);
  test::ThreadGroup group(3);
  std::atomic<int> skipped{0};
  group.run(false, [&](Collectives& c) {
    ShardedOptimizer opt(test::options_for(StateTier::kCpu, ""), test::groups(), c);
    const auto gs = test::groups();
    for (std::size_t g = 0; g < gs.size(); ++g) {
      opt.set_params(g, zinf::test::initial_params(g, gs[g].numel));
    }
    for (std::uint64_t t = 1; t <= 3; ++t) {
      RankStep step(c.rank(), c.size(), t, 1.0f);
      if (t == 2 && c.rank() == 1) step.grads[1][3] = std::numeric_limits<float>::infinity();
      const optim::StepStats st = opt.step(step.gv, step.pv);
      if (t == 2) {
        EXPECT_TRUE(st.skipped) << "rank " << c.rank();
        if (st.skipped) ++skipped;
        for (const auto& p : step.params) {
          EXPECT_TRUE(std::all_of(p.begin(), p.end(), [](float x) { return x == -1.0f; }));
        }
        continue;
      }
      for (std::size_t g = 0; g < gs.size(); ++g) {
        EXPECT_EQ(step.params[g], want[t == 1 ? 0 : 1][g]) << "rank " << c.rank() << " step " << t;
      }
    }
  });
  EXPECT_EQ(skipped.load(), 3);
}

TEST(ShardedOptimizer, MisuseIsUsageError) {
  auto local = make_local_collectives();
  ShardedOptimizer opt(test::options_for(StateTier::kCpu, ""), test::groups(), *local);
  auto expect_usage = [](auto&& f, const std::string& text) {
    try {
      f();
      ADD_FAILURE() << "no throw; expected: " << text;
    } catch (const UsageError& e) {
      EXPECT_EQ(std::string(e.what()), text);
    }
  };
  expect_usage([&] { opt.set_params(0, std::vector<float>(5)); },
               "ShardedOptimizer::set_params: group 'a' has 1001 elements, got 5");
  expect_usage([&] { (void)opt.shard_numel(3); },
               "ShardedOptimizer::shard_numel: group 3 out of range (3 groups)");
  std::vector<float> g(1001), p(1001);
  std::vector<std::span<const float>> one{g};
  std::vector<std::span<float>> one_p{p};
  expect_usage([&] { (void)opt.step(one, one_p); },
               "ShardedOptimizer::step: 1 gradient and 1 parameter spans for 3 groups");
  for (const int stage : {0, 3}) {
    expect_usage(
        [&] {
          ShardedOptimizer(test::options_for(StateTier::kCpu, ""), test::groups(), *local, stage);
        },
        "ShardedOptimizer: zero_optimization.stage " + std::to_string(stage) +
            " is not a stage of a sharded optimizer: 1 (all-reduced gradients) or 2 "
            "(reduce-scattered); stage 3 also partitions the parameters (ShardedEngine)");
  }
}

// A link planted where a rank's folder goes is refused, never followed.
TEST(ShardedOptimizer, ALinkAtTheRankFolderIsRefused) {
  zinf::test::TestDir dir;
  const std::string swap_dir = dir.subdir("nvme");
  const std::string elsewhere = dir.subdir("elsewhere");
  std::filesystem::create_directory_symlink(elsewhere, swap_dir + "/rank0");
  auto local = make_local_collectives();
  try {
    ShardedOptimizer opt(test::options_for(StateTier::kNvme, swap_dir), test::groups(), *local);
    ADD_FAILURE() << "a link at the rank folder was followed";
  } catch (const IoError& e) {
    // O_NOFOLLOW with O_DIRECTORY: Linux answers ENOTDIR for a link (ELOOP elsewhere).
    EXPECT_TRUE(e.sys_errno() == ENOTDIR || e.sys_errno() == ELOOP) << e.what();
    EXPECT_NE(std::string(e.what()).find(swap_dir + "/rank0"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(std::filesystem::is_empty(elsewhere));
}

// Resharding: saved after two steps by one world size, loaded by another, the third step is
// the uninterrupted run's bitwise (so every master and both moments arrived where the new
// slices put them), on both tiers; fewer and more ranks than saved, a world larger than a
// group (7 elements over 4 ranks). The checkpoint is only read: the saving world size loads it
// again afterwards, and no scratch folder of the resharding is left behind.
class Reshard : public ::testing::TestWithParam<std::tuple<int, int, StateTier>> {};

bool scratch_left(const std::string& under) {
  if (!std::filesystem::exists(under)) return false;
  for (const auto& e : std::filesystem::recursive_directory_iterator(under)) {
    if (e.path().filename().string().rfind("zinf-reshard-", 0) == 0) return true;
  }
  return false;
}

TEST_P(Reshard, TheNextStepIsBitwiseTheUninterruptedRun) {
  const auto [saved, loaded, tier] = GetParam();
  const auto want = test::reference();
  zinf::test::TestDir dir;
  const std::string swap_dir = dir.subdir("nvme");
  const std::string ckpt = dir.file("ckpt");
  test::ThreadGroup before(saved);
  before.run(false, [&](Collectives& c) {
    test::run_sharded_steps(c, tier, swap_dir, want, 1, 2, "", ckpt);
  });
  test::ThreadGroup after(loaded);
  after.run(false, [&](Collectives& c) {
    test::run_sharded_steps(c, tier, swap_dir, want, 3, 3, ckpt, "");
  });
  EXPECT_FALSE(scratch_left(swap_dir));
  const std::string pid_prefix = "zinf-reshard-" + std::to_string(::getpid()) + "-";
  for (const auto& e :
       std::filesystem::directory_iterator(std::filesystem::temp_directory_path())) {
    EXPECT_NE(e.path().filename().string().rfind(pid_prefix, 0), 0u) << e.path();
  }
  before.run(false, [&](Collectives& c) {
    test::run_sharded_steps(c, tier, swap_dir, want, 3, 3, ckpt, "");
  });
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, Reshard,
                         ::testing::Values(std::make_tuple(3, 2, StateTier::kNvme),
                                           std::make_tuple(2, 3, StateTier::kNvme),
                                           std::make_tuple(1, 4, StateTier::kCpu),
                                           std::make_tuple(4, 1, StateTier::kNvme),
                                           std::make_tuple(3, 2, StateTier::kCpu),
                                           std::make_tuple(2, 4, StateTier::kCpu)),
                         [](const auto& p) {
                           return std::to_string(std::get<0>(p.param)) + "to" +
                                  std::to_string(std::get<1>(p.param)) + "_" +
                                  std::string(optim::state_tier_name(std::get<2>(p.param)));
                         });

// Compact moments resharded: bf16 arrives bitwise; int8 is decoded and quantised again over
// the new slices' blocks of 64, so each moment moves by at most about half a code step of its
// new block (the largest |m| / 126, the largest v / 127; the test allows 1/100 of the group's
// largest). The fp32 masters arrive bitwise in both.
class ReshardCompact : public ::testing::TestWithParam<adam::StatePrecision> {};

TEST_P(ReshardCompact, MomentsArriveBitwiseInBf16AndWithinACodeStepInInt8) {
  const adam::StatePrecision precision = GetParam();
  const auto gs = test::groups();
  zinf::test::TestDir dir;
  const std::string swap_dir = dir.subdir("nvme");
  const std::string ckpt = dir.file("ckpt");
  auto options = [&] {
    optim::OptimizerOptions o = test::options_for(StateTier::kNvme, swap_dir);
    o.state_precision = precision;
    return o;
  };
  // Every element's state as saved, decoded (each saving rank fills its own slice's range).
  std::vector<std::array<std::vector<float>, 3>> saved(gs.size());
  for (std::size_t g = 0; g < gs.size(); ++g) {
    for (auto& a : saved[g]) a.assign(gs[g].numel, 0.0f);
  }
  test::ThreadGroup three(3);
  three.run(false, [&](Collectives& c) {
    ShardedOptimizer opt(options(), gs, c);
    for (std::size_t g = 0; g < gs.size(); ++g) {
      opt.set_params(g, zinf::test::initial_params(g, gs[g].numel));
    }
    for (std::uint64_t t = 1; t <= 2; ++t) {
      std::vector<std::vector<float>> params;
      (void)test::reference_step(opt, c, t, params);
    }
    for (std::size_t g = 0; g < gs.size(); ++g) {
      const std::uint64_t s = opt.shard_numel(g);
      std::array<std::vector<float>, 3> mine;
      for (auto& a : mine) a.resize(s);
      opt.local().read_state(g, mine[0], mine[1], mine[2]);
      for (std::uint64_t i = opt.shard_offset(g);
           i < std::min(gs[g].numel, opt.shard_offset(g) + s); ++i) {
        for (int a = 0; a < 3; ++a) saved[g][a][i] = mine[a][i - opt.shard_offset(g)];
      }
    }
    opt.save(ckpt);
  });
  test::ThreadGroup two(2);
  two.run(false, [&](Collectives& c) {
    ShardedOptimizer opt(options(), gs, c);
    opt.load(ckpt);
    EXPECT_EQ(opt.local().step_count(), 2u);
    for (std::size_t g = 0; g < gs.size(); ++g) {
      const std::uint64_t s = opt.shard_numel(g);
      std::array<std::vector<float>, 3> mine;
      for (auto& a : mine) a.resize(s);
      opt.local().read_state(g, mine[0], mine[1], mine[2]);
      double largest[3] = {0, 0, 0};
      for (int a = 1; a < 3; ++a) {
        for (const float x : saved[g][a]) largest[a] = std::max(largest[a], std::abs(double{x}));
      }
      for (std::uint64_t k = 0; k < s; ++k) {
        const std::uint64_t i = opt.shard_offset(g) + k;
        const bool padding = i >= gs[g].numel;
        for (int a = 0; a < 3; ++a) {
          const float want = padding ? 0.0f : saved[g][a][i];
          if (a == 0 || precision == adam::StatePrecision::kBF16) {
            ASSERT_EQ(std::bit_cast<std::uint32_t>(mine[a][k]), std::bit_cast<std::uint32_t>(want))
                << "rank " << c.rank() << " group " << gs[g].name << " element " << i << " array "
                << a;
          } else {
            ASSERT_LE(std::abs(double{mine[a][k]} - want), largest[a] / 100)
                << "rank " << c.rank() << " group " << gs[g].name << " element " << i << " array "
                << a;
          }
        }
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Precisions, ReshardCompact,
                         ::testing::Values(adam::StatePrecision::kBF16,
                                           adam::StatePrecision::kInt8),
                         [](const auto& p) {
                           return std::string(adam::state_precision_name(p.param));
                         });

// A resharding load that cannot read a saved rank (its manifest names another rank, its folder
// is gone, a byte of its state changed) fails on every rank, the reader naming what it could
// not read and the others naming that rank, and loads nothing; a checkpoint of other
// groups is refused before anything is read.
// Ranks that read different checkpoints at their path (different file systems on different
// nodes; here, a different folder per rank): every rank refuses before any of them loads,
// whether or not one found its own world size (that rank used to load alone and leave while
// the other waited in the resharding's collectives), and no rank hangs.
TEST(ShardedOptimizer, RanksThatSeeDifferentCheckpointsAllRefuseBeforeLoading) {
  const auto want = test::reference();
  zinf::test::TestDir dir;
  const std::string swap_dir = dir.subdir("nvme");
  std::map<int, std::string> ckpt;
  for (int world : {1, 2, 3}) {
    ckpt[world] = dir.file("ckpt" + std::to_string(world));
    test::ThreadGroup group(world);
    group.run(false, [&](Collectives& c) {
      test::run_sharded_steps(c, StateTier::kCpu, swap_dir, want, 1, 2, "", ckpt.at(world));
    });
  }
  // Rank 0 reads a checkpoint of 3 ranks; rank 1 one of 2 (its own world size) or of 1.
  for (int other : {2, 1}) {
    SCOPED_TRACE("rank 1 reads a checkpoint of " + std::to_string(other));
    std::atomic<int> thrown{0};
    test::ThreadGroup two(2);
    two.run(false, [&](Collectives& c) {
      ShardedOptimizer opt(test::options_for(StateTier::kCpu, ""), test::groups(), c);
      const std::string& mine = ckpt.at(c.rank() == 0 ? 3 : other);
      try {
        opt.load(mine);
        ADD_FAILURE() << "rank " << c.rank() << " loaded";
      } catch (const UsageError& e) {
        ++thrown;
        EXPECT_EQ(std::string(e.what()),
                  "ShardedOptimizer::load: the ranks see different checkpoints at " + mine +
                      ": " + mine +
                      "/zinf-sharded on rank 1 is not rank 0's (is it the same file system on "
                      "every node, or are the node-local copies from different saves?)");
      }
      EXPECT_EQ(opt.local().step_count(), 0u);
    });
    EXPECT_EQ(thrown.load(), 2);
  }
}

TEST(ShardedOptimizer, AReshardingLoadThatCannotReadASavedRankFailsOnEveryRank) {
  const auto want = test::reference();
  zinf::test::TestDir dir;
  const std::string swap_dir = dir.subdir("nvme");
  const std::string ckpt = dir.file("ckpt");
  test::ThreadGroup three(3);
  three.run(false, [&](Collectives& c) {
    test::run_sharded_steps(c, StateTier::kCpu, swap_dir, want, 1, 2, "", ckpt);
  });

  // Saved rank 2's folder names rank 1: rank 0 of two (which reads saved ranks 0 and 2)
  // refuses it.
  std::filesystem::copy_file(ckpt + "/rank2/zinf-sharded", dir.file("rank2-manifest"));
  std::filesystem::copy_file(ckpt + "/rank1/zinf-sharded", ckpt + "/rank2/zinf-sharded",
                             std::filesystem::copy_options::overwrite_existing);
  std::atomic<int> thrown{0};
  test::ThreadGroup two(2);
  two.run(false, [&](Collectives& c) {
    ShardedOptimizer opt(test::options_for(StateTier::kCpu, ""), test::groups(), c);
    try {
      opt.load(ckpt);
      ADD_FAILURE() << "rank " << c.rank() << " loaded past a bad rank folder";
    } catch (const UsageError& e) {
      ++thrown;
      EXPECT_EQ(c.rank(), 0);
      EXPECT_EQ(std::string(e.what()),
                "ShardedOptimizer::load: " + ckpt +
                    "/rank2/zinf-sharded does not describe "
                    "rank 2 of the 3 that saved it and these groups (world size, rank, group names "
                    "and sizes)");
    } catch (const IoError& e) {
      ++thrown;
      EXPECT_EQ(c.rank(), 1);
      EXPECT_EQ(std::string(e.what()),
                "ShardedOptimizer::load failed: 1 of 2 ranks failed (rank 0); this rank (1) did "
                "not");
    }
    EXPECT_EQ(opt.local().step_count(), 0u);
  });
  EXPECT_EQ(thrown.load(), 2);
  std::filesystem::copy_file(dir.file("rank2-manifest"), ckpt + "/rank2/zinf-sharded",
                             std::filesystem::copy_options::overwrite_existing);

  // Saved rank 1's folder gone: rank 1 of two, which reads it, names it.
  std::filesystem::rename(ckpt + "/rank1", dir.file("rank1-away"));
  thrown = 0;
  two.run(false, [&](Collectives& c) {
    ShardedOptimizer opt(test::options_for(StateTier::kCpu, ""), test::groups(), c);
    try {
      opt.load(ckpt);
      ADD_FAILURE() << "rank " << c.rank() << " loaded without saved rank 1";
    } catch (const IoError& e) {
      ++thrown;
      const std::string what = e.what();
      if (c.rank() == 1) {
        EXPECT_NE(what.find(ckpt + "/rank1"), std::string::npos) << what;
        EXPECT_EQ(e.status().sys_errno(), ENOENT) << what;
      } else {
        EXPECT_EQ(what,
                  "ShardedOptimizer::load failed: 1 of 2 ranks failed (rank 1); this "
                  "rank (0) did not");
      }
    }
  });
  EXPECT_EQ(thrown.load(), 2);
  std::filesystem::rename(dir.file("rank1-away"), ckpt + "/rank1");

  // Other groups: refused by every rank from the global manifest, before any folder is read.
  thrown = 0;
  two.run(false, [&](Collectives& c) {
    std::vector<optim::ParamGroupSpec> other = test::groups();
    other[1].numel += 1;
    ShardedOptimizer opt(test::options_for(StateTier::kCpu, ""), other, c);
    try {
      opt.load(ckpt);
      ADD_FAILURE() << "rank " << c.rank() << " loaded another model's groups";
    } catch (const UsageError& e) {
      ++thrown;
      EXPECT_EQ(std::string(e.what()),
                "ShardedOptimizer::load: " + ckpt +
                    "/zinf-sharded does not describe a sharded "
                    "checkpoint of these groups (world size, rank folders, group names and sizes)");
    }
  });
  EXPECT_EQ(thrown.load(), 2);

  // A byte of saved rank 1's state changed: rank 1 of two, which reads it, fails on its
  // checksum naming the state file; the other names rank 1; neither optimizer changed.
  const std::string version = [&] {
    std::ifstream in(ckpt + "/rank1/LATEST");
    std::string line;
    std::getline(in, line);
    return line;
  }();
  const std::string state = ckpt + "/rank1/" + version + "/state.bin";
  auto flip = [&] {
    std::fstream f(state, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(100);
    const char was = static_cast<char>(f.get());
    f.seekp(100);
    f.put(static_cast<char>(was ^ 0x5a));
  };
  flip();
  thrown = 0;
  two.run(false, [&](Collectives& c) {
    ShardedOptimizer opt(test::options_for(StateTier::kCpu, ""), test::groups(), c);
    try {
      opt.load(ckpt);
      ADD_FAILURE() << "rank " << c.rank() << " loaded a corrupt saved rank";
    } catch (const IoError& e) {
      ++thrown;
      const std::string what = e.what();
      if (c.rank() == 1) {
        EXPECT_EQ(e.code(), ErrorCode::kCorrupt) << what;
        EXPECT_NE(what.find(state), std::string::npos) << what;
        EXPECT_NE(what.find("CRC32C mismatch"), std::string::npos) << what;
        // Its first record: group a's saved slice, 334 fp32 elements x 12 bytes.
        EXPECT_EQ(e.status().offset(), 0u) << what;
        EXPECT_EQ(e.status().length(), 4008u) << what;
      } else {
        EXPECT_EQ(what,
                  "ShardedOptimizer::load failed: 1 of 2 ranks failed (rank 1); this "
                  "rank (0) did not");
      }
    }
    EXPECT_EQ(opt.local().step_count(), 0u);
  });
  EXPECT_EQ(thrown.load(), 2);
  flip();  // back as saved

  // Still whole: loaded by two ranks, the third step is the uninterrupted run's.
  two.run(false, [&](Collectives& c) {
    test::run_sharded_steps(c, StateTier::kCpu, swap_dir, want, 3, 3, ckpt, "");
  });
}

// Cross-rank checkpoints (docs/reliability.md): a sharded save is one checkpoint, and a load
// reads only rank folders of the save the commit record names.

// The value of `key` in the "key value" lines of the manifest at `path`.
std::string manifest_line(const std::string& path, const std::string& key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key + " ", 0) == 0) return line.substr(key.size() + 1);
  }
  ADD_FAILURE() << path << " has no " << key;
  return "";
}

// Replaces folder `to` by a copy of `from` (nothing of `to` kept).
void replace_folder(const std::string& from, const std::string& to) {
  std::filesystem::remove_all(to);
  std::filesystem::copy(from, to, std::filesystem::copy_options::recursive);
}

// Loads `ckpt` on `world` ranks and expects every rank to refuse it before loading anything:
// the rank that reads saved rank `bad` with `message`, the others naming that rank.
// The refusal of a checkpoint whose rank<rank> folder is of save `save` at step `step` while
// its commit record names save `committed` at `committed_step`.
std::string belongs_to_other_save(const std::string& ckpt, int rank, const std::string& save,
                                  int step, const std::string& committed, int committed_step) {
  return "ShardedOptimizer::load: checkpoint " + ckpt + " is torn: " + ckpt + "/rank" +
         std::to_string(rank) + " belongs to save " + save + " step " + std::to_string(step) +
         ", " + ckpt + " (committed) is save " + committed + " step " +
         std::to_string(committed_step);
}

void expect_refused(const std::string& ckpt, int world, int bad, const std::string& message) {
  SCOPED_TRACE("loaded by " + std::to_string(world) + " ranks");
  const int reader = bad % world;
  std::atomic<int> thrown{0};
  test::ThreadGroup group(world);
  group.run(false, [&](Collectives& c) {
    ShardedOptimizer opt(test::options_for(StateTier::kCpu, ""), test::groups(), c);
    try {
      opt.load(ckpt);
      ADD_FAILURE() << "rank " << c.rank() << " loaded a torn checkpoint";
    } catch (const UsageError& e) {
      ++thrown;
      EXPECT_EQ(c.rank(), reader);
      EXPECT_EQ(std::string(e.what()), message);
    } catch (const IoError& e) {
      ++thrown;
      EXPECT_NE(c.rank(), reader);
      EXPECT_EQ(std::string(e.what()), "ShardedOptimizer::load failed: 1 of " +
                                           std::to_string(world) + " ranks failed (rank " +
                                           std::to_string(reader) + "); this rank (" +
                                           std::to_string(c.rank()) + ") did not");
    }
    EXPECT_EQ(opt.local().step_count(), 0u) << "rank " << c.rank();  // nothing loaded
  });
  EXPECT_EQ(thrown.load(), world);
}

// Two ranks save step 1 into `ckpt`, which is then copied to `first`, and save step 2 over it.
void save_steps_one_and_two(const std::string& swap_dir,
                            const std::vector<std::vector<std::vector<float>>>& want,
                            const std::string& ckpt, const std::string& first) {
  test::ThreadGroup two(2);
  two.run(false, [&](Collectives& c) {
    test::run_sharded_steps(c, StateTier::kCpu, swap_dir, want, 1, 1, "", ckpt);
  });
  std::filesystem::copy(ckpt, first, std::filesystem::copy_options::recursive);
  two.run(false, [&](Collectives& c) {
    test::run_sharded_steps(c, StateTier::kCpu, swap_dir, want, 2, 2, ckpt, ckpt);
  });
}

// A rank folder of another save than the commit record's (the earlier one, or a later one
// without the committed save's manifest and version, as saves before the two-phase commit
// left them) is refused at every world size, naming the folder, its save and the committed
// one. A kill between a rank's state commit and its manifest is not torn: the rank kept the
// committed version, which loads; without it, it is refused. Put back whole, the checkpoint
// loads at every world size and the next step is the uninterrupted run's, bitwise.
TEST(ShardedCheckpoint, ATornSaveIsRefusedAtEveryWorldSizeBeforeLoadingAnything) {
  const auto want = test::reference();
  zinf::test::TestDir dir;
  const std::string swap_dir = dir.subdir("nvme");
  const std::string ckpt = dir.file("ckpt");
  const std::string first = dir.file("first");
  save_steps_one_and_two(swap_dir, want, ckpt, first);
  const std::string second = dir.file("second");
  std::filesystem::copy(ckpt, second, std::filesystem::copy_options::recursive);
  const std::string a = manifest_line(first + "/zinf-sharded", "save");
  const std::string b = manifest_line(second + "/zinf-sharded", "save");
  ASSERT_EQ(a.size(), 32u);
  ASSERT_NE(a, b);
  EXPECT_EQ(manifest_line(second + "/zinf-sharded", "step"), "2");
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(manifest_line(second + "/rank" + std::to_string(r) + "/zinf-sharded", "save"), b);
  }

  // Rank 1's folder still the first save's (rank 0 and the commit record the second's).
  replace_folder(first + "/rank1", ckpt + "/rank1");
  for (int world : {1, 2, 3}) {
    expect_refused(ckpt, world, 1,
                   belongs_to_other_save(ckpt, 1, a, 1, b, 2));
  }

  // Killed between the ranks' commits as it happens: rank 1 has committed its folder to the
  // second save, rank 0 (and so the commit record) is still the first's.
  const std::string between = dir.file("between");
  std::filesystem::copy(first, between, std::filesystem::copy_options::recursive);
  replace_folder(second + "/rank1", between + "/rank1");
  for (int world : {1, 2, 3}) {
    expect_refused(between, world, 1,
                   belongs_to_other_save(between, 1, b, 2, a, 1));
  }

  // The first save committed, and rank 1 killed after its state's LATEST switched to the
  // second save's version but before its manifest was replaced: it kept the first save's
  // version, so LATEST is pointed back at it and the first save loads at every world size,
  // its next step the uninterrupted run's, bitwise.
  const std::string killed = dir.file("killed");
  std::filesystem::copy(first, killed, std::filesystem::copy_options::recursive);
  std::filesystem::copy(second + "/rank1", killed + "/rank1",
                        std::filesystem::copy_options::recursive |
                            std::filesystem::copy_options::overwrite_existing);
  std::filesystem::copy_file(first + "/rank1/zinf-sharded", killed + "/rank1/zinf-sharded",
                             std::filesystem::copy_options::overwrite_existing);
  std::string latest, kept;  // the second save's state version in rank 1, and the first's
  std::getline(std::ifstream(second + "/rank1/LATEST"), latest);
  std::getline(std::ifstream(first + "/rank1/LATEST"), kept);
  ASSERT_NE(latest, kept);
  for (int world : {1, 2, 3}) {
    SCOPED_TRACE("resumed on " + std::to_string(world) + " ranks");
    std::filesystem::copy_file(second + "/rank1/LATEST", killed + "/rank1/LATEST",
                               std::filesystem::copy_options::overwrite_existing);
    test::ThreadGroup group(world);
    group.run(false, [&](Collectives& c) {
      test::run_sharded_steps(c, StateTier::kCpu, swap_dir, want, 2, 2, killed, "");
    });
    std::string now;
    std::getline(std::ifstream(killed + "/rank1/LATEST"), now);
    EXPECT_EQ(now, kept);
  }
  // The resumed job's next save removes the uncommitted version that the killed one left.
  const std::string resumed = dir.file("resumed");
  std::filesystem::copy(killed, resumed, std::filesystem::copy_options::recursive);
  test::ThreadGroup two(2);
  two.run(false, [&](Collectives& c) {
    test::run_sharded_steps(c, StateTier::kCpu, swap_dir, want, 2, 2, resumed, resumed);
  });
  EXPECT_FALSE(std::filesystem::exists(resumed + "/rank1/" + latest));
  EXPECT_FALSE(std::filesystem::exists(resumed + "/rank1/" + kept));
  // Without that version (lost, not kept) the folder is torn: refused, naming it.
  std::filesystem::remove_all(killed + "/rank1/" + kept);
  for (int world : {1, 2, 3}) {
    expect_refused(killed, world, 1,
                   "ShardedOptimizer::load: checkpoint " + killed + " is torn: " + killed +
                       "/rank1 has lost state " + kept + ", which its manifest of save " + a +
                       " step 1 names; " + killed + " (committed) is save " + a + " step 1");
  }
  // A manifest whose version is not a name in the folder (".." here) is refused before LATEST
  // is touched.
  {
    std::string text;
    std::getline(std::ifstream(killed + "/rank1/zinf-sharded"), text, '\0');
    text.replace(text.find("latest " + kept), 7 + kept.size(), "latest ..");
    std::ofstream(killed + "/rank1/zinf-sharded") << text;
  }
  for (int world : {1, 2, 3}) {
    expect_refused(killed, world, 1,
                   "ShardedOptimizer::load: checkpoint " + killed + " is torn: " + killed +
                       "/rank1/zinf-sharded names no state version (" + killed +
                       " (committed) is save " + a + " step 1)");
  }

  // Whole again: every world size loads it and steps on bitwise.
  replace_folder(second + "/rank1", ckpt + "/rank1");
  for (int world : {1, 2, 3}) {
    SCOPED_TRACE("resumed on " + std::to_string(world) + " ranks");
    test::ThreadGroup group(world);
    group.run(false, [&](Collectives& c) {
      test::run_sharded_steps(c, StateTier::kCpu, swap_dir, want, 3, 3, ckpt, "");
    });
  }
}

// A kill after the commit record, while the ranks remove what the new save supersedes: rank 1
// still holds the previous save's version and manifest (zinf-sharded.previous) beside the
// new ones. Every world size loads the new save, and the next save removes what was left.
TEST(ShardedCheckpoint, AKillWhileRemovingTheSupersededSaveLoadsTheNewOne) {
  const auto want = test::reference();
  zinf::test::TestDir dir;
  const std::string swap_dir = dir.subdir("nvme");
  const std::string ckpt = dir.file("ckpt");
  const std::string first = dir.file("first");
  save_steps_one_and_two(swap_dir, want, ckpt, first);
  std::string old_version;
  std::getline(std::ifstream(first + "/rank1/LATEST"), old_version);
  std::filesystem::copy(first + "/rank1/" + old_version, ckpt + "/rank1/" + old_version,
                        std::filesystem::copy_options::recursive);
  std::filesystem::copy_file(first + "/rank1/zinf-sharded", ckpt + "/rank1/zinf-sharded.previous");
  for (int world : {1, 2, 3}) {
    SCOPED_TRACE("resumed on " + std::to_string(world) + " ranks");
    test::ThreadGroup group(world);
    group.run(false, [&](Collectives& c) {
      test::run_sharded_steps(c, StateTier::kCpu, swap_dir, want, 3, 3, ckpt, "");
    });
  }
  test::ThreadGroup two(2);
  two.run(false, [&](Collectives& c) {
    test::run_sharded_steps(c, StateTier::kCpu, swap_dir, want, 3, 3, ckpt, ckpt);
  });
  EXPECT_FALSE(std::filesystem::exists(ckpt + "/rank1/" + old_version));
  EXPECT_FALSE(std::filesystem::exists(ckpt + "/rank1/zinf-sharded.previous"));
}

// The run a rank folder's current version records (its "run <id>" line).
std::string folder_run(const std::string& folder) {
  std::string version, word, id;
  std::getline(std::ifstream(folder + "/LATEST"), version);
  std::ifstream(folder + "/" + version + "/run") >> word >> id;
  EXPECT_EQ(word, "run") << folder;
  return id;
}

// A sharded job is one run in every rank folder (rank 0's), and a resharding load goes on as the
// run it loaded, as a load at the same world size does: 3 ranks resuming a 2-rank checkpoint
// and saving into it again warn of no other run's checkpoint, and record the saved run.
TEST(ShardedCheckpoint, AJobIsOneRunInEveryFolderAndAReshardedResumeGoesOnAsIt) {
  const auto want = test::reference();
  zinf::test::TestDir dir;
  const std::string swap_dir = dir.subdir("nvme");
  const std::string ckpt = dir.file("ckpt");
  test::ThreadGroup two(2);
  two.run(false, [&](Collectives& c) {
    test::run_sharded_steps(c, StateTier::kCpu, swap_dir, want, 1, 1, "", ckpt);
  });
  const std::string run = folder_run(ckpt + "/rank0");
  ASSERT_EQ(run.size(), 32u);
  EXPECT_EQ(folder_run(ckpt + "/rank1"), run);
  zinf::test::LogCapture log;
  test::ThreadGroup three(3);
  three.run(false, [&](Collectives& c) {
    test::run_sharded_steps(c, StateTier::kCpu, swap_dir, want, 2, 2, ckpt, ckpt);
  });
  for (const std::string& line : log.lines()) {
    EXPECT_EQ(line.rfind("warning:", 0), std::string::npos) << line;
  }
  for (int r = 0; r < 3; ++r) EXPECT_EQ(folder_run(ckpt + "/rank" + std::to_string(r)), run) << r;
}

// A rank folder taken from another run (another step count; no file edited) is refused at
// every world size, naming both saves.
TEST(ShardedCheckpoint, ARankFolderFromAnotherRunIsRefused) {
  const auto want = test::reference();
  zinf::test::TestDir dir;
  const std::string swap_dir = dir.subdir("nvme");
  const std::string mine = dir.file("mine"), other = dir.file("other");
  test::ThreadGroup two(2);
  two.run(false, [&](Collectives& c) {
    test::run_sharded_steps(c, StateTier::kCpu, swap_dir, want, 1, 2, "", mine);
  });
  two.run(false, [&](Collectives& c) {
    test::run_sharded_steps(c, StateTier::kCpu, swap_dir, want, 1, 1, "", other);
  });
  const std::string a = manifest_line(mine + "/zinf-sharded", "save");
  const std::string b = manifest_line(other + "/zinf-sharded", "save");
  ASSERT_NE(a, b);
  const std::string kept = dir.file("kept");
  std::filesystem::copy(mine, kept, std::filesystem::copy_options::recursive);
  replace_folder(other + "/rank1", mine + "/rank1");
  for (int world : {1, 2, 3}) {
    expect_refused(mine, world, 1,
                   belongs_to_other_save(mine, 1, b, 1, a, 2));
  }
  // And rank 0's, the other way round.
  replace_folder(kept + "/rank1", mine + "/rank1");
  replace_folder(other + "/rank0", mine + "/rank0");
  for (int world : {1, 2}) {
    expect_refused(mine, world, 0,
                   belongs_to_other_save(mine, 0, b, 1, a, 2));
  }
}

// A save that fails on one rank (a link planted at its folder) fails on every rank, writes no
// commit record, follows no link; the rank that did write its folder kept the committed save,
// which loads (never a mix), and the next save removes what both kept.
TEST(ShardedCheckpoint, ASaveThatFailsOnOneRankFailsOnEveryRank) {
  const auto want = test::reference();
  zinf::test::TestDir dir;
  const std::string swap_dir = dir.subdir("nvme");
  const std::string ckpt = dir.file("ckpt");
  const std::string elsewhere = dir.subdir("elsewhere");
  test::ThreadGroup two(2);
  two.run(false, [&](Collectives& c) {
    test::run_sharded_steps(c, StateTier::kCpu, swap_dir, want, 1, 1, "", ckpt);
  });
  const std::string a = manifest_line(ckpt + "/zinf-sharded", "save");
  std::string committed;
  std::getline(std::ifstream(ckpt + "/zinf-sharded"), committed, '\0');
  std::filesystem::rename(ckpt + "/rank1", dir.file("rank1-away"));
  std::filesystem::create_directory_symlink(elsewhere, ckpt + "/rank1");

  std::atomic<int> thrown{0};
  two.run(false, [&](Collectives& c) {
    const auto gs = test::groups();
    ShardedOptimizer opt(test::options_for(StateTier::kCpu, ""), gs, c);
    for (std::size_t g = 0; g < gs.size(); ++g) {
      opt.set_params(g, zinf::test::initial_params(g, gs[g].numel));
    }
    try {
      opt.save(ckpt);
      ADD_FAILURE() << "rank " << c.rank() << " reported a save that failed on rank 1";
    } catch (const IoError& e) {
      ++thrown;
      const std::string what = e.what();
      if (c.rank() == 1) {
        EXPECT_TRUE(e.sys_errno() == ENOTDIR || e.sys_errno() == ELOOP) << what;
        EXPECT_NE(what.find(ckpt + "/rank1"), std::string::npos) << what;
      } else {
        EXPECT_EQ(what,
                  "ShardedOptimizer::save failed: 1 of 2 ranks failed (rank 1); this rank (0) "
                  "did not");
      }
    }
  });
  EXPECT_EQ(thrown.load(), 2);
  EXPECT_TRUE(std::filesystem::is_empty(elsewhere));
  std::string after;
  std::getline(std::ifstream(ckpt + "/zinf-sharded"), after, '\0');
  EXPECT_EQ(after, committed);  // no commit record of the failed save

  // Rank 0's folder holds the failed save, and beside it the committed one (its manifest as
  // zinf-sharded.previous, its version): the committed save loads at every world size and
  // the next step is the uninterrupted run's, bitwise.
  std::filesystem::remove(ckpt + "/rank1");
  std::filesystem::rename(dir.file("rank1-away"), ckpt + "/rank1");
  const std::string failed = manifest_line(ckpt + "/rank0/zinf-sharded", "save");
  EXPECT_NE(failed, a);
  EXPECT_EQ(manifest_line(ckpt + "/rank0/zinf-sharded.previous", "save"), a);
  for (int world : {1, 2, 3}) {
    SCOPED_TRACE("resumed on " + std::to_string(world) + " ranks");
    test::ThreadGroup group(world);
    group.run(false, [&](Collectives& c) {
      test::run_sharded_steps(c, StateTier::kCpu, swap_dir, want, 2, 2, ckpt, "");
    });
  }
  // The next save commits and removes what the committed one kept: each folder holds the
  // version its LATEST names and no zinf-sharded.previous; rank 0 also the failed save's,
  // which another run (a new optimizer, not resumed) wrote, and which no load reads.
  const std::string failed_version = manifest_line(ckpt + "/rank0/zinf-sharded", "latest");
  two.run(false, [&](Collectives& c) {
    test::run_sharded_steps(c, StateTier::kCpu, swap_dir, want, 2, 2, ckpt, ckpt);
  });
  for (int r = 0; r < 2; ++r) {
    const std::string folder = ckpt + "/rank" + std::to_string(r);
    std::string latest;
    std::getline(std::ifstream(folder + "/LATEST"), latest);
    std::set<std::string> versions;
    for (const auto& e : std::filesystem::directory_iterator(folder)) {
      if (e.is_directory()) versions.insert(e.path().filename().string());
    }
    std::set<std::string> expected{latest};
    if (r == 0) expected.insert(failed_version);
    EXPECT_EQ(versions, expected) << folder;
    EXPECT_FALSE(std::filesystem::exists(folder + "/zinf-sharded.previous")) << folder;
  }
}

// The rank folder is opened once and written through its descriptor: a link swapped in at its
// name while the save runs redirects nothing (the manifest goes where the state went).
TEST(ShardedCheckpoint, ALinkSwappedInAtTheRankFolderDuringASaveRedirectsNothing) {
  zinf::test::TestDir dir;
  const std::string ckpt = dir.file("ckpt");
  const std::string victim = dir.subdir("victim");
  auto local = make_local_collectives();
  const auto gs = test::groups();
  ShardedOptimizer opt(test::options_for(StateTier::kCpu, ""), gs, *local);
  for (std::size_t g = 0; g < gs.size(); ++g) {
    opt.set_params(g, zinf::test::initial_params(g, gs[g].numel));
  }
  bool swapped = false;
  optim::test_hooks::set_checkpoint_hook(opt.local(), [&](std::string_view phase, std::uint64_t) {
    if (phase != "created" || swapped) return;
    swapped = true;
    std::filesystem::rename(ckpt + "/rank0", dir.file("rank0-real"));
    std::filesystem::create_directory_symlink(victim, ckpt + "/rank0");
  });
  opt.save(ckpt);
  EXPECT_TRUE(swapped);
  EXPECT_TRUE(std::filesystem::is_empty(victim));
  EXPECT_TRUE(std::filesystem::exists(dir.file("rank0-real") + "/zinf-sharded"));
  EXPECT_TRUE(std::filesystem::exists(dir.file("rank0-real") + "/LATEST"));
}

// A resharding load killed before its end leaves its scratch folder; the next one removes it
// (its pid is dead and its lock free) and leaves a live one's alone; the swap folders are then
// empty and go too.
TEST(ShardedCheckpoint, AKilledReshardingLoadsScratchIsReclaimedByTheNext) {
  const auto want = test::reference();
  zinf::test::TestDir dir;
  const std::string swap_dir = dir.subdir("nvme");
  const std::string ckpt = dir.file("ckpt");
  test::ThreadGroup two(2);
  two.run(false, [&](Collectives& c) {
    test::run_sharded_steps(c, StateTier::kNvme, swap_dir, want, 1, 2, "", ckpt);
  });
  ASSERT_TRUE(std::filesystem::is_empty(swap_dir));
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  ASSERT_EQ(::waitpid(child, nullptr, 0), child);  // a pid no process has now
  const std::string stale =
      swap_dir + "/rank0/zinf-reshard-" + std::to_string(child) + "-0123456789abcdef";
  std::filesystem::create_directories(stale + "/rank1");
  std::ofstream(stale + "/rank1/left") << "x";
  const std::string live = swap_dir + "/rank0/zinf-reshard-1-0123456789abcdef";  // init's
  std::filesystem::create_directories(live);
  test::ThreadGroup one(1);
  one.run(false, [&](Collectives& c) {
    ShardedOptimizer opt(test::options_for(StateTier::kNvme, swap_dir), test::groups(), c);
    opt.load(ckpt);
    EXPECT_EQ(opt.local().step_count(), 2u);
  });
  EXPECT_FALSE(std::filesystem::exists(stale));
  EXPECT_TRUE(std::filesystem::exists(live));
  std::filesystem::remove(live);
  one.run(false, [&](Collectives& c) {
    test::run_sharded_steps(c, StateTier::kNvme, swap_dir, want, 3, 3, ckpt, "");
  });
  EXPECT_TRUE(std::filesystem::is_empty(swap_dir));
}

}  // namespace
}  // namespace zinf::dist
