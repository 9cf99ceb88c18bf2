// SPDX-License-Identifier: Apache-2.0
// `zinf stress`'s pass/fail judgement: a pure function of what the workers counted, the pinned
// memory they used and the options, so that each rule is tested on its own.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "options.h"
#include "tally.h"
#include "throughput.h"

namespace zinf::tools::stress {

/// Pinned memory at the end of a run. The arenas are reserved whole (swap pool, prefetch
/// staging) and the optimizer's ring as it grows; `peak` adds each part's own peak, an upper
/// bound on the true simultaneous peak.
struct PinnedMemory {
  std::uint64_t reserved = 0;
  std::uint64_t peak = 0;
  std::uint64_t pool_peak = 0;  ///< the swap workers' pool, against its share
  std::uint64_t pool_budget = 0;
  std::uint64_t optimizer_peak = 0;
  std::uint64_t optimizer_budget = 0;
  std::uint64_t prefetch_peak_held = 0;
  std::uint64_t prefetch_budget = 0;
};

/// Device memory at the end of a run: the device's own count of what it allocated at once at
/// its peak, against --gpu-mem (or its default).
struct DeviceMemory {
  std::string name;  ///< "host" or "cuda:0"
  std::uint64_t peak = 0;
  std::uint64_t budget = 0;
};

/// Everything a finished run is judged by: the workers' tallies summed, the pinned and device
/// memory, what --plant-corruption flipped ("" if nothing), and the verified rate over time.
struct StressTotals {
  Tally tally;
  PinnedMemory pinned;
  DeviceMemory device;
  std::string planted;
  std::vector<ThroughputSample> samples;
  ThroughputProfile profile;
};

/// The rules a run can break; any one fails it.
enum class StressRule {
  kMismatch,             ///< bytes read back differ from what was written
  kHardFaultUnsurfaced,  ///< an injected EIO/ENOSPC that no operation reported
  kUnexpectedError,      ///< an error with no hard fault injected (or a worker stopped)
  kCorruption,           ///< a checksum found corruption nobody planted
  kErrorWithoutContext,  ///< an error not naming offset and length
  kBudgetOverrun,        ///< pinned memory over --budget or over a part's share of it
  kDeviceOverrun,        ///< device memory over --gpu-mem
  kNothingPlanted,       ///< --plant-corruption asked, but nothing was flipped
};

struct StressVerdict {
  std::vector<StressRule> broken;  ///< in the order above; empty for a pass
  /// The report's problem lines: the workers' own (the first few), then the judgement's.
  std::vector<std::string> problems;
  bool pass() const { return broken.empty(); }
  bool broke(StressRule rule) const;
};

/// Whether pinned memory went over --budget (`budget`), or a part over its share.
bool over_budget(const PinnedMemory& pinned, std::uint64_t budget);

/// The verdict on a run. A mismatch, an unsurfaced hard fault, an unexpected error, a
/// corruption found, an error without context, a budget overrun (pinned or device memory),
/// and --plant-corruption that
/// planted nothing each fail it; faults injected and surfaced as errors, recoverable faults
/// absorbed, and operations failed by those faults do not.
StressVerdict judge(const StressTotals& totals, const StressOptions& options);

}  // namespace zinf::tools::stress
