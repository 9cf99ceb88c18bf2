// SPDX-License-Identifier: Apache-2.0
// capacity_for and store_alignment (zinf/swap/swap_store.h): the one place a store's capacity
// is summed from its tensors' sizes, and the alignment a store will have, known before it is
// made; a store of exactly that capacity holds the tensors, and sizes that cannot be summed
// are refused with the exact message.
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "support/test_dir.h"
#include "zinf/common/error.h"
#include "zinf/swap/io_engine.h"
#include "zinf/swap/swap_store.h"

namespace zinf::swap {
namespace {

constexpr std::uint32_t kStripe = 1u << 20;

TEST(StoreSizing, EachTensorIsPaddedToItsAlignmentAndRoundedToWholeStripes) {
  const std::vector<std::uint64_t> sizes = {1, 4096, kStripe, kStripe + 1, 3 * kStripe - 7};
  EXPECT_EQ(capacity_for(sizes, kStripe, 4096),
            std::uint64_t{kStripe} * (1 + 1 + 1 + 2 + 3));
  EXPECT_EQ(capacity_for({}, kStripe, 4096), 0u);
  // A stripe smaller than the alignment: the padded size is rounded again.
  const std::vector<std::uint64_t> one = {5000};
  EXPECT_EQ(capacity_for(one, 4096, 8192), 8192u);
}

TEST(StoreSizing, AStoreOfThatCapacityHoldsEveryTensor) {
  test::TestDir dir;
  SwapStoreOptions so;
  so.directories = {dir.subdir("nvme")};
  const std::vector<std::uint64_t> sizes = {1000, kStripe + 4097, 2 * kStripe, 70000};
  so.capacity_bytes = capacity_for(sizes, so.stripe_bytes, store_alignment(so.directories));
  IoOptions io;
  io.kind = IoEngineKind::kThreads;
  auto engine = make_io_engine(io);
  SwapStore store(so, *engine);
  EXPECT_GE(store.alignment(), 4096u);
  EXPECT_EQ(store.alignment(), store_alignment(so.directories));
  for (std::size_t i = 0; i < sizes.size(); ++i) store.allocate("t" + std::to_string(i), sizes[i]);
  EXPECT_EQ(store_alignment(so.directories, /*direct_io=*/false), 4096u);
}

TEST(StoreSizing, SizesThatCannotBeSummedAreRefused) {
  const std::vector<std::uint64_t> one = {1};
  try {
    (void)capacity_for(one, 0, 4096);
    ADD_FAILURE() << "no throw";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()),
              "capacity_for: stripe_bytes 0 and alignment 4096 must be > 0");
  }
  const std::vector<std::uint64_t> huge = {std::numeric_limits<std::uint64_t>::max() - 10};
  try {
    (void)capacity_for(huge, kStripe, 4096);
    ADD_FAILURE() << "no throw";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()),
              "capacity_for: the tensors' padded sizes do not fit in 64 bits");
  }
  const std::vector<std::uint64_t> two = {std::uint64_t{1} << 63, std::uint64_t{1} << 63};
  EXPECT_THROW((void)capacity_for(two, kStripe, 4096), UsageError);
}

}  // namespace
}  // namespace zinf::swap
