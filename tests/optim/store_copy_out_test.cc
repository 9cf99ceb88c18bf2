// SPDX-License-Identifier: Apache-2.0
// OffloadedOptimizer::step_group with a StoreCopyOut: the updated bf16/fp16 parameters land in
// a parameter SwapStore key byte for byte as the caller-buffer copy-out writes them, on both
// tiers; the pinned staging is in the budget; the store's range rules are checked up front with
// a message naming a sub-group size that works.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "optimizer_test_util.h"
#include "support/test_dir.h"
#include "zinf/common/error.h"
#include "zinf/optim/optimizer.h"
#include "zinf/swap/buffer_pool.h"
#include "zinf/swap/swap_store.h"

namespace zinf::optim {
namespace {

constexpr std::uint64_t kSub = 2048;  // 4096 bytes of bf16: one alignment unit

std::vector<ParamGroupSpec> groups() { return {{"a", 3 * kSub + 5}, {"b", 100}, {"c", 2 * kSub}}; }

struct ParamStore {
  ParamStore(const std::string& dir, const std::vector<ParamGroupSpec>& gs, bool checksums = false,
             std::shared_ptr<swap::FaultPlan> faults = nullptr) {
    swap::IoOptions io;
    io.kind = swap::IoEngineKind::kThreads;
    io.faults = std::move(faults);
    engine = swap::make_io_engine(io);
    swap::SwapStoreOptions so;
    so.directories = {dir};
    so.capacity_bytes = 1u << 20;
    so.stripe_bytes = 64u << 10;
    so.checksums = checksums;
    store = std::make_unique<swap::SwapStore>(so, *engine);
    for (const auto& g : gs) store->allocate(g.name, g.numel * 2);
  }
  std::vector<std::uint16_t> read(const std::string& key) {
    const std::uint64_t bytes = store->size_of(key);
    swap::BufferPoolOptions po;
    po.budget_bytes = store->padded_size(bytes);
    po.huge_pages = false;
    swap::BufferPool pool(po);
    swap::BufferLease lease = pool.acquire(store->padded_size(bytes));
    store->swap_in(key, lease.span()).wait();
    std::vector<std::uint16_t> out(bytes / 2);
    std::memcpy(out.data(), lease.data(), bytes);
    return out;
  }
  std::unique_ptr<swap::IoEngine> engine;
  std::unique_ptr<swap::SwapStore> store;
};

OptimizerOptions options(StateTier tier, const test::TestDir& dir) {
  OptimizerOptions o;
  o.tier = tier;
  o.sub_group_elements = kSub;
  o.pipeline_depth = 3;
  o.pinned_budget_bytes = 64u << 20;
  o.hyper = test::test_hyper();
  o.io.kind = swap::IoEngineKind::kThreads;
  o.store_copy_out = true;
  if (tier == StateTier::kNvme) o.directories = {dir.subdir("opt")};
  return o;
}

class StoreCopyOutTest : public ::testing::TestWithParam<StateTier> {};

TEST_P(StoreCopyOutTest, StoreBytesEqualTheCallerBufferCopyOut) {
  test::TestDir dir;
  const auto gs = groups();
  ParamStore ps(dir.subdir("param"), gs);
  OffloadedOptimizer with_buffer(options(GetParam(), dir), gs);
  auto o2 = options(GetParam(), dir);
  OffloadedOptimizer with_store(o2, gs);
  test::init_all(with_buffer);
  test::init_all(with_store);
  for (ElementType dtype : {ElementType::kBF16, ElementType::kF16, ElementType::kBF16}) {
    test::StepGrads sg(gs, with_buffer.step_count() + 1, ElementType::kF32);
    std::vector<std::vector<std::uint16_t>> outs;
    for (const auto& g : gs) outs.emplace_back(g.numel, 0xdead);
    with_buffer.begin_step();
    with_store.begin_step();
    for (std::size_t g = 0; g < gs.size(); ++g) {
      adam::CopyOut out =
          dtype == ElementType::kBF16 ? adam::CopyOut::bf16(outs[g]) : adam::CopyOut::f16(outs[g]);
      with_buffer.step_group(g, sg.views[g].grads, out);
      with_store.step_group(g, sg.views[g].grads, StoreCopyOut{ps.store.get(), gs[g].name, dtype});
    }
    (void)with_buffer.end_step();
    const StepStats st = with_store.end_step();
    std::uint64_t bytes = 0;
    for (const auto& g : gs) bytes += g.numel * 2;
    EXPECT_EQ(st.copy_out_bytes, bytes);
    for (std::size_t g = 0; g < gs.size(); ++g) {
      const auto stored = ps.read(gs[g].name);
      ASSERT_EQ(stored.size(), outs[g].size());
      for (std::size_t i = 0; i < stored.size(); ++i) {
        ASSERT_EQ(stored[i], outs[g][i]) << "group " << g << " element " << i;
      }
    }
  }
  EXPECT_EQ(test::diff(test::read_all(with_buffer), test::read_all(with_store)), "");
}

TEST_P(StoreCopyOutTest, StagingIsCountedInThePinnedBudget) {
  test::TestDir dir;
  const auto gs = groups();
  OptimizerOptions o = options(GetParam(), dir);
  const std::uint64_t with = optimizer_pinned_bytes_needed(o, gs);
  o.store_copy_out = false;
  const std::uint64_t without = optimizer_pinned_bytes_needed(o, gs);
  EXPECT_EQ(with - without, 3u * 4096u);  // depth 3 x (2048 x 2 bytes)
  o.store_copy_out = true;
  o.pinned_budget_bytes = with - 1;
  try {
    OffloadedOptimizer opt(o, gs);
    ADD_FAILURE() << "no throw";
  } catch (const UsageError& e) {
    const std::string text = e.what();
    EXPECT_NE(
        text.find("plus the copy-out staging: 3 x 4096 bytes; the smallest budget that works is " +
                  std::to_string(with)),
        std::string::npos)
        << text;
  }
  o.pinned_budget_bytes = with;
  OffloadedOptimizer opt(o, gs);
  EXPECT_EQ(opt.pinned_bytes(), with);
}

TEST_P(StoreCopyOutTest, RefusesRangesTheStoreCannotWrite) {
  test::TestDir dir;
  const auto gs = groups();
  ParamStore ps(dir.subdir("param"), gs);
  ParamStore sums(dir.subdir("sums"), gs, /*checksums=*/true);
  OptimizerOptions o = options(GetParam(), dir);
  o.sub_group_elements = 3000;
  OffloadedOptimizer opt(o, gs);
  test::init_all(opt);
  std::vector<float> g(gs[0].numel, 0.0f);
  opt.begin_step();
  auto expect_usage = [&](const StoreCopyOut& out, const std::string& want) {
    try {
      opt.step_group(0, adam::GradView::f32(g), out);
      ADD_FAILURE() << "no throw";
    } catch (const UsageError& e) {
      EXPECT_EQ(std::string(e.what()), want);
    }
  };
  expect_usage({ps.store.get(), "a", ElementType::kBF16},
               "OffloadedOptimizer::step_group: group 'a' copy-out into key 'a': sub-group bytes "
               "(2 x 3000 = 6000) must be a multiple of 4096 (the store's alignment); "
               "sub_group_elements 4096 works");
  expect_usage({sums.store.get(), "a", ElementType::kBF16},
               "OffloadedOptimizer::step_group: group 'a' copy-out into key 'a': sub-group bytes "
               "(2 x 3000 = 6000) must be a multiple of 65536 (the store's stripe_bytes, with "
               "checksums); sub_group_elements 32768 works");
  expect_usage({ps.store.get(), "b", ElementType::kBF16},
               "OffloadedOptimizer::step_group: group 'a' copy-out: key 'b' holds 200 bytes, the "
               "group needs 12298");
  expect_usage({ps.store.get(), "a", ElementType::kF32},
               "OffloadedOptimizer::step_group: group 'a' copy-out: dtype must be bf16 or fp16");
  EXPECT_EQ(store_copy_out_sub_group(3000, *ps.store), 4096u);
  EXPECT_EQ(store_copy_out_sub_group(3000, *sums.store), 32768u);
  // A single-sub-group group has no inner range boundary: any size works.
  std::vector<float> gb(gs[1].numel, 0.0f);
  opt.step_group(1, adam::GradView::f32(gb), StoreCopyOut{ps.store.get(), "b", ElementType::kBF16});
  (void)opt.end_step();
  OptimizerOptions plain = options(GetParam(), dir);
  plain.store_copy_out = false;
  OffloadedOptimizer no_staging(plain, gs);
  test::init_all(no_staging);
  no_staging.begin_step();
  try {
    no_staging.step_group(1, adam::GradView::f32(gb),
                          StoreCopyOut{ps.store.get(), "b", ElementType::kBF16});
    ADD_FAILURE() << "no throw";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()),
              "OffloadedOptimizer::step_group: group 'b' copy-out into a swap store needs "
              "OptimizerOptions::store_copy_out");
  }
  (void)no_staging.end_step();
}

