// SPDX-License-Identifier: Apache-2.0
// The state stores' shared planning, the tiers' names, and the one place that picks a store by
// OptimizerOptions::tier.
#include "state_store.h"

#include <algorithm>
#include <iterator>
#include <string>
#include <utility>

#include "zinf/common/align.h"
#include "zinf/common/error.h"

namespace zinf::optim {
namespace {

// The tiers' names, by StateTier's value: parse_state_tier reads them, state_tier_name (and so
// a checkpoint's manifest) writes them.
constexpr std::string_view kTierNames[] = {"cpu", "nvme"};
static_assert(std::size(kTierNames) == static_cast<std::size_t>(StateTier::kNvme) + 1);

}  // namespace

StateTier parse_state_tier(std::string_view text, std::string_view what) {
  for (std::size_t i = 0; i < std::size(kTierNames); ++i) {
    if (text == kTierNames[i]) return static_cast<StateTier>(i);
  }
  throw UsageError("invalid " + std::string(what) + " '" + std::string(text) +
                   "': expected cpu or nvme");
}

std::string_view state_tier_name(StateTier tier) noexcept {
  const auto i = static_cast<std::size_t>(tier);
  return i < std::size(kTierNames) ? kTierNames[i] : "unknown";
}

std::string bytes_per_element_text(adam::StatePrecision p) {
  switch (p) {
    case adam::StatePrecision::kF32: return "12";
    case adam::StatePrecision::kBF16: return "8";
    case adam::StatePrecision::kInt8: break;
  }
  return "6.125";
}

RecordSizes record_sizes(const OptimizerOptions& options, const std::vector<ParamGroupSpec>& groups,
                         std::uint32_t alignment) {
  RecordSizes s;
  s.sub = options.sub_group_elements;
  const adam::StatePrecision p = options.state_precision;
  for (const auto& g : groups) {
    s.max_group_numel = std::max(s.max_group_numel, g.numel);
    const std::uint64_t full = g.numel / s.sub;
    const std::uint64_t rest = g.numel % s.sub;
    const std::uint64_t full_bytes = align_up(record_state_bytes(p, s.sub), alignment);
    const std::uint64_t rest_bytes =
        rest > 0 ? align_up(record_state_bytes(p, rest), alignment) : 0;
    if (full > 0) s.max_record_bytes = std::max(s.max_record_bytes, full_bytes);
    if (rest > 0) s.max_record_bytes = std::max(s.max_record_bytes, rest_bytes);
    s.state_bytes += full * full_bytes + rest_bytes;
    s.count += static_cast<std::size_t>(full + (rest > 0 ? 1 : 0));
  }
  return s;
}

StateStorePlan plan_state_store(const OptimizerOptions& options,
                                const std::vector<ParamGroupSpec>& groups) {
  switch (options.tier) {
    case StateTier::kCpu: return plan_cpu_state_store(options, groups);
    case StateTier::kNvme: return plan_nvme_state_store(options, groups);
  }
  throw UsageError("OffloadedOptimizer: unknown state tier");
}

}  // namespace zinf::optim
