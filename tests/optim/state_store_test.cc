// SPDX-License-Identifier: Apache-2.0
// The optimizer's StateStore seam (optim/src/state_store.h), one suite over both stores: the
// store's contract on its own (records round-trip through the slots, a store whose slot is the
// record needs no I/O and calls no callback, the asynchronous save's read_copy, the plan's
// share of the budget, a clone refused with its reason), and the OffloadedOptimizer behaviours
// that are the same whichever store holds the state (a step's grad_scale factor, each group's
// own hyper-parameters, the budget error naming the smallest budget that works, int8 records
// sized to whole stripe units).
#include "state_store.h"

#include <atomic>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "optimizer_test_util.h"
#include "support/test_dir.h"
#include "zinf/common/align.h"
#include "zinf/common/error.h"
#include "zinf/optim/optimizer.h"
#include "zinf/swap/buffer_pool.h"
#include "zinf/swap/dir.h"
#include "zinf/swap/file.h"
#include "zinf/swap/io_engine.h"

namespace zinf::optim {
namespace {

using test::odd_groups;

OptimizerOptions options_for(StateTier tier, const test::TestDir& dir) {
  OptimizerOptions o;
  o.tier = tier;
  o.sub_group_elements = test::kOddSubGroup;
  o.pipeline_depth = 3;
  o.hyper = test::test_hyper();
  o.io.kind = swap::IoEngineKind::kThreads;
  o.io.queue_depth = 8;
  if (tier == StateTier::kNvme) o.directories = {dir.subdir("nvme0"), dir.subdir("nvme1")};
  return o;
}

// A store over odd_groups() built as OffloadedOptimizer builds its own: plan, records, engine,
// store, pool.
struct StoreRig {
  OptimizerOptions options;
  std::vector<ParamGroupSpec> groups = odd_groups();
  StateStorePlan plan;
  std::vector<Record> records;
  std::uint64_t max_record_bytes = 0;
  std::uint64_t state_bytes = 0;
  std::unique_ptr<swap::IoEngine> engine;
  std::unique_ptr<swap::BufferPool> pool;
  std::unique_ptr<StateStore> store;

  StoreRig(StateTier tier, const test::TestDir& dir) : options(options_for(tier, dir)) {
    plan = plan_state_store(options, groups);
    const std::uint64_t sub = options.sub_group_elements;
    for (std::size_t g = 0; g < groups.size(); ++g) {
      for (std::uint64_t off = 0, s = 0; off < groups[g].numel; off += sub, ++s) {
        Record r;
        r.group = g;
        r.sub = s;
        r.offset = off;
        r.numel = std::min(sub, groups[g].numel - off);
        r.bytes = record_state_bytes(options.state_precision, r.numel);
        r.padded = align_up(r.bytes, plan.alignment);
        r.key = groups[g].name + "#" + std::to_string(s);
        max_record_bytes = std::max(max_record_bytes, r.padded);
        state_bytes += r.padded;
        records.push_back(std::move(r));
      }
    }
    engine = swap::make_io_engine(options.io);
    store = plan.make({plan, options, records, *engine, max_record_bytes, state_bytes});
    pool = std::make_unique<swap::BufferPool>(
        swap::BufferPoolOptions{.budget_bytes = plan.pinned_bytes, .alignment = plan.alignment});
    store->acquire(*pool);
  }
  ~StoreRig() {
    store->close().ignore("test teardown");
    store.reset();  // its buffers go back to the pool first
  }

