// SPDX-License-Identifier: Apache-2.0
// ParamTier: where OffloadEngine keeps each layer's low-precision parameters between uses, and
// how they reach the device. Three backends: resident (a device copy per layer), pinned (a
// pinned host copy per layer, copied ahead of use by a LayerPrefetcher with the host source)
// and nvme (a swap store read ahead by a LayerPrefetcher with the store source). The engine validates, checks the
// budget, keeps the step bookkeeping and sums the statistics; everything that differs by tier
// is behind this interface, so a change to one tier is read in one file.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "zinf/adam/cpu_adam.h"
#include "zinf/cuda/device.h"
#include "zinf/offload/config.h"
#include "zinf/offload/engine_types.h"
#include "zinf/optim/optimizer.h"

namespace zinf::offload::detail {

/// The alignment of zinf's host buffers that are not read by O_DIRECT (pinned copies, gradient
/// staging): a page, as pinned registrations are page-granular.
inline constexpr std::uint64_t kHostAlign = 4096;

/// The engine's size limits (LayerSpec): far above any machine, low enough that every byte
/// count the planning makes (up to 16 bytes per element, summed over layers) fits in 64 bits.
inline constexpr std::uint64_t kMaxLayerElements = std::uint64_t{1} << 50;
inline constexpr std::uint64_t kMaxModelElements = std::uint64_t{1} << 54;

/// Bytes of one layer's low-precision copy (bf16 or fp16: two bytes per element).
inline std::uint64_t param_bytes(const LayerSpec& layer) { return layer.numel * 2; }

/// True for the tiers that bring a layer into one of offload_param.buffer_count device buffers
/// of offload_param.buffer_size elements (every tier but resident).
inline bool tier_uses_param_buffers(OffloadDevice kind) { return kind != OffloadDevice::kNone; }

/// What a tier needs from the rest of the engine, computed before anything is created (the
/// nvme tier probes its directories' direct-I/O alignment, which leaves no file).
struct ParamTierPlan {
  OffloadDevice kind = OffloadDevice::kNone;
  /// Pinned host memory the tier holds for its whole life (staging or copies), counted in
  /// zinf.pinned_budget_bytes next to the optimizer's.
  std::uint64_t pinned_bytes = 0;
  /// What those bytes are, for the budget error ("the parameter staging").
  std::string pinned_what;
  /// 0, or the unit (bytes) each sub-group's copy-out must be a whole multiple of: the engine
  /// rounds sub_group_size up so that 2 x sub_group is one.
  std::uint64_t copy_out_unit = 0;
  /// The tier writes updates through StoreCopyOut (OptimizerOptions::store_copy_out).
  bool store_copy_out = false;
  /// The nvme tier's direct-I/O alignment (kHostAlign for the others).
  std::uint32_t alignment = 4096;
};

/// Throws UsageError for what only the tier can check (none today beyond the engine's).
ParamTierPlan plan_param_tier(const EngineConfig& config, const std::vector<LayerSpec>& layers);

/// The tier's share of EngineStats.
struct ParamTierStats {
  std::uint64_t bytes_read = 0;       ///< read from NVMe
  std::uint64_t bytes_written = 0;    ///< written to NVMe
  std::uint64_t bytes_to_device = 0;  ///< copied host -> device
  double stall_seconds = 0;           ///< the compute stream (or fetch) waiting for a layer
  std::uint64_t prefetch_hits = 0;
  std::uint64_t prefetch_on_demand = 0;
  double read_gbps = 0;  ///< NVMe bytes read / time with a read in flight
};

/// One parameter tier. Called only from the engine's controlling thread, which has already
/// checked the call against the layer's state (fetched, gradients given, weights set), so a
/// tier sees: fetch/release alternating per layer; queue_update of a released layer at most
/// once per step, between the optimizer's begin_step and end_step; then finish_step (the step
/// succeeded) or abandon_step (it failed before anything was written); write_from_masters
/// outside a step with the layer released.
class ParamTier {
 public:
  virtual ~ParamTier() = default;

  /// Makes the compute stream wait for `layer`'s parameters on the device and returns them,
  /// valid for work on the compute stream until release(layer). IoError for a failed read.
  virtual cuda::DeviceSpan fetch(std::size_t layer) = 0;
  /// The compute stream is done with `layer` once it reaches this point. Non-blocking.
  virtual void release(std::size_t layer) = 0;
  /// Queues `layer`'s update in `optimizer`'s open step with its copy-out into this tier
  /// (OffloadedOptimizer::step_group, `hooks` passed on).
  virtual void queue_update(optim::OffloadedOptimizer& optimizer, std::size_t layer,
                            adam::GradView grads, GradHooks hooks) = 0;
  /// The step ended well: `updated` layers' new parameters become what the next fetch
  /// returns (for work enqueued on the compute stream from now on); `stats` is the step's.
  virtual void finish_step(std::span<const std::size_t> updated, const StepStats& stats) = 0;
  /// The step failed before anything was written: the layers queued are as they were.
  virtual void abandon_step() = 0;
  /// Writes `layer`'s low-precision copy from its fp32 master weights. Blocks.
  virtual void write_from_masters(std::size_t layer, std::span<const float> masters) = 0;
  /// Pinned host memory held (constant: the plan's pinned_bytes).
  virtual std::uint64_t pinned_bytes() const = 0;
  virtual ParamTierStats stats() const = 0;
};

/// Everything a tier is built from; references must outlive the tier.
struct ParamTierContext {
  const ParamTierPlan& plan;
  const EngineConfig& config;
  const std::vector<LayerSpec>& layers;
  cuda::Device& device;
  cuda::StreamRef compute;
  /// Tests only (offload/testing.h): faults for the nvme tier's I/O engine.
  std::shared_ptr<swap::FaultPlan> faults;
};

/// Builds the tier plan.kind names: creates its files (nvme), buffers and device memory.
std::unique_ptr<ParamTier> make_param_tier(const ParamTierContext& context);

// The backends, one file each (param_tier_*.cc).
std::unique_ptr<ParamTier> make_resident_param_tier(const ParamTierContext& context);
std::unique_ptr<ParamTier> make_pinned_param_tier(const ParamTierContext& context);
std::unique_ptr<ParamTier> make_nvme_param_tier(const ParamTierContext& context);
ParamTierPlan plan_nvme_param_tier(const EngineConfig& config,
                                   const std::vector<LayerSpec>& layers);

}  // namespace zinf::offload::detail
