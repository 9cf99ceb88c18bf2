// SPDX-License-Identifier: Apache-2.0
#include "verdict.h"

#include <algorithm>
#include <string>

namespace zinf::tools::stress {

bool StressVerdict::broke(StressRule rule) const {
  return std::find(broken.begin(), broken.end(), rule) != broken.end();
}

bool over_budget(const PinnedMemory& p, std::uint64_t budget) {
  return p.reserved > budget || p.peak > budget || p.pool_peak > p.pool_budget ||
         p.optimizer_peak > p.optimizer_budget || p.prefetch_peak_held > p.prefetch_budget;
}

StressVerdict judge(const StressTotals& totals, const StressOptions& options) {
  const Tally& t = totals.tally;
  StressVerdict v;
  if (t.mismatches != 0) v.broken.push_back(StressRule::kMismatch);
  if (t.hard_unsurfaced != 0) v.broken.push_back(StressRule::kHardFaultUnsurfaced);
  if (t.unexpected_errors != 0) v.broken.push_back(StressRule::kUnexpectedError);
  if (t.corruption_errors != 0) v.broken.push_back(StressRule::kCorruption);
  if (t.errors_without_context != 0) v.broken.push_back(StressRule::kErrorWithoutContext);
  // The workers' problems come first; the judgement's own follow, under the same cap.
  Tally lines;
  lines.problems = t.problems;
  if (over_budget(totals.pinned, options.budget)) {
    v.broken.push_back(StressRule::kBudgetOverrun);
    lines.problem("pinned memory over budget");
  }
  if (totals.device.peak > totals.device.budget) {
    v.broken.push_back(StressRule::kDeviceOverrun);
    lines.problem("device memory over --gpu-mem: peak " + std::to_string(totals.device.peak) +
                  " bytes on " + totals.device.name + ", budget " +
                  std::to_string(totals.device.budget));
  }
  if (options.plant && totals.planted.empty()) {
    v.broken.push_back(StressRule::kNothingPlanted);
    lines.problem("plant-corruption: nothing was planted");
  }
  v.problems = std::move(lines.problems);
  return v;
}

}  // namespace zinf::tools::stress
