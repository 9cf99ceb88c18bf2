// SPDX-License-Identifier: Apache-2.0
// LossScaler: the fp16 loss scale of OffloadEngine's staged step mode, static or dynamic with
// DeepSpeed's documented rules (deepspeed/runtime/precision_config.py and its config docs):
// start at 2^initial_scale_power; on an overflow, spend one unit of hysteresis, or halve the
// scale once it is spent (never below min_loss_scale); after loss_scale_window consecutive
// steps without overflow, double it and refill the hysteresis (with consecutive_hysteresis,
// every step without overflow refills it). Private to zinf::offload.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "zinf/offload/config.h"

namespace zinf::offload::detail {

/// The state a checkpoint keeps so that a resumed run scales as the uninterrupted one would.
struct LossScaleState {
  double scale = 1;
  std::uint32_t hysteresis_left = 1;  ///< overflows still tolerated before the next halving
  std::uint64_t good_steps = 0;       ///< steps without overflow since the last overflow/growth
  bool operator==(const LossScaleState&) const = default;
};

/// The loss scale the trainer multiplies its loss by, and its update after each step.
/// Disabled config: the scale is 1 for ever. Static (loss_scale > 0): that scale for ever;
/// overflows still skip steps but change nothing here. Not thread-safe (the engine's
/// controlling thread).
class LossScaler {
 public:
  /// `config` as check_config() accepts it.
  explicit LossScaler(const LossScaleConfig& config);

  double scale() const noexcept { return state_.scale; }
  bool dynamic() const noexcept { return dynamic_; }
  /// Records one step: `overflow` if its gradients held an inf or NaN (the step was skipped).
  void update(bool overflow);

  const LossScaleState& state() const noexcept { return state_; }
  /// Restores a state (from a checkpoint); false, changing nothing, for a state this config
  /// cannot reach (scale not finite or not > 0, hysteresis_left 0 or above the config's).
  bool restore(const LossScaleState& state);

  /// One small text file: a header line, then the state exactly (hexfloat scale).
  static std::string to_text(const LossScaleState& state);
  /// Parses to_text's output; std::nullopt for anything else.
  static std::optional<LossScaleState> from_text(std::string_view text);

 private:
  LossScaleConfig config_;
  bool dynamic_ = false;
  LossScaleState state_;
};

}  // namespace zinf::offload::detail
