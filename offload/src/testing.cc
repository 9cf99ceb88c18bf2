// SPDX-License-Identifier: Apache-2.0
// The test hooks of zinf/offload/testing.h: they reach the engine's and the optimizer's
// private construction and state through the friend classes those headers name.
#include "zinf/offload/testing.h"

#include <utility>

#include "optimizer_impl.h"

namespace zinf::offload::test_hooks {

class EngineAccess {
 public:
  static std::unique_ptr<OffloadEngine> make(EngineConfig config, std::vector<LayerSpec> layers,
                                             cuda::Device& device, cuda::StreamRef compute,
                                             const EngineFaults& faults) {
    return std::unique_ptr<OffloadEngine>(
        new OffloadEngine(std::move(config), std::move(layers), device, compute, faults));
  }
};

class OptimizerAccess {
 public:
  static void set_checkpoint_hook(OffloadedOptimizer& optimizer, CheckpointHook hook) {
    optimizer.impl_->checkpoint_hook = std::move(hook);
  }
};

std::unique_ptr<OffloadEngine> make_engine_with_faults(EngineConfig config,
                                                       std::vector<LayerSpec> layers,
                                                       cuda::Device& device,
                                                       cuda::StreamRef compute_stream,
                                                       EngineFaults faults) {
  return EngineAccess::make(std::move(config), std::move(layers), device, compute_stream, faults);
}

void set_checkpoint_hook(OffloadedOptimizer& optimizer, CheckpointHook hook) {
  OptimizerAccess::set_checkpoint_hook(optimizer, std::move(hook));
}

}  // namespace zinf::offload::test_hooks
