// SPDX-License-Identifier: Apache-2.0
// The ShardedOptimizer's parity check, shared by the ranks-as-threads test and the MPI test:
// every rank's full parameters after each step must be bitwise those of one OffloadedOptimizer
// over the whole groups fed the ranks' averaged gradients (chosen so that the average is exact).
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "optim/optimizer_test_util.h"
#include "zinf/dist/sharded_optimizer.h"

namespace zinf::dist::test {

using optim::OptimizerOptions;
using optim::ParamGroupSpec;
using optim::StateTier;

// Odd sizes: a group smaller than some worlds (7 elements over 4 ranks), one that spans several
// sub-groups per slice, and uneven padding.
inline std::vector<ParamGroupSpec> groups() { return {{"a", 1001}, {"b", 7}, {"c", 2 * 4099 + 3}}; }

// The average the ranks' gradients are meant to have: dyadic values with few bits.
inline float base_grad(std::size_t group, std::size_t i, std::uint64_t step) {
  const auto k = static_cast<int>(zinf::test::mix(group * 1000003 + i * 31 + step) % 1025) - 512;
  return static_cast<float>(k) / 1024.0f;
}

// Rank r's gradient: the base plus an offset that sums to zero over the ranks, so that the sum
// and the division by the rank count are exact in fp32 in any order.
inline float rank_grad(float base, int rank, int size) {
  return base + (static_cast<float>(rank) - static_cast<float>(size - 1) / 2.0f) / 4096.0f;
}

inline OptimizerOptions options_for(StateTier tier, const std::string& dir) {
  OptimizerOptions o;
  o.tier = tier;
  o.sub_group_elements = zinf::test::kOddSubGroup;
  o.hyper = zinf::test::test_hyper();
  o.io.kind = swap::IoEngineKind::kThreads;
  if (tier == StateTier::kNvme) o.directories = {dir};
  return o;
}

constexpr std::uint64_t kSteps = 3;

// The full parameters after each step of one optimizer over the whole groups (cpu tier).
inline std::vector<std::vector<std::vector<float>>> reference() {
  const auto gs = groups();
  optim::OffloadedOptimizer opt(options_for(StateTier::kCpu, ""), gs);
  std::vector<std::vector<std::vector<float>>> out;
  for (std::size_t g = 0; g < gs.size(); ++g) opt.set_params(g, zinf::test::initial_params(g, gs[g].numel));
  for (std::uint64_t t = 1; t <= kSteps; ++t) {
    std::vector<std::vector<float>> grads(gs.size());
    std::vector<optim::GroupGrads> views;
    for (std::size_t g = 0; g < gs.size(); ++g) {
      grads[g].resize(gs[g].numel);
      for (std::size_t i = 0; i < gs[g].numel; ++i) grads[g][i] = base_grad(g, i, t);
    }
    for (std::size_t g = 0; g < gs.size(); ++g) {
      views.push_back(optim::GroupGrads{g, adam::GradView::f32(grads[g])});
    }
    (void)opt.step(views);
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

// Step `t` of the reference run on this rank of `c` (its share of the exact gradients); the
// parameters after it land in `params`, filled with -1 first so that an element the step did
// not write shows.
inline optim::StepStats reference_step(ShardedOptimizer& opt, const Collectives& c, std::uint64_t t,
                                       std::vector<std::vector<float>>& params) {
  const auto gs = groups();
  std::vector<std::vector<float>> grads(gs.size());
  params.assign(gs.size(), {});
  std::vector<std::span<const float>> gv;
  std::vector<std::span<float>> pv;
  for (std::size_t g = 0; g < gs.size(); ++g) {
    grads[g].resize(gs[g].numel);
    params[g].assign(gs[g].numel, -1.0f);
    for (std::size_t i = 0; i < gs[g].numel; ++i) {
      grads[g][i] = rank_grad(base_grad(g, i, t), c.rank(), c.size());
    }
    gv.emplace_back(grads[g]);
    pv.emplace_back(params[g]);
  }
  return opt.step(gv, pv);
}

// Steps `from`..`to` of the same run on this rank of `c`: a new ShardedOptimizer starts from
// the initial parameters (from == 1) or loads `load_from`; each step's parameters are checked
// against `want`; with `save_to`, it saves there after step `to`. The world size of the run may
// differ from the one that saved `load_from` (resharding). `stage` 1 or 2: each step's
// collective byte counts are checked too.
inline void run_sharded_steps(Collectives& c, StateTier tier, const std::string& swap_dir,
                              const std::vector<std::vector<std::vector<float>>>& want,
                              std::uint64_t from, std::uint64_t to, const std::string& load_from,
                              const std::string& save_to, int stage = 2) {
  const auto gs = groups();
  ShardedOptimizer opt(options_for(tier, swap_dir), gs, c, stage);
  EXPECT_EQ(opt.stage(), stage);
  // Each rank's swap files in its own rank<R> folder.
  for (const std::string& path : opt.local().swap_file_paths()) {
    EXPECT_EQ(path.rfind(swap_dir + "/rank" + std::to_string(c.rank()) + "/", 0), 0u) << path;
  }
  std::uint64_t owned = 0;
  for (std::size_t g = 0; g < gs.size(); ++g) {
    EXPECT_GE(opt.shard_numel(g) * static_cast<std::uint64_t>(c.size()), gs[g].numel);
    EXPECT_EQ(opt.shard_offset(g), opt.shard_numel(g) * static_cast<std::uint64_t>(c.rank()));
    owned += opt.shard_numel(g);
  }
  if (from == 1) {
    for (std::size_t g = 0; g < gs.size(); ++g) {
      opt.set_params(g, zinf::test::initial_params(g, gs[g].numel));
    }
  } else {
    opt.load(load_from);
    ASSERT_EQ(opt.local().step_count(), from - 1) << "rank " << c.rank();
  }
  for (std::uint64_t t = from; t <= to; ++t) {
    std::vector<std::vector<float>> params;
    const optim::StepStats st = reference_step(opt, c, t, params);
    EXPECT_EQ(st.elements, owned);  // each rank updates only its slices
    // A ring's bytes into this rank: (N - 1) / N of each padded fp32 group, gathered once,
    // reduce-scattered (stage 2) or all-reduced (stage 1, twice).
    const auto n = static_cast<std::uint64_t>(c.size());
    std::uint64_t ring = 0;
    for (const auto& g : gs) ring += (g.numel + n - 1) / n * n * 4 / n * (n - 1);
    EXPECT_EQ(st.allgather_bytes, ring);
    EXPECT_EQ(st.reduce_scatter_bytes, stage == 2 ? ring : 0);
    EXPECT_EQ(st.all_reduce_bytes, stage == 1 ? 2 * ring : 0);
    for (std::size_t g = 0; g < gs.size(); ++g) {
      EXPECT_EQ(params[g], want[t - 1][g]) << "rank " << c.rank() << " of " << c.size()
                                           << ", group " << gs[g].name << ", step " << t;
    }
  }
  if (!save_to.empty()) opt.save(save_to);
}

// Runs kSteps of a ShardedOptimizer on this rank of `c` and checks every step's parameters
// against `want` (reference()). With `checkpoint`, the optimizer is saved there after step 2,
// destroyed, and a new one loads it and runs the last step.
inline void check_sharded_parity(Collectives& c, StateTier tier, const std::string& swap_dir,
                                 const std::vector<std::vector<std::vector<float>>>& want,
                                 const std::string& checkpoint = "", int stage = 2) {
  if (checkpoint.empty()) {
    run_sharded_steps(c, tier, swap_dir, want, 1, kSteps, "", "", stage);
    return;
  }
  run_sharded_steps(c, tier, swap_dir, want, 1, kSteps - 1, "", checkpoint, stage);
  run_sharded_steps(c, tier, swap_dir, want, kSteps, kSteps, checkpoint, "", stage);
}

}  // namespace zinf::dist::test
