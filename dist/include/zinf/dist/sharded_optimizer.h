// SPDX-License-Identifier: Apache-2.0
// ShardedOptimizer: data-parallel Adam in which each of N ranks keeps 1/N of every group's fp32
// master weights and moments (in pinned memory or on its own NVMe paths), averages gradients
// with a reduce-scatter, updates its own slice and rebuilds the full parameters with an
// all-gather. The optimizer half of the sharded engine. Part of zinf::dist.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "zinf/dist/collectives.h"
#include "zinf/optim/optimizer.h"

namespace zinf::dist {

/// What one ShardedOptimizer::step applies besides the update.
struct ShardedStepOptions {
  /// Clip the global L2 norm of the averaged, unscaled gradients (all groups, all ranks) to
  /// this, PyTorch's and DeepSpeed's way (optim::clip_coefficient); 0 = no clipping.
  double clip = 0;
  /// The gradients carry this factor (fp16 training's loss scale, > 0); the update divides it
  /// out and the norm is reported without it.
  double loss_scale = 1;
};

/// Adam over `groups` partitioned across the ranks of `comm` (ZeRO stage 1-2's way).
///
/// Stage. Both stages keep 1/N of the optimizer state per rank and every parameter whole on
/// every rank (the caller's `params`); they differ in how the gradients are averaged: stage 2
/// reduce-scatters them (each rank receives only its slice of the average), stage 1
/// all-reduces them (every rank receives the whole average, twice the bytes, and keeps its
/// slice), as DeepSpeed's stage 1 does. Both then all-gather the updated parameters once. The
/// updates are the same wherever the backend's sum is (an exact average is, on every backend).
///
/// Layout. Group g (numel n) is padded with zeros to a multiple of size() elements; rank r owns
/// elements [r * s, (r + 1) * s) of it, s = padded / size(), in an OffloadedOptimizer of its
/// own (the padding elements' gradients are 0 and stay 0 through every update). With the nvme
/// tier each directory of `options` gets a `rank<R>` subfolder for this rank's swap files (as
/// DeepSpeed lays them out): created if missing, never followed if it is a link.
///
/// One rank (LocalCollectives) is exactly an OffloadedOptimizer over the whole groups.
///
/// Collective calls: the constructor (none, but every rank must build one with the same
/// groups), set_params and step must be called by every rank in the same order with the same
/// sizes (Collectives' contract). A rank whose collective fails throws the CollectiveError; the
/// job must then abort (see Collectives).
///
/// Threads: one thread per rank calls the members. Host-memory collectives only (MPI,
/// callbacks, local): UsageError at construction for a device-memory backend.
class ShardedOptimizer {
 public:
  /// `stage` is zero_optimization.stage: 1 or 2 (see Stage above). Throws UsageError for
  /// another stage, for groups the inner optimizer refuses, for a device-memory `comm`; and
  /// whatever OffloadedOptimizer's constructor throws (budget, disk space), naming this rank's
  /// directories.
  ShardedOptimizer(optim::OptimizerOptions options, std::vector<optim::ParamGroupSpec> groups,
                   Collectives& comm, int stage = 2);
  ~ShardedOptimizer();
  ShardedOptimizer(const ShardedOptimizer&) = delete;
  ShardedOptimizer& operator=(const ShardedOptimizer&) = delete;

  std::size_t group_count() const noexcept;
  /// The ZeRO stage given at construction (1 or 2).
  int stage() const noexcept;
  /// Elements of group g this rank owns (padding included), and where its slice starts.
  std::uint64_t shard_numel(std::size_t group) const;
  std::uint64_t shard_offset(std::size_t group) const;

  /// Collective. Every rank passes group g's full initial parameters (the same values): this
  /// rank keeps its slice. UsageError for a size other than the group's numel.
  void set_params(std::size_t group, std::span<const float> full);
  /// Collective. One step over every group: `grads[g]` is this rank's fp32 gradient of group g
  /// (full size); the ranks' gradients are averaged (stage 2: reduce-scatter; stage 1:
  /// all-reduce), the squared norm of each
  /// rank's slices and a count of values that are not finite are all-reduced, so every rank
  /// sees the same global norm and the same verdict: if any averaged gradient is inf or NaN,
  /// every rank skips the step (nothing updated, `params` untouched, StepStats::skipped);
  /// else this rank's slice is updated with grad_scale clip_coefficient(clip, norm) /
  /// loss_scale and `params[g]` (full size) receives the updated parameters of every rank
  /// (all-gather). Returns this rank's optimizer statistics, with global_grad_norm,
  /// grad_scale_applied, loss_scale and the collective byte counts (allgather_bytes 0 for a
  /// skipped step) filled in.
  optim::StepStats step(std::span<const std::span<const float>> grads,
                        std::span<const std::span<float>> params,
                        const ShardedStepOptions& options = {});

  /// Collective. Saves every rank's slices: rank R's optimizer checkpoint in `dir`/rank<R>
  /// (OffloadedOptimizer::save: versions, CRC32C, atomic switch), and in that folder a manifest
  /// naming the world size, the rank and the groups; then rank 0 writes `dir`/zinf-sharded, the
  /// global manifest listing every rank's folder. `dir` is created if missing (a shared file
  /// system, or the same path on every node). If any rank fails, every rank throws (the failure
  /// flag is all-reduced), so that no rank goes on alone into the next collective. Two-phase:
  /// every rank keeps the checkpoint the commit record names until rank 0 has committed the new
  /// one, and removes it only after that, so a rank killed or failing at any moment of the save
  /// leaves the previous checkpoint loadable (or the new one, once committed).
  void save(const std::string& dir);
  /// Collective. Loads what save() wrote: each rank reads its own folder's manifest first and
  /// refuses a checkpoint with other groups, before anything changes. As save(), every rank
  /// throws if any rank failed.
  ///
  /// A checkpoint saved by another world size W is resharded: the global manifest must name
  /// these groups (UsageError otherwise, before anything is read); rank r reads saved ranks
  /// r, r + N, ... (each folder read by one rank only, so every saved folder must be visible
  /// from the rank that reads it: a shared file system, or all ranks on one node), loading each
  /// into a temporary optimizer whose swap files go to a scratch folder `zinf-reshard-*` in
  /// this rank's first NVMe directory (cpu tier: the system's temporary directory), removed at
  /// the end; then, group by group, a reduce-scatter of the floats' bit patterns gives every
  /// rank its new slice, bit for bit. The step count and hyper-parameters are saved rank 0's.
  /// The optimizer options must match the checkpoint's (state precision, sub-group size), as
  /// for OffloadedOptimizer::load. Costs: the saved state is read once and written once more to
  /// the scratch files (about this rank's share of it), and each rank holds 12 bytes per
  /// element of the largest group, padded, for the exchange (plus one saved slice of it).
  /// fp32 and bf16 moments arrive bitwise; int8 moments are decoded and quantised again over
  /// the new slices' blocks. A failure on any rank makes every rank throw; one after the state
  /// began to change leaves this optimizer partly loaded: load again.
  void load(const std::string& dir);

  /// This rank's optimizer over its slices (hyper-parameters, checkpoints of its own state,
  /// statistics).
  optim::OffloadedOptimizer& local() noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zinf::dist