TEST(CpuAdamCopyOut, IsBitwiseTheStepsCopyOut) {
  // Values around 1 with many bf16 ties and both zeros: copy_out of the updated masters gives
  // exactly what the step's fused copy-out wrote.
  const std::size_t n = 40000;
  std::vector<float> p = test::initial_params(0, n), m(n, 0.0f), v(n, 0.0f);
  p[0] = 0.0f;
  p[1] = -0.0f;
  const std::vector<float> g = test::grads_f32(0, 1, n);
  adam::CpuAdam adam;
  for (ElementType dtype : {ElementType::kBF16, ElementType::kF16}) {
    std::vector<std::uint16_t> fused(n), again(n);
    adam::AdamParams hp = test::test_hyper();
    hp.lr = 0;  // keeps p[0], p[1] as they are
    adam.step(hp, p, m, v, adam::GradView::f32(g), {fused.data(), n, dtype, true});
    adam.copy_out(p, {again.data(), n, dtype, true});
    EXPECT_EQ(fused, again);
  }
  std::vector<std::uint16_t> out(3);
  EXPECT_THROW(adam.copy_out(p, adam::CopyOut::bf16(out)), UsageError);
}

INSTANTIATE_TEST_SUITE_P(Tiers, StoreCopyOutTest,
                         ::testing::Values(StateTier::kCpu, StateTier::kNvme),
                         [](const auto& p) { return std::string(state_tier_name(p.param)); });

}  // namespace
}  // namespace zinf::optim
