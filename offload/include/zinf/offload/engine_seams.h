// SPDX-License-Identifier: Apache-2.0
// Seams of OffloadEngine for a layer built above it: what zinf::dist's ShardedEngine plugs
// into each rank's engine so that the staged step's verdict (global norm, clipping, overflow
// skip, loss-scale update) is the job's, not the rank's. Trainers do not need this header.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "zinf/offload/engine.h"
#include "zinf/optim/optimizer.h"

namespace zinf::offload {

/// Staged step mode: at each step(), before the norm and the overflow verdict, `reduce` is
/// called (on the controlling thread, once per step, before anything of the step changes)
/// with this engine's sum of squares of its staged, still loss-scaled gradients (inf or NaN
/// if any is not finite), and the step uses what it returns instead: the norm is
/// sqrt(returned) / loss_scale(), and a non-finite value skips the step. A sharded engine
/// returns the sum over every rank (an all-reduce), so that every rank clips by the same
/// factor and skips together. If `reduce` throws, step() throws that before anything changed
/// (the staged gradients stay; the step did not happen). An empty function restores the
/// local sum. Unused in the on_arrival mode. UsageError inside a step.
void set_sum_of_squares_reducer(OffloadEngine& engine, std::function<double(double)> reduce);

// Resharding: moving an engine checkpoint's state into engines whose layers are sliced
// otherwise (ShardedEngine::load of a checkpoint saved by another world size).

/// The options `engine` built its optimizer with (one group per layer, in layer order, named
/// and with the hyper-parameters of its LayerSpec), without test fault plans: what a reader of
/// the optimizer state in its checkpoints needs.
optim::OptimizerOptions optimizer_options(const OffloadEngine& engine);

/// Sets layer `layer`'s fp32 master weights and both moments (OffloadedOptimizer::set_state)
/// and writes its low-precision copy from the masters, as load() does. Blocks; UsageError
/// inside a step or for spans of another size; IoError on a failed write.
void set_layer_state(OffloadEngine& engine, std::size_t layer, std::span<const float> master,
                     std::span<const float> m, std::span<const float> v);

/// The number of steps taken (the next step's bias correction), as load() restores it.
void set_step_count(OffloadEngine& engine, std::uint64_t steps);

/// The number of steps taken so far (what a checkpoint saved now records).
std::uint64_t step_count(const OffloadEngine& engine);

/// Where `engine` scales the loss dynamically: the loss scale's state saved in engine
/// checkpoint `dir` (open: read through its descriptor) as text, or nullopt with a notice
/// where the checkpoint has none (as load()). nullopt, reading nothing, for an engine without
/// dynamic loss scaling.
std::optional<std::string> saved_loss_scale(const OffloadEngine& engine, const swap::Dir& dir,
                                            std::string_view who);

/// Restores a state saved_loss_scale() returned (read from `shown`), as load() does: IoError
/// kCorrupt if it is not one, UsageError if this engine's config could not have produced it.
/// Nothing for an engine without dynamic loss scaling.
void restore_loss_scale(OffloadEngine& engine, const std::string& text, const std::string& shown,
                        std::string_view who);

/// The run `engine`'s checkpoints record, and going on as another run: its optimizer's
/// OffloadedOptimizer::checkpoint_run and set_checkpoint_run (same errors).
std::string checkpoint_run(OffloadEngine& engine);
void set_checkpoint_run(OffloadEngine& engine, const std::string& run);

/// save(dir) whose optimizer keeps the versions it supersedes (kKeep), and their removal once
/// the caller's commit is done: OffloadedOptimizer::save(dir, superseded) and
/// remove_superseded_versions (same errors), for ShardedEngine's two-phase commit.
void save(OffloadEngine& engine, const swap::Dir& dir, optim::SupersededVersions superseded);
void remove_superseded_versions(OffloadEngine& engine);

}  // namespace zinf::offload
