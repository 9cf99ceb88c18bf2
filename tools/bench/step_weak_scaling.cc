// SPDX-License-Identifier: Apache-2.0
// `zinf bench step` under mpirun: the sharded optimizer over every rank's parameters against one
// rank's step alone (step_weak_scaling.h).
#include "step_weak_scaling.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "bench_common.h"
#include "interrupt.h"
#include "json_out.h"
#include "progress.h"
#include "step_report.h"
#include "zinf/dist/rank_directory.h"
#include "zinf/dist/sharded_optimizer.h"

namespace zinf::tools {

using adam::GradView;
using optim::OffloadedOptimizer;
using optim::StateTier;

// Weak scaling under mpirun: one group of N x numel parameters, sharded over the N ranks (each
// updates numel of them in its own <dir>/rank<R>), against rank 0 stepping an optimizer of
// numel parameters alone. Rounds alternate the two: a barrier, rank 0's step alone (the
// others wait at the next barrier), then every rank's sharded step; round 0 warms both up and
// is not counted. A round's sharded time is its slowest rank's (all-gathered).
int run_weak_scaling(const optim::OptimizerOptions& o, std::uint64_t numel, std::uint64_t steps,
                     bool json, dist::Collectives& comm) {
  const int n = comm.size();
  const bool leader = comm.rank() == 0;
  const std::size_t per_rank = numel;
  const std::size_t global = per_rank * static_cast<std::size_t>(n);
  // The full parameters (the initial values, then every step's all-gathered result) and this
  // rank's gradients of all of them, a stretch of the generator of its own.
  HostArray param_mem(global * 4, "bench step"), grad_mem(global * 4, "bench step");
  const std::span<float> params = param_mem.as<float>(global);
  const std::span<float> grads = grad_mem.as<float>(global);
  for (std::size_t i = 0; i < global; ++i) params[i] = bench_param(i);
  fill_bench_grads(grads.data(), global, ElementType::kF32,
                   static_cast<std::size_t>(comm.rank()) * global);

  dist::ShardedOptimizer sharded(o, {{"params", global}}, comm);  // makes <dir>/rank<R>
  sharded.set_params(0, params);
  // Rank 0's one-rank step: bench step's own optimizer over its first numel parameters and
  // gradients, its files beside its shard's in <dir>/rank0 (unnamed: the two never meet).
  std::unique_ptr<OffloadedOptimizer> alone;
  if (leader) {
    optim::OptimizerOptions ao = o;
    if (ao.tier == StateTier::kNvme) {
      for (auto& d : ao.directories) d = dist::rank_directory(d, 0);
    }
    alone = std::make_unique<OffloadedOptimizer>(
        ao, std::vector<optim::ParamGroupSpec>{{"params", per_rank}});
    alone->set_params(0, params.first(per_rank));
  }
  const optim::GroupGrads alone_grads{0, GradView{grads.data(), per_rank, ElementType::kF32}, {}};
  const std::span<const float> grad_spans[1] = {grads};
  const std::span<float> param_spans[1] = {params};

  std::vector<optim::StepStats> alone_stats, sharded_stats;  // this rank's optimizer's
  std::vector<double> alone_s, mine_s, slowest_s, exchange_s;
  std::vector<double> round_s(static_cast<std::size_t>(n));
  Progress progress("zinf bench step", static_cast<double>(steps + 1), "rounds", leader && !json);
  for (std::uint64_t s = 0; s <= steps; ++s) {  // s == 0: untimed warm-up of both
    throw_if_interrupted();
    progress.update(static_cast<double>(s));
    comm.barrier();
    if (leader) {
      const auto t0 = std::chrono::steady_clock::now();
      const optim::StepStats st = alone->step(std::span<const optim::GroupGrads>(&alone_grads, 1));
      const double t = seconds_since(t0);
      if (s > 0) {
        alone_stats.push_back(st);
        alone_s.push_back(t);
      }
    }
    comm.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    const optim::StepStats st = sharded.step(grad_spans, param_spans);
    const double t = seconds_since(t0);
    dist::all_gather<double>(comm, std::span<const double>(&t, 1), round_s);
    if (s == 0) continue;
    sharded_stats.push_back(st);
    mine_s.push_back(t);
    // Outside this rank's optimizer: the gradients' reduce-scatter, the norm's all-reduce, the
    // parameters' all-gather, their copies, and waiting there for slower ranks.
    exchange_s.push_back(t - st.seconds);
    slowest_s.push_back(*std::max_element(round_s.begin(), round_s.end()));
  }
  progress.finish();

  // Every rank's medians: its whole sharded step and its optimizer's part of it.
  const Stages own_stages(sharded_stats);
  const double mine[2] = {median(mine_s), own_stages.step};
  std::vector<double> gathered(2 * static_cast<std::size_t>(n));
  dist::all_gather<double>(comm, std::span<const double>(mine, 2), gathered);
  if (!leader) return 0;
  std::vector<double> per_rank_step, per_rank_optimizer;
  for (int r = 0; r < n; ++r) {
    per_rank_step.push_back(gathered[2 * r]);
    per_rank_optimizer.push_back(gathered[2 * r + 1]);
  }
  const double alone_med = median(alone_s);
  const double sharded_med = median(slowest_s);
  const double ratio = sharded_med / alone_med;
  const Stages alone_stages(alone_stats);
  const Stages& rank0_stages = own_stages;  // this is rank 0
  if (json) {
    Json j = setup_json(o, per_rank, alone->engine_name(), steps);
    j["mode"] = "weak_scaling";
    j["ranks"] = n;
    j["collectives"] = std::string(comm.name());
    j["global_numel"] = std::uint64_t{global};
    j["alone_step_s"] = alone_med;
    j["sharded_step_s"] = sharded_med;
    j["weak_scaling_ratio"] = ratio;
    j["per_rank_step_s"] = per_rank_step;
    j["per_rank_optimizer_s"] = per_rank_optimizer;
    j["rank0_exchange_s"] = median(exchange_s);
    j["alone_step_s_all"] = alone_s;
    j["sharded_step_s_all"] = slowest_s;
    Json a, r0;
    alone_stages.put(a);
    rank0_stages.put(r0);
    j["alone"] = std::move(a);
    j["rank0_optimizer"] = std::move(r0);
    j["dirs"] = o.directories;
    std::printf("%s\n", json_text(j).c_str());
    return 0;
  }
  std::printf(
      "zinf bench step: %d ranks (%s), weak scaling: %llu parameters per rank (%llu in all, "
      "rank<R> folders), tier=%s engine=%.*s sub-group=%llu depth=%u state=%s steps=%llu "
      "(median)\n",
      n, std::string(comm.name()).c_str(), static_cast<unsigned long long>(per_rank),
      static_cast<unsigned long long>(global), std::string(optim::state_tier_name(o.tier)).c_str(),
      static_cast<int>(alone->engine_name().size()), alone->engine_name().data(),
      static_cast<unsigned long long>(o.sub_group_elements), o.pipeline_depth,
      std::string(adam::state_precision_name(o.state_precision)).c_str(),
      static_cast<unsigned long long>(steps));
  std::printf("  %-22s %10.3f s   (rank 0 alone, %llu parameters)\n", "one-rank step", alone_med,
              static_cast<unsigned long long>(per_rank));
  alone_stages.print("    ");
  std::string ranks;
  for (int r = 0; r < n; ++r) {
    char cell[32];
    std::snprintf(cell, sizeof cell, "%s%.3f", r == 0 ? "" : " ", per_rank_step[r]);
    ranks += cell;
  }
  std::printf("  %-22s %10.3f s   (the slowest rank's; per rank %s s)\n", "sharded step",
              sharded_med, ranks.c_str());
  std::printf("  %-22s %10.3f s\n", "  rank 0's optimizer", rank0_stages.step);
  rank0_stages.print("      ");
  std::printf("  %-22s %10.3f s   (reduce-scatter, all-reduce, all-gather, waits)\n",
              "  rank 0's exchange", median(exchange_s));
  std::printf("  %-22s %10.3f     (sharded / one-rank; the target is <= 1.10)\n",
              "weak scaling ratio", ratio);
  return 0;
}

}  // namespace zinf::tools
