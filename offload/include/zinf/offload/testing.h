// SPDX-License-Identifier: Apache-2.0
// Test hooks of the offload layer, kept out of the public option structs (EngineConfig,
// OptimizerOptions) so that what a trainer configures is only what a trainer should: fault
// plans for an OffloadEngine's I/O engines, and a progress hook inside OffloadedOptimizer's
// checkpoint save. For tests and fault drills; nothing here is read from or written to a config.
// The namespace is test_hooks, not testing: inside zinf::offload a nested `testing` would hide
// GoogleTest's ::testing from the tests that use both.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>
#include <vector>

#include "zinf/cuda/device.h"
#include "zinf/offload/config.h"
#include "zinf/offload/engine.h"
#include "zinf/offload/optimizer.h"
#include "zinf/swap/fault_injection.h"

namespace zinf::offload::test_hooks {

/// Faults injected into an OffloadEngine's I/O engines (swap::IoOptions::faults), so that a
/// test can prove how the engine handles failed reads and write-backs. Either may be null.
struct EngineFaults {
  /// The parameter swap store's engine (offload_param "nvme"; unused by the other tiers).
  std::shared_ptr<swap::FaultPlan> param;
  /// The optimizer's engine: its NVMe state and its checkpoints (every optimizer tier).
  std::shared_ptr<swap::FaultPlan> optimizer;
  /// The staged step mode's NVMe gradient staging (used only when it stages on NVMe). With a
  /// default, so that initialisers naming only the two above stay complete.
  std::shared_ptr<swap::FaultPlan> grad_stage = nullptr;
};

/// Builds an OffloadEngine exactly as its constructor does (same arguments, same errors), with
/// `faults` installed in its I/O engines. The plans are shared: the caller keeps its pointers
/// to count what they injected.
std::unique_ptr<OffloadEngine> make_engine_with_faults(EngineConfig config,
                                                       std::vector<LayerSpec> layers,
                                                       cuda::Device& device,
                                                       cuda::StreamRef compute_stream,
                                                       EngineFaults faults);

/// Called on the saving thread as an OffloadedOptimizer checkpoint progresses, with the phase
/// ("created" once the new version's directory exists, empty; "data" after each record is
/// written, with the data bytes written so far; "synced", "committed", "latest", "done"), so
/// that a test can kill the process, or plant files, at a chosen point.
using CheckpointHook = std::function<void(std::string_view phase, std::uint64_t bytes)>;

/// Installs `hook` on `optimizer` for its later saves (replacing any; an empty function
/// removes it). Not while a save of it is running (the optimizer's one controlling thread).
void set_checkpoint_hook(OffloadedOptimizer& optimizer, CheckpointHook hook);

}  // namespace zinf::offload::test_hooks