  // Record r's bytes: a pattern of its own over the whole padded record.
  void fill(std::byte* base, std::size_t r) const {
    for (std::uint64_t i = 0; i < records[r].padded; ++i) {
      base[i] = static_cast<std::byte>(test::mix(r * 7919 + i));
    }
  }
  bool holds(const std::byte* base, std::size_t r) const {
    std::vector<std::byte> want(records[r].padded);
    fill(want.data(), r);
    return std::memcmp(base, want.data(), want.size()) == 0;
  }
  // Writes every record through slot r % depth, each write-back waited for.
  void write_all() {
    for (std::size_t r = 0; r < records.size(); ++r) {
      const std::size_t slot = r % store->depth();
      fill(store->data(slot, r), r);
      if (auto t = store->write_back(slot, r)) t->wait();
    }
  }
};

class StateStoreTest : public ::testing::TestWithParam<StateTier> {
 protected:
  test::TestDir dir_;
};

TEST_P(StateStoreTest, RecordsRoundTripThroughTheSlots) {
  StoreRig rig(GetParam(), dir_);
  ASSERT_GE(rig.records.size(), 4u);
  rig.write_all();
  // Read back in reverse, each through another slot than the one it was written from.
  for (std::size_t r = rig.records.size(); r-- > 0;) {
    const std::size_t slot = (r + 1) % rig.store->depth();
    if (auto t = rig.store->read(slot, r)) t->wait();
    EXPECT_TRUE(rig.holds(rig.store->data(slot, r), r)) << "record " << r;
  }
}

TEST_P(StateStoreTest, AStoreWhoseSlotIsTheRecordNeedsNoIoAndCallsNoCallback) {
  StoreRig rig(GetParam(), dir_);
  std::atomic<int> calls{0};
  auto count = [&](const Status& s) {
    EXPECT_TRUE(s.ok()) << s.to_string();
    ++calls;
  };
  int started = 0;
  for (std::size_t r = 0; r < rig.records.size(); ++r) {
    const std::size_t slot = r % rig.store->depth();
    rig.fill(rig.store->data(slot, r), r);
    auto w = rig.store->write_back(slot, r, count);
    EXPECT_EQ(w.has_value(), !rig.store->in_place());
    if (w) {
      ++started;
      w->wait();
    }
    auto t = rig.store->read(slot, r, count);
    EXPECT_EQ(t.has_value(), !rig.store->in_place());
    if (t) {
      ++started;
      t->wait();
    }
  }
  EXPECT_EQ(calls.load(), started);  // exactly once per started I/O, before its ticket
  // In place: a slot is the record, whichever slot names it.
  if (rig.store->in_place()) {
    EXPECT_EQ(rig.store->data(0, 1), rig.store->data(1, 1));
  }
}

TEST_P(StateStoreTest, ReadCopyGivesTheStoredBytesCopyingOnlyFromFiles) {
  StoreRig rig(GetParam(), dir_);
  rig.write_all();
  swap::BufferPool scratch_pool(swap::BufferPoolOptions{.budget_bytes = rig.max_record_bytes,
                                                        .alignment = rig.plan.alignment});
  swap::BufferLease scratch = scratch_pool.acquire(rig.max_record_bytes);
  for (std::size_t r = 0; r < rig.records.size(); ++r) {
    StateStore::Copy got = rig.store->read_copy(r, scratch.span());
    if (got.io) got.io->wait();
    EXPECT_TRUE(rig.holds(got.data, r)) << "record " << r;
    // Read into the scratch buffer exactly when the store is not the record itself.
    EXPECT_EQ(got.data == scratch.data(), !rig.store->in_place());
    EXPECT_EQ(got.io.has_value(), !rig.store->in_place());
  }
}

TEST_P(StateStoreTest, PlanHoldsTheStoresShareOfTheBudget) {
  StoreRig rig(GetParam(), dir_);
  EXPECT_EQ(rig.store->depth(), rig.plan.depth);
  EXPECT_GE(rig.plan.depth, 1u);
  EXPECT_EQ(rig.pool->bytes_in_use(), rig.plan.pinned_bytes);  // acquire took the plan's share
  // The records' sizes as the plan computed them before any record existed.
  const RecordSizes sizes = record_sizes(rig.options, rig.groups, rig.plan.alignment);
  EXPECT_EQ(sizes.max_record_bytes, rig.max_record_bytes);
  EXPECT_EQ(sizes.state_bytes, rig.state_bytes);
  EXPECT_EQ(sizes.count, rig.records.size());
  // Only a store with files has a swap store (and so folded checksums and clones).
  EXPECT_EQ(rig.store->swap_store() != nullptr, !rig.store->file_paths().empty());
}

TEST_P(StateStoreTest, CloneRefusedSaysWhy) {
  StoreRig rig(GetParam(), dir_);
  const swap::Dir root = swap::Dir::open(dir_.path());
  swap::File file = swap::File::create_exclusive(root, "state.bin", swap::FileOptions{});
  std::vector<std::uint64_t> offsets(rig.records.size(), 0);
  std::vector<std::vector<std::uint32_t>> sums;
  std::string why;
  EXPECT_FALSE(rig.store->clone_records(false, file, offsets, sums, why, dir_.path()));
  EXPECT_EQ(why, GetParam() == StateTier::kCpu ? "the state is in memory (kCpu), not in swap files"
                                               : "OptimizerOptions::checkpoint_reflink is off");
  file.close().ignore("test");
}

// ---- The optimizer over either store --------------------------------------------------------

TEST_P(StateStoreTest, AStepsGradScaleMultipliesTheHyperParametersForThatStepOnly) {
  // The engine's clipped, loss-scaled step: begin_step(factor) must be the plain kernel with
  // grad_scale x factor, and the next begin_step() the configured grad_scale again.
  const auto groups = odd_groups();
  OffloadedOptimizer opt(options_for(GetParam(), dir_), groups);
  test::init_all(opt);
  // Group 1 has a grad_scale of its own: the step's factor multiplies it too.
  adam::AdamParams own = test::test_hyper();
  own.grad_scale = 0.5;
  opt.set_hyper(1, own);
  const double factor = 0.37 / 1024.0;
  test::StepGrads sg1(groups, 1, ElementType::kF32);
  opt.begin_step(factor);
  for (const auto& g : sg1.views) opt.step_group(g.group, g.grads);
  (void)opt.end_step();
  EXPECT_EQ(opt.hyper().grad_scale, 1.0);
  EXPECT_EQ(opt.hyper(1).grad_scale, 0.5);
  test::run_steps(opt, 2, 2);

  adam::CpuAdam adam;
  test::State want;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    want.p.push_back(test::initial_params(g, groups[g].numel));
    want.m.emplace_back(groups[g].numel, 0.0f);
    want.v.emplace_back(groups[g].numel, 0.0f);
  }
  for (std::uint64_t t = 1; t <= 2; ++t) {
    test::StepGrads sg(groups, t, ElementType::kF32);
    for (std::size_t g = 0; g < groups.size(); ++g) {
      adam::AdamParams hp = g == 1 ? own : test::test_hyper();
      hp.step = t;
      if (t == 1) hp.grad_scale *= factor;
      adam.step(hp, want.p[g], want.m[g], want.v[g], sg.views[g].grads);
    }
  }
  EXPECT_EQ(test::diff(test::read_all(opt), want), "");

