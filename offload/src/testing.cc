// SPDX-License-Identifier: Apache-2.0
// The test hooks of zinf/offload/testing.h: they reach the engine's private construction
// through the friend class engine.h names.
#include "zinf/offload/testing.h"

#include <utility>

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

std::unique_ptr<OffloadEngine> make_engine_with_faults(EngineConfig config,
                                                       std::vector<LayerSpec> layers,
                                                       cuda::Device& device,
                                                       cuda::StreamRef compute_stream,
                                                       EngineFaults faults) {
  return EngineAccess::make(std::move(config), std::move(layers), device, compute_stream, faults);
}

}  // namespace zinf::offload::test_hooks
