// SPDX-License-Identifier: Apache-2.0
#include "zinf/dist/sharded_optimizer.h"

#include "shard_common.h"

#include <algorithm>
#include <optional>
#include <cmath>
#include <limits>
#include <string>
#include <utility>

#include "zinf/common/error.h"
#include "zinf/common/status.h"

namespace zinf::dist {

struct ShardedOptimizer::Impl {
  Collectives& comm;
  std::vector<optim::ParamGroupSpec> groups;    // full sizes
  std::vector<std::uint64_t> shard;             // elements per rank, per group
  // Declared before `local`, so destroyed after it: an empty rank folder goes once the
  // optimizer's swap files are gone.
  detail::RankFolders rank_folders;
  std::unique_ptr<optim::OffloadedOptimizer> local;
  // Per group, kept across steps: the inner optimizer reads the slice's gradients and writes
  // its copy-out asynchronously until end_step().
  std::vector<std::vector<float>> shard_grads, shard_out;
  std::vector<float> padded;  // one full padded group at a time
  optim::OptimizerOptions options;  // the local optimizer's (rank folders), for reshard()
  int stage = 2;

  explicit Impl(Collectives& c) : comm(c) {}
  void reshard(int saved_world, const std::vector<detail::SavedRank>& folders);
  std::uint64_t padded_numel(std::size_t g) const { return shard[g] * comm.size(); }
  void check_group(std::size_t g, const char* op) const {
    if (g >= groups.size()) {
      throw UsageError(std::string("ShardedOptimizer::") + op + ": group " + std::to_string(g) +
                       " out of range (" + std::to_string(groups.size()) + " groups)");
    }
  }
};

ShardedOptimizer::ShardedOptimizer(optim::OptimizerOptions options,
                                   std::vector<optim::ParamGroupSpec> groups, Collectives& comm,
                                   int stage)
    : impl_(std::make_unique<Impl>(comm)) {
  Impl& s = *impl_;
  if (stage != 1 && stage != 2) {
    throw UsageError("ShardedOptimizer: zero_optimization.stage " + std::to_string(stage) +
                     " is not a stage of a sharded optimizer: 1 (all-reduced gradients) or 2 "
                     "(reduce-scattered); stage 3 also partitions the parameters "
                     "(ShardedEngine)");
  }
  s.stage = stage;
  if (comm.memory() != MemoryKind::kHost) {
    throw UsageError("ShardedOptimizer: the collectives '" + std::string(comm.name()) +
                     "' work on device memory; the optimizer's slices are in host memory");
  }
  s.groups = std::move(groups);
  std::vector<optim::ParamGroupSpec> mine;
  for (const auto& g : s.groups) {
    s.shard.push_back(detail::shard_numel(g.numel, comm.size()));
    optim::ParamGroupSpec spec = g;
    spec.numel = s.shard.back();  // this rank's slice (0 only for an empty group: refused below)
    mine.push_back(std::move(spec));
  }
  if (options.tier == optim::StateTier::kNvme) {
    for (auto& d : options.directories) d = s.rank_folders.add(d, comm.rank());
  }
  s.options = options;
  s.local = std::make_unique<optim::OffloadedOptimizer>(std::move(options), std::move(mine));
  s.shard_grads.resize(s.groups.size());
  s.shard_out.resize(s.groups.size());
  std::uint64_t largest = 0;
  for (std::size_t g = 0; g < s.groups.size(); ++g) {
    s.shard_grads[g].resize(s.shard[g]);
    s.shard_out[g].resize(s.shard[g]);
    largest = std::max(largest, s.padded_numel(g));
  }
  s.padded.resize(largest);
}

ShardedOptimizer::~ShardedOptimizer() = default;

std::size_t ShardedOptimizer::group_count() const noexcept { return impl_->groups.size(); }
int ShardedOptimizer::stage() const noexcept { return impl_->stage; }

std::uint64_t ShardedOptimizer::shard_numel(std::size_t group) const {
  impl_->check_group(group, "shard_numel");
  return impl_->shard[group];
}

std::uint64_t ShardedOptimizer::shard_offset(std::size_t group) const {
  impl_->check_group(group, "shard_offset");
  return impl_->shard[group] * static_cast<std::uint64_t>(impl_->comm.rank());
}

void ShardedOptimizer::set_params(std::size_t group, std::span<const float> full) {
  Impl& s = *impl_;
  s.check_group(group, "set_params");
  if (full.size() != s.groups[group].numel) {
    throw UsageError("ShardedOptimizer::set_params: group '" + s.groups[group].name + "' has " +
                     std::to_string(s.groups[group].numel) + " elements, got " +
                     std::to_string(full.size()));
  }
  std::vector<float> slice(s.shard[group]);
  detail::copy_slice(full, s.comm.rank(), slice);
  s.local->set_params(group, slice);
}

optim::StepStats ShardedOptimizer::step(std::span<const std::span<const float>> grads,
                                        std::span<const std::span<float>> params,
                                        const ShardedStepOptions& options) {
  Impl& s = *impl_;
  if (grads.size() != s.groups.size() || params.size() != s.groups.size()) {
    throw UsageError("ShardedOptimizer::step: " + std::to_string(grads.size()) +
                     " gradient and " + std::to_string(params.size()) +
                     " parameter spans for " + std::to_string(s.groups.size()) + " groups");
  }
  for (std::size_t g = 0; g < s.groups.size(); ++g) {
    if (grads[g].size() != s.groups[g].numel || params[g].size() != s.groups[g].numel) {
      throw UsageError("ShardedOptimizer::step: group '" + s.groups[g].name + "' has " +
                       std::to_string(s.groups[g].numel) + " elements, got " +
                       std::to_string(grads[g].size()) + " gradients and " +
                       std::to_string(params[g].size()) + " parameters");
    }
  }
  if (!(options.loss_scale > 0) || !std::isfinite(options.loss_scale) || !(options.clip >= 0)) {
    throw UsageError("ShardedOptimizer::step: loss_scale must be finite and > 0 and clip >= 0, "
                     "got " + std::to_string(options.loss_scale) + " and " +
                     std::to_string(options.clip));
  }
  // Average every group's gradients first: the norm and the overflow verdict need them all.
  // [0]: this rank's sum of squares (double: exact for the values training sees far longer
  // than fp32 would be), [1]: values that are not finite.
  double totals[2] = {0, 0};
  detail::CollectiveTally tally;
  const int world = s.comm.size();
  for (std::size_t g = 0; g < s.groups.size(); ++g) {
    const std::uint64_t n = s.groups[g].numel;
    const std::span<float> full(s.padded.data(), s.padded_numel(g));
    std::copy(grads[g].begin(), grads[g].end(), full.begin());
    std::fill(full.begin() + static_cast<std::ptrdiff_t>(n), full.end(), 0.0f);
    detail::average_into_slice(s.comm, s.stage, full, s.shard_grads[g], tally);
    detail::add_squares(s.shard_grads[g], totals);
  }
  all_reduce<double>(s.comm, std::span<double>(totals, 2), ReduceOp::kSum);
  optim::StepStats stats;
  stats.loss_scale = options.loss_scale;
  if (totals[1] > 0) {
    // Every rank saw the same count: all skip together, and the state stays as it was.
    stats.skipped = true;
    stats.global_grad_norm = std::numeric_limits<double>::infinity();
    stats.grad_scale_applied = 0;
    tally.report(stats);
    return stats;
  }
  const double norm = std::sqrt(totals[0]) / options.loss_scale;
  const double scale = optim::clip_coefficient(options.clip, norm) / options.loss_scale;
  s.local->begin_step(scale);
  for (std::size_t g = 0; g < s.groups.size(); ++g) {
    s.local->step_group(g, adam::GradView::f32(s.shard_grads[g]),
                        adam::CopyOut::f32(std::span<float>(s.shard_out[g])));
  }
  stats = s.local->end_step();
  stats.global_grad_norm = norm;
  stats.grad_scale_applied = scale;
  stats.loss_scale = options.loss_scale;
  // Rebuild the full parameters from every rank's updated slice.
  for (std::size_t g = 0; g < s.groups.size(); ++g) {
    const std::span<float> full(s.padded.data(), s.padded_numel(g));
    all_gather<float>(s.comm, s.shard_out[g], full);
    tally.gathered(full.size_bytes(), world);
    std::copy_n(full.begin(), s.groups[g].numel, params[g].begin());
  }
  tally.report(stats);
  return stats;
}

void ShardedOptimizer::save(const std::string& dir) {
  detail::save_sharded(
      impl_->comm, "ShardedOptimizer::save", dir,
      detail::manifest_of("zinf-sharded-optimizer 1", "group", impl_->groups),
      impl_->local->step_count(),
      [this](const swap::Dir& mine) { impl_->local->save(mine, optim::SupersededVersions::kKeep); },
      [this] { impl_->local->remove_superseded_versions(); },
      {[this] { return impl_->local->checkpoint_run(); },
       [this](const std::string& run) { impl_->local->set_checkpoint_run(run); }});
}

void ShardedOptimizer::load(const std::string& dir) {
  const detail::ShardManifest manifest =
      detail::manifest_of("zinf-sharded-optimizer 1", "group", impl_->groups);
  detail::load_sharded(
      impl_->comm, "ShardedOptimizer::load", dir, manifest,
      [this](const swap::Dir& mine) { impl_->local->load(mine); },
      [this](const std::string&, int saved_world, const std::vector<detail::SavedRank>& folders) {
        impl_->reshard(saved_world, folders);
      });
}

void ShardedOptimizer::Impl::reshard(int saved_world,
                                     const std::vector<detail::SavedRank>& folders) {
  detail::ReshardTarget t;
  t.groups = groups;
  t.shard = shard;
  t.options = options;
  t.progress = [&](std::uint64_t steps, std::span<const adam::AdamParams> hypers,
                   const std::optional<std::string>&) {
    local->set_step_count(steps);
    local->set_hyper(hypers[0]);
    for (std::size_t g = 0; g < groups.size(); ++g) local->set_hyper(g, hypers[g + 1]);
  };
  t.put = [&](std::size_t g, std::span<const float> p, std::span<const float> m,
              std::span<const float> v) { local->set_state(g, p, m, v); };
  t.run = [&](const std::string& run) { local->set_checkpoint_run(run); };
  detail::reshard(comm, "ShardedOptimizer::load", saved_world, folders, t);
}

optim::OffloadedOptimizer& ShardedOptimizer::local() noexcept { return *impl_->local; }

}  // namespace zinf::dist