  // A factor the kernel would refuse opens nothing.
  EXPECT_THROW(opt.begin_step(0.0), UsageError);
  EXPECT_THROW(opt.begin_step(std::numeric_limits<double>::infinity()), UsageError);
  EXPECT_EQ(opt.step_count(), 2u);
  test::run_steps(opt, 3, 3);
}

TEST_P(StateStoreTest, EachGroupStepsWithItsOwnHyperParameters) {
  // Groups with different weight decay: each group's state is exactly what the plain kernel
  // gives with that group's set.
  const auto groups = test::groups_with_own_hyper();
  const test::State want = test::reference_run(groups, test::test_hyper(), 3, ElementType::kF32);
  // The sets matter: one set for every group gives other weights.
  ASSERT_NE(
      test::diff(want, test::reference_run(odd_groups(), test::test_hyper(), 3, ElementType::kF32)),
      "");
  OffloadedOptimizer opt(options_for(GetParam(), dir_), groups);
  EXPECT_TRUE(test::same_hyper(opt.hyper(), test::test_hyper()));
  for (std::size_t g = 0; g < groups.size(); ++g) {
    EXPECT_TRUE(test::same_hyper(opt.hyper(g), groups[g].hyper.value_or(test::test_hyper())))
        << "group " << g;
  }
  test::init_all(opt);
  test::run_steps(opt, 1, 3);
  EXPECT_EQ(test::diff(test::read_all(opt), want), "");
}

TEST_P(StateStoreTest, BudgetTooSmallForTheStoreIsAnErrorAtConstruction) {
  // Each store's share in its own words: the nvme ring, or the cpu tier's whole state.
  struct Case {
    std::vector<ParamGroupSpec> groups;
    std::uint64_t budget;
    std::string message;
    std::uint64_t smallest;
  };
  const Case c =
      GetParam() == StateTier::kNvme
          ? Case{odd_groups(), 100000,
                 "OffloadedOptimizer: pinned_budget_bytes=100000 cannot hold the pipeline: depth 3 "
                 "x 53248-byte sub-group buffers (4099 elements x 12 bytes, padded to 4096) = "
                 "159744 bytes; the smallest budget that works is 159744",
                 159744}
          : Case{{{"a", 1000}},
                 4096,
                 "OffloadedOptimizer: pinned_budget_bytes=4096 cannot hold the cpu-tier state: 1 "
                 "sub-groups of 12 bytes per element, each padded to 4096, = 12288 bytes; the "
                 "smallest budget that works is 12288",
                 12288};
  auto o = options_for(GetParam(), dir_);
  o.pinned_budget_bytes = c.budget;
  try {
    OffloadedOptimizer opt(o, c.groups);
    FAIL() << "constructed with a budget below the store's";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()), c.message);
  }
  EXPECT_EQ(optimizer_pinned_bytes_needed(o, c.groups), c.smallest);
  o.pinned_budget_bytes = c.smallest;
  OffloadedOptimizer fits(o, c.groups);
  EXPECT_EQ(fits.pinned_bytes(), c.smallest);
}

