// SPDX-License-Identifier: Apache-2.0
#include "zinf/dist/sharded_optimizer.h"

#include <algorithm>
#include <string>
#include <utility>

#include "zinf/common/error.h"
#include "zinf/swap/dir.h"

namespace zinf::dist {
namespace {

// DeepSpeed's layout: one subfolder per rank in each swap directory. Opened without following
// a link at the rank's name; created (0700) where there is none.
std::string rank_directory(const std::string& dir, int rank) {
  const std::string name = "rank" + std::to_string(rank);
  const swap::Dir parent = swap::Dir::open(dir);
  bool exists = false;
  for (const std::string& entry : parent.list()) exists = exists || entry == name;
  if (exists) {
    (void)parent.open_child(name);  // IoError for a link or a non-directory at that name
  } else {
    (void)parent.create_child(name);
  }
  return parent.path_of(name);
}

}  // namespace

struct ShardedOptimizer::Impl {
  Collectives& comm;
  std::vector<offload::ParamGroupSpec> groups;  // full sizes
  std::vector<std::uint64_t> shard;             // elements per rank, per group
  std::unique_ptr<offload::OffloadedOptimizer> local;
  // Per group, kept across steps: the inner optimizer reads the slice's gradients and writes
  // its copy-out asynchronously until end_step().
  std::vector<std::vector<float>> shard_grads, shard_out;
  std::vector<float> padded;  // one full padded group at a time

  explicit Impl(Collectives& c) : comm(c) {}
  std::uint64_t padded_numel(std::size_t g) const { return shard[g] * comm.size(); }
  void check_group(std::size_t g, const char* op) const {
    if (g >= groups.size()) {
      throw UsageError(std::string("ShardedOptimizer::") + op + ": group " + std::to_string(g) +
                       " out of range (" + std::to_string(groups.size()) + " groups)");
    }
  }
};

ShardedOptimizer::ShardedOptimizer(offload::OptimizerOptions options,
                                   std::vector<offload::ParamGroupSpec> groups, Collectives& comm)
    : impl_(std::make_unique<Impl>(comm)) {
  Impl& s = *impl_;
  if (comm.memory() != MemoryKind::kHost) {
    throw UsageError("ShardedOptimizer: the collectives '" + std::string(comm.name()) +
                     "' work on device memory; the optimizer's slices are in host memory");
  }
  s.groups = std::move(groups);
  const auto world = static_cast<std::uint64_t>(comm.size());
  std::vector<offload::ParamGroupSpec> mine;
  for (const auto& g : s.groups) {
    const std::uint64_t padded = (g.numel + world - 1) / world * world;
    s.shard.push_back(padded / world);
    offload::ParamGroupSpec spec = g;
    spec.numel = padded / world;  // this rank's slice (0 only for an empty group: refused below)
    mine.push_back(std::move(spec));
  }
  if (options.tier == offload::StateTier::kNvme) {
    for (auto& d : options.directories) d = rank_directory(d, comm.rank());
  }
  s.local = std::make_unique<offload::OffloadedOptimizer>(std::move(options), std::move(mine));
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
  const std::uint64_t begin = shard_offset(group);
  std::vector<float> slice(s.shard[group], 0.0f);  // the padding past numel stays 0
  const std::uint64_t end = std::min<std::uint64_t>(full.size(), begin + s.shard[group]);
  if (begin < end) std::copy(full.begin() + begin, full.begin() + end, slice.begin());
  s.local->set_params(group, slice);
}

offload::StepStats ShardedOptimizer::step(std::span<const std::span<const float>> grads,
                                          std::span<const std::span<float>> params) {
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
  // Average the gradients, one group at a time, and queue each slice's update as soon as its
  // gradients are in (the update runs on the optimizer's pipeline meanwhile).
  s.local->begin_step();
  for (std::size_t g = 0; g < s.groups.size(); ++g) {
    const std::uint64_t n = s.groups[g].numel;
    const std::span<float> full(s.padded.data(), s.padded_numel(g));
    std::copy(grads[g].begin(), grads[g].end(), full.begin());
    std::fill(full.begin() + static_cast<std::ptrdiff_t>(n), full.end(), 0.0f);
    reduce_scatter<float>(s.comm, full, s.shard_grads[g], ReduceOp::kAvg);
    s.local->step_group(g, adam::GradView::f32(s.shard_grads[g]),
                        adam::CopyOut::f32(std::span<float>(s.shard_out[g])));
  }
  const offload::StepStats stats = s.local->end_step();
  // Rebuild the full parameters from every rank's updated slice.
  for (std::size_t g = 0; g < s.groups.size(); ++g) {
    const std::span<float> full(s.padded.data(), s.padded_numel(g));
    all_gather<float>(s.comm, s.shard_out[g], full);
    std::copy_n(full.begin(), s.groups[g].numel, params[g].begin());
  }
  return stats;
}

offload::OffloadedOptimizer& ShardedOptimizer::local() noexcept { return *impl_->local; }

}  // namespace zinf::dist
