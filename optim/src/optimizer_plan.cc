// SPDX-License-Identifier: Apache-2.0
// OffloadedOptimizer's planning, from the options and groups alone: the checks that need no
// file and no memory, the sub-group size, the pinned budget (the state store's share and the
// copy-out staging), and the hyper-parameter checks.
#include <algorithm>
#include <string>
#include <unordered_set>

#include "optimizer_impl.h"
#include "zinf/common/align.h"
#include "zinf/common/error.h"
#include "zinf/optim/optimizer.h"

namespace zinf::optim {

std::uint64_t copy_out_staging_bytes(std::uint64_t sub, std::uint64_t max_group_numel,
                                     std::uint32_t alignment) {
  return align_up(std::min(sub, max_group_numel) * 2, alignment);
}

PinnedPlan plan_pinned(const OptimizerOptions& o, const StateStorePlan& store,
                       const RecordSizes& sizes) {
  PinnedPlan plan{store.pinned_bytes, store.pinned_what};
  if (o.store_copy_out) {
    const std::uint64_t staging =
        copy_out_staging_bytes(sizes.sub, sizes.max_group_numel, store.alignment);
    const std::uint64_t count = copy_out_buffer_count(o);
    plan.need += count * staging;
    plan.what += ", plus the copy-out staging: " + std::to_string(count) + " x " +
                 std::to_string(staging) + " bytes";
  }
  return plan;
}

std::uint32_t copy_out_buffer_count(const OptimizerOptions& options) {
  return std::max<std::uint32_t>(options.pipeline_depth, 2);
}

std::uint64_t store_copy_out_sub_group(std::uint64_t requested, const swap::SwapStore& store) {
  const std::uint64_t unit = store.checksums()
                                 ? std::max<std::uint64_t>(store.stripe_bytes(), store.alignment())
                                 : store.alignment();
  return align_up(std::max<std::uint64_t>(requested, 1) * 2, unit) / 2;
}

namespace {

// A bound on the bookkeeping (a key and a lease per sub-group): 2^22 sub-groups.
constexpr std::uint64_t kMaxRecords = std::uint64_t{1} << 22;

}  // namespace

std::uint64_t check_options(const OptimizerOptions& options,
                            const std::vector<ParamGroupSpec>& groups) {
  if (groups.empty()) throw UsageError("OffloadedOptimizer: no parameter groups");
  std::unordered_set<std::string> names;
  for (const auto& grp : groups) {
    if (grp.numel == 0 || grp.numel > kMaxNumel) {
      throw UsageError("OffloadedOptimizer: group '" + grp.name + "' numel " +
                       std::to_string(grp.numel) + " is out of range [1, 2^40]");
    }
    if (grp.name.empty() || grp.name.find_first_of("\r\n") != std::string::npos) {
      throw UsageError("OffloadedOptimizer: group names must be non-empty single lines");
    }
    if (!names.insert(grp.name).second) {
      throw UsageError("OffloadedOptimizer: duplicate group name '" + grp.name + "'");
    }
  }
  validate_hyper(options.hyper);
  for (const auto& grp : groups) {
    if (grp.hyper) validate_hyper(*grp.hyper, grp.name);
  }
  const std::uint64_t sub = std::min(options.sub_group_elements, kMaxNumel);
  std::uint64_t record_count = 0;
  for (const auto& grp : groups) record_count += (grp.numel + sub - 1) / sub;
  if (record_count > kMaxRecords) {
    throw UsageError("OffloadedOptimizer: " + std::to_string(record_count) +
                     " sub-groups exceed the limit of " + std::to_string(kMaxRecords) +
                     "; raise sub_group_elements");
  }
  return record_count;
}

namespace {

// The most elements, at most `most`, whose record in precision `p` takes at most `limit` bytes
// (record bytes grow with the count); for int8 a multiple of its scale block where that is
// possible, so that only a group's last record has a short block.
std::uint64_t elements_within(adam::StatePrecision p, std::uint64_t limit, std::uint64_t most) {
  std::uint64_t lo = 1, hi = most;
  while (lo < hi) {
    const std::uint64_t mid = hi - (hi - lo) / 2;
    if (record_state_bytes(p, mid) <= limit) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  if (p == adam::StatePrecision::kInt8 && lo >= adam::kInt8Block) lo -= lo % adam::kInt8Block;
  return lo;
}

}  // namespace

std::uint64_t default_sub_group_elements(adam::StatePrecision precision) noexcept {
  // fp32's record at 1M elements: 12 MiB (fp32 1,048,576, bf16 1,572,864, int8 2,054,336).
  constexpr std::uint64_t kRecordBytes = std::uint64_t{12} << 20;
  return elements_within(precision, kRecordBytes, kRecordBytes);
}

std::uint64_t effective_sub_group_elements(const OptimizerOptions& options,
                                           const std::vector<ParamGroupSpec>& groups) {
  const std::uint64_t want =
      std::min(options.sub_group_elements == 0 ? default_sub_group_elements(options.state_precision)
                                               : options.sub_group_elements,
               kMaxNumel);
  if (!options.fit_sub_groups_to_stripes || options.store_copy_out) return want;
  bool splits = false;
  for (const auto& g : groups) splits = splits || g.numel > want;
  if (!splits) return want;
  // The stripe unit of the store the optimizer makes (SwapStoreOptions' default); the records'
  // 4 KiB padding is the smallest alignment a direct-I/O file system asks.
  const std::uint64_t stripe = swap::SwapStoreOptions{}.stripe_bytes;
  const adam::StatePrecision p = options.state_precision;
  const std::uint64_t bytes = align_up(record_state_bytes(p, want), 4096);
  if (bytes <= stripe || bytes % stripe == 0) return want;
  return elements_within(p, bytes / stripe * stripe, want);
}

std::uint64_t optimizer_pinned_bytes_needed(const OptimizerOptions& options,
                                            const std::vector<ParamGroupSpec>& groups) {
  OptimizerOptions o = options;
  o.sub_group_elements = effective_sub_group_elements(options, groups);
  (void)check_options(o, groups);
  const StateStorePlan store = plan_state_store(o, groups);
  return plan_pinned(o, store, record_sizes(o, groups, store.alignment)).need;
}

double clip_coefficient(double clip, double norm) noexcept {
  constexpr double kClipEpsilon = 1e-6;
  return clip > 0 ? std::min(1.0, clip / (norm + kClipEpsilon)) : 1.0;
}

std::string_view save_snapshot_name(SaveSnapshot snapshot) noexcept {
  switch (snapshot) {
    case SaveSnapshot::kReflink: return "reflink";
    case SaveSnapshot::kStreamed: return "streamed";
    case SaveSnapshot::kNone: break;
  }
  return "none";
}

void validate_hyper(const adam::AdamParams& hp, const std::string& group) {
  if (auto bad = adam::check_adam_params(hp)) {
    const std::string where = group.empty() ? "" : "group '" + group + "': ";
    throw UsageError("OffloadedOptimizer: " + where + std::string(bad->field) + " " + bad->what);
  }
}

}  // namespace zinf::optim
