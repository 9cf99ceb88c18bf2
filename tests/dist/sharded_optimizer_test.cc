// SPDX-License-Identifier: Apache-2.0
// ShardedOptimizer with 1-4 ranks as threads (callback collectives): every rank's full
// parameters after each step are bitwise those of one OffloadedOptimizer over the whole groups
// fed the ranks' averaged gradients (chosen so that the average is exact), on the cpu and nvme
// tiers; each rank's swap files sit in its own rank<R> folder; misuse is refused.
#include "zinf/dist/sharded_optimizer.h"

#include <atomic>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "sharded_checks.h"
#include "support/test_dir.h"
#include "thread_group.h"
#include "zinf/common/error.h"

namespace zinf::dist {
namespace {

using offload::StateTier;

class ShardedRanks : public ::testing::TestWithParam<std::tuple<int, StateTier>> {};

TEST_P(ShardedRanks, EveryRanksParametersAreBitwiseTheOneOptimizersRun) {
  const auto [size, tier] = GetParam();
  const auto want = test::reference();
  zinf::test::TestDir dir;
  const std::string swap_dir = dir.subdir("nvme");
  test::ThreadGroup group(size);
  group.run(/*native_reduce_scatter=*/false, [&](Collectives& c) {
    test::check_sharded_parity(c, tier, swap_dir, want);
  });
  if (tier == StateTier::kNvme) {
    for (int r = 0; r < size; ++r) {
      EXPECT_TRUE(std::filesystem::is_directory(swap_dir + "/rank" + std::to_string(r))) << r;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    WorldSizes, ShardedRanks,
    ::testing::Combine(::testing::Values(1, 2, 3, 4),
                       ::testing::Values(StateTier::kCpu, StateTier::kNvme)),
    [](const auto& p) {
      return std::to_string(std::get<0>(p.param)) + "ranks_" +
             std::string(offload::state_tier_name(std::get<1>(p.param)));
    });

// Saved after two steps by three ranks and loaded by new optimizers: the third step is the
// uninterrupted run's, bitwise. Two ranks loading it are refused on every rank, naming both
// world sizes, before anything changes.
TEST(ShardedOptimizer, ACheckpointReloadsOnTheSameWorldSizeAndIsRefusedOnAnother) {
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
  test::ThreadGroup two(2);
  std::atomic<int> refused{0};
  two.run(false, [&](Collectives& c) {
    ShardedOptimizer opt(test::options_for(StateTier::kCpu, ""), test::groups(), c);
    try {
      opt.load(ckpt);
      ADD_FAILURE() << "rank " << c.rank() << " loaded a 3-rank checkpoint";
    } catch (const UsageError& e) {
      ++refused;
      EXPECT_EQ(std::string(e.what()),
                "ShardedOptimizer::load: " + ckpt + "/zinf-sharded was saved by 3 ranks; this "
                "job has 2 (loading into another world size is not supported)");
    }
  });
  EXPECT_EQ(refused.load(), 2);
}

TEST(ShardedOptimizer, MisuseIsUsageError) {
  auto local = make_local_collectives();
  ShardedOptimizer opt(test::options_for(StateTier::kCpu, ""), test::groups(), *local);
  EXPECT_THROW(opt.set_params(0, std::vector<float>(5)), UsageError);
  EXPECT_THROW((void)opt.shard_numel(3), UsageError);
  std::vector<float> g(1001), p(1001);
  std::vector<std::span<const float>> one{g};
  std::vector<std::span<float>> one_p{p};
  EXPECT_THROW((void)opt.step(one, one_p), UsageError);  // 1 span for 3 groups
}

// A link planted where a rank's folder goes is refused, never followed.
TEST(ShardedOptimizer, ALinkAtTheRankFolderIsRefused) {
  zinf::test::TestDir dir;
  const std::string swap_dir = dir.subdir("nvme");
  const std::string elsewhere = dir.subdir("elsewhere");
  std::filesystem::create_directory_symlink(elsewhere, swap_dir + "/rank0");
  auto local = make_local_collectives();
  EXPECT_THROW(ShardedOptimizer(test::options_for(StateTier::kNvme, swap_dir), test::groups(), *local),
               IoError);
  EXPECT_TRUE(std::filesystem::is_empty(elsewhere));
}

}  // namespace
}  // namespace zinf::dist