TEST_P(StateStoreTest, Int8SubGroupsFillWholeStripeUnits) {
  // compact_state_optimizer_test's SubGroupsFillWholeStripeUnits, as the optimizer's records
  // come out: the same size and record bytes whichever store holds them.
  constexpr std::uint64_t kM = 1 << 20;
  OptimizerOptions o;
  o.tier = GetParam();
  o.state_precision = adam::StatePrecision::kInt8;
  o.sub_group_elements = kM;
  o.io.kind = swap::IoEngineKind::kThreads;
  if (GetParam() == StateTier::kNvme) o.directories = {dir_.subdir("nvme")};
  {
    OffloadedOptimizer opt(o, {{"w", 3 * kM}});
    EXPECT_EQ(opt.sub_group_elements(), 1027136u);
    EXPECT_EQ(opt.record_bytes(), 6 * kM);  // padded to 4 KiB: exactly six stripe units
  }
  // The default (0): records of 12 MiB, fp32's at 1M elements.
  o.sub_group_elements = 0;
  OffloadedOptimizer opt(o, {{"w", 5 * kM}});
  EXPECT_EQ(opt.sub_group_elements(), default_sub_group_elements(adam::StatePrecision::kInt8));
  EXPECT_EQ(opt.sub_group_elements(), 2054336u);
  EXPECT_EQ(opt.record_bytes(), 12 * kM);
}

INSTANTIATE_TEST_SUITE_P(Stores, StateStoreTest,
                         ::testing::Values(StateTier::kCpu, StateTier::kNvme),
                         [](const auto& p) { return std::string(state_tier_name(p.param)); });

}  // namespace
}  // namespace zinf::optim
