// SPDX-License-Identifier: Apache-2.0
// The tier plans and the one place that picks a backend by the config's parameter tier.
#include "param_tier.h"

#include "zinf/common/align.h"
#include "zinf/common/error.h"

namespace zinf::offload::detail {
namespace {


// The resident and pinned tiers: one 4 KiB-aligned host copy per layer (pinned only for the
// pinned tier; the resident tier's host copies are ordinary memory, outside the budget).
std::uint64_t host_copy_bytes(const std::vector<LayerSpec>& layers) {
  std::uint64_t total = 0;
  for (const auto& layer : layers) total += align_up(param_bytes(layer), kHostAlign);
  return total;
}

}  // namespace

ParamTierPlan plan_param_tier(const EngineConfig& config, const std::vector<LayerSpec>& layers) {
  ParamTierPlan plan;
  plan.kind = config.offload_param.device;
  plan.alignment = static_cast<std::uint32_t>(kHostAlign);
  plan.pinned_what = "the pinned parameter copies";
  switch (plan.kind) {
    case OffloadDevice::kNone: break;
    case OffloadDevice::kCpu: plan.pinned_bytes = host_copy_bytes(layers); break;
    case OffloadDevice::kNvme: plan = plan_nvme_param_tier(config, layers); break;
  }
  return plan;
}

std::unique_ptr<ParamTier> make_param_tier(const ParamTierContext& context) {
  switch (context.plan.kind) {
    case OffloadDevice::kNone: return make_resident_param_tier(context);
    case OffloadDevice::kCpu: return make_pinned_param_tier(context);
    case OffloadDevice::kNvme: return make_nvme_param_tier(context);
  }
  throw UsageError("OffloadEngine: unknown offload_param.device value");
}

}  // namespace zinf::offload::detail
