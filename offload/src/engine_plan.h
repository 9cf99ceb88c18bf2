// SPDX-License-Identifier: Apache-2.0
// EnginePlan: what an OffloadEngine will be, decided from its config and layers before anything
// is built: the checks, the sub-group, the optimizer's options, the staged mode's gradient
// staging, the pinned budget's breakdown (and the error when it does not fit), the drive-wear
// estimate both wear notices use, the notices logged at construction and the drive-slowdown
// watches. OffloadEngine's constructor builds from it; the tests read it
// without creating an engine. Private to zinf::offload.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "grad_stage.h"
#include "param_tier.h"
#include "zinf/offload/config.h"
#include "zinf/offload/engine_types.h"
#include "zinf/optim/optimizer.h"

namespace zinf::offload::detail {

/// The pinned bytes each user of zinf.pinned_budget_bytes needs, in the order the budget error
/// names them.
struct PinnedBreakdown {
  std::uint64_t optimizer = 0;     ///< the optimizer's ring (nvme) or whole state (cpu)
  std::uint64_t params = 0;        ///< the parameter tier's (ParamTierPlan::pinned_bytes)
  std::uint64_t device_grads = 0;  ///< zinf.grad_staging_buffers x the largest layer's fp32
  std::uint64_t stage = 0;         ///< staged mode: the gradient staging, whole or its ring
  std::uint64_t total() const { return optimizer + params + device_grads + stage; }
};

/// How much a step writes to NVMe and where, for the drive-wear notices (zinf.tbw_tb).
struct WearEstimate {
  /// Bytes every step writes: the optimizer's whole state (nvme tier) plus the updated
  /// low-precision parameters (nvme parameter tier), before padding to the I/O alignment.
  double bytes_per_step = 0;
  /// The NVMe directories written to, comma-separated, each once.
  std::string where;
};

/// One drive-slowdown watch (zinf.rate_notice_*): RateWatch's arguments.
struct RateNoticePlan {
  std::string what;  ///< "optimizer writes to <dirs>" or "optimizer reads from <dirs>"
  double share = 0;
  std::uint32_t steps = 0;
  double reference_gbps = 0;  ///< zinf.tuned_write_gbps or tuned_read_gbps; 0: measured
};

/// The engine's plan (see the file comment).
struct EnginePlan {
  ParamTierPlan params;
  /// config.sub_group_size clamped to [1, 2^50] and, where the tier's copy-out needs whole
  /// store units, rounded up so that 2 x sub_group is a multiple of params.copy_out_unit.
  std::uint64_t sub_group = 0;
  /// The info line for that rounding; empty if nothing was rounded.
  std::string sub_group_note;
  /// What the optimizer is built with: one group per layer, in layer order; no fault plans;
  /// pinned_budget_bytes its own need (pinned.optimizer).
  optim::OptimizerOptions optimizer;
  std::vector<optim::ParamGroupSpec> groups;
  StepMode mode = StepMode::kOnArrival;
  /// Staged mode only: the gradient staging (no fault plans).
  std::optional<GradStageOptions> stage;
  /// Bytes of one device-gradient staging buffer (the largest layer's fp32, page-aligned).
  std::uint64_t grad_slot_bytes = 0;
  PinnedBreakdown pinned;
  /// Empty if pinned.total() fits zinf.pinned_budget_bytes; else the UsageError's text,
  /// naming each share and the smallest budget that works.
  std::string budget_error;
  /// zinf.tbw_tb > 0 only.
  std::optional<WearEstimate> wear;
  /// The notice-level lines the engine logs once the budget fits, in order: each of the
  /// config's notices ("config: ..."), then the start-up wear notice where wear is set and a
  /// step writes to NVMe.
  std::vector<std::string> notices;
  /// The watches of the optimizer's NVMe writes and reads; none where its state is not on NVMe
  /// or zinf.rate_notice_share is 0.
  std::optional<RateNoticePlan> write_notice;
  std::optional<RateNoticePlan> read_notice;
};

/// Checks `config` (check_config) and `layers` against it (names, sizes, dtypes,
/// hyper-parameters, offload_param buffers) and plans the engine. Throws UsageError for what
/// the config and layers contradict (not for the budget: see EnginePlan::budget_error). Builds
/// nothing; the nvme tiers' alignment probes create no lasting file.
EnginePlan plan_engine(const EngineConfig& config, const std::vector<LayerSpec>& layers);

/// The start-up wear notice: what a step writes and how many steps the rated endurance lasts.
std::string wear_notice(const WearEstimate& wear, double tbw_tb);

/// The wear notice at the measured rate: `bytes_per_step` written per step to wear.where at
/// `seconds_per_step`, measured over steps 2 to `last_step`.
std::string measured_wear_notice(const WearEstimate& wear, double tbw_tb, double bytes_per_step,
                                 double seconds_per_step, std::uint64_t last_step);

}  // namespace zinf::offload::detail
