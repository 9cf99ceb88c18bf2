// SPDX-License-Identifier: Apache-2.0
#include "zinf/dist/sharded_optimizer.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <exception>
#include <filesystem>
#include <string>
#include <utility>

#include "zinf/common/error.h"
#include "zinf/common/status.h"
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

constexpr std::string_view kManifest = "zinf-sharded";
constexpr std::uint64_t kMaxManifestBytes = 1 << 20;

// What a rank's folder says of the job that saved it: the format, world size, rank, groups.
std::string rank_manifest(int world, int rank, const std::vector<offload::ParamGroupSpec>& gs) {
  std::string text = "zinf-sharded-optimizer 1\nworld_size " + std::to_string(world) +
                     "\nrank " + std::to_string(rank) + "\n";
  for (const auto& g : gs) text += "group " + g.name + " " + std::to_string(g.numel) + "\n";
  return text;
}

// The value of `key` in a manifest's "key value" lines, or "" if there is none.
std::string manifest_value(const std::string& text, const std::string& key) {
  std::size_t at = 0;
  while (at < text.size()) {
    const std::size_t end = std::min(text.find('\n', at), text.size());
    const std::string line = text.substr(at, end - at);
    if (line.rfind(key + " ", 0) == 0) return line.substr(key.size() + 1);
    at = end + 1;
  }
  return "";
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
  for (std::size_t g = 0; g < s.groups.size(); ++g) {
    const std::uint64_t n = s.groups[g].numel;
    const std::span<float> full(s.padded.data(), s.padded_numel(g));
    std::copy(grads[g].begin(), grads[g].end(), full.begin());
    std::fill(full.begin() + static_cast<std::ptrdiff_t>(n), full.end(), 0.0f);
    reduce_scatter<float>(s.comm, full, s.shard_grads[g], ReduceOp::kAvg);
    for (const float v : s.shard_grads[g]) {
      if (!std::isfinite(v)) {
        totals[1] += 1;
      } else {
        totals[0] += static_cast<double>(v) * static_cast<double>(v);
      }
    }
  }
  all_reduce<double>(s.comm, std::span<double>(totals, 2), ReduceOp::kSum);
  offload::StepStats stats;
  stats.loss_scale = options.loss_scale;
  if (totals[1] > 0) {
    // Every rank saw the same count: all skip together, and the state stays as it was.
    stats.skipped = true;
    stats.global_grad_norm = std::numeric_limits<double>::infinity();
    stats.grad_scale_applied = 0;
    return stats;
  }
  const double norm = std::sqrt(totals[0]) / options.loss_scale;
  const double scale = offload::clip_coefficient(options.clip, norm) / options.loss_scale;
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
    std::copy_n(full.begin(), s.groups[g].numel, params[g].begin());
  }
  return stats;
}

namespace {

// Runs `body` on this rank and all-reduces whether it failed, so that every rank throws if any
// did: this rank's own error, or one saying which ranks failed.
template <class Body>
void on_every_rank(Collectives& comm, const char* what, Body&& body) {
  std::exception_ptr mine;
  try {
    body();
  } catch (...) {
    mine = std::current_exception();
  }
  std::int32_t failed = mine ? 1 : 0;
  all_reduce<std::int32_t>(comm, std::span<std::int32_t>(&failed, 1), ReduceOp::kSum);
  if (mine) std::rethrow_exception(mine);
  if (failed > 0) {
    throw IoError(Status::error(ErrorCode::kIo, std::to_string(failed) + " of " +
                                                    std::to_string(comm.size()) +
                                                    " ranks failed; this rank (" +
                                                    std::to_string(comm.rank()) +
                                                    ") did not")
                      .with_operation(std::string("ShardedOptimizer::") + what));
  }
}

}  // namespace

void ShardedOptimizer::save(const std::string& dir) {
  Impl& s = *impl_;
  if (dir.empty()) throw UsageError("ShardedOptimizer::save: the checkpoint directory is empty");
  on_every_rank(s.comm, "save", [&] {
    std::filesystem::create_directories(dir);
    const std::string mine = rank_directory(dir, s.comm.rank());
    s.local->save(mine);
    swap::replace_file_durably(swap::Dir::open(mine), kManifest,
                               rank_manifest(s.comm.size(), s.comm.rank(), s.groups));
  });
  on_every_rank(s.comm, "save", [&] {
    if (s.comm.rank() != 0) return;
    std::string text = rank_manifest(s.comm.size(), 0, s.groups);
    text = text.substr(0, text.find("rank "));  // the global one names every rank instead
    for (int r = 0; r < s.comm.size(); ++r) text += "rank_dir rank" + std::to_string(r) + "\n";
    for (const auto& g : s.groups) text += "group " + g.name + " " + std::to_string(g.numel) + "\n";
    swap::replace_file_durably(swap::Dir::open(dir), kManifest, text);
  });
}

void ShardedOptimizer::load(const std::string& dir) {
  Impl& s = *impl_;
  if (dir.empty()) throw UsageError("ShardedOptimizer::load: the checkpoint directory is empty");
  on_every_rank(s.comm, "load", [&] {
    const std::string name = "rank" + std::to_string(s.comm.rank());
    const swap::Dir top = swap::Dir::open(dir);
    const std::string global = swap::read_small_file(top, kManifest, kMaxManifestBytes);
    const std::string saved_world = manifest_value(global, "world_size");
    if (saved_world != std::to_string(s.comm.size())) {
      throw UsageError("ShardedOptimizer::load: " + top.path_of(kManifest) +
                       " was saved by " + (saved_world.empty() ? "?" : saved_world) +
                       " ranks; this job has " + std::to_string(s.comm.size()) +
                       " (loading into another world size is not supported)");
    }
    const swap::Dir mine = top.open_child(name);  // never through a link
    const std::string want = rank_manifest(s.comm.size(), s.comm.rank(), s.groups);
    if (swap::read_small_file(mine, kManifest, kMaxManifestBytes) != want) {
      throw UsageError("ShardedOptimizer::load: " + mine.path_of(kManifest) +
                       " does not describe this rank and these groups (world size, rank, "
                       "group names and sizes)");
    }
    s.local->load(mine.path());
  });
}

offload::OffloadedOptimizer& ShardedOptimizer::local() noexcept { return *impl_->local; }

}  // namespace zinf::dist
