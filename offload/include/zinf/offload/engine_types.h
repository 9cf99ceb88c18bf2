// SPDX-License-Identifier: Apache-2.0
// The vocabulary OffloadEngine's API speaks, apart from the engine itself: the layers it is
// built over (LayerSpec) and the optimizer's types that cross its calls (StepStats,
// SaveSnapshot, GradHooks; zinf/optim/optimizer.h). What the engine's private parts (the
// parameter tiers, the plan) need without the engine's class.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "zinf/adam/cpu_adam.h"
#include "zinf/common/element_type.h"
#include "zinf/optim/optimizer.h"

namespace zinf::offload {

using optim::GradHooks;
using optim::SaveSnapshot;
using optim::StepStats;

/// One layer (or parameter shard) the engine manages: its element count and the dtype of its
/// parameters on the device, optionally hyper-parameters of its own. The fp32 master copy and
/// both moments live in the optimizer tier.
struct LayerSpec {
  std::string name;         ///< for messages and checkpoints; unique, not empty
  std::uint64_t numel = 0;  ///< > 0, at most 2^50; 2^54 over all layers (UsageError)
  ElementType param_dtype =
      ElementType::kBF16;  ///< kBF16 or kF16 (the device copy; fp32 is the master)
  /// This layer's hyper-parameters from construction on, instead of config.optimizer.hyper
  /// (the usual case: weight_decay 0 for biases and norms); `step` is ignored. Checked at
  /// construction (UsageError naming the layer). Initial values only: set_hyper(hyper) for
  /// all layers replaces them too, and so does load().
  std::optional<adam::AdamParams> hyper = std::nullopt;
};

}  // namespace zinf::offload
