// SPDX-License-Identifier: Apache-2.0
// Seams of OffloadEngine for a layer built above it: what zinf::dist's ShardedEngine plugs
// into each rank's engine so that the staged step's verdict (global norm, clipping, overflow
// skip, loss-scale update) is the job's, not the rank's. Trainers do not need this header.
#pragma once

#include <functional>

#include "zinf/offload/engine.h"

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

}  // namespace zinf::offload
