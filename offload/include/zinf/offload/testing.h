// SPDX-License-Identifier: Apache-2.0
// Test hooks of the offload layer, kept out of EngineConfig so that what a trainer configures
// is only what a trainer should: fault plans for an OffloadEngine's I/O engines (the
// optimizer's own checkpoint hook is zinf/optim/testing.h's). For tests and fault drills;
// nothing here is read from or written to a config.
// The namespace is test_hooks, not testing: inside zinf::offload a nested `testing` would hide
// GoogleTest's ::testing from the tests that use both.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "zinf/cuda/device.h"
#include "zinf/offload/config.h"
#include "zinf/offload/engine.h"
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

}  // namespace zinf::offload::test_hooks
