// SPDX-License-Identifier: Apache-2.0
// `zinf stress`'s report on stdout: the table, or with --json one object.
#pragma once

#include <cstdint>
#include <string>

#include "options.h"
#include "verdict.h"

namespace zinf::tools::stress {

/// The library's log lines during the run: error and warning lines, and how many of each were
/// shown on stderr (the rest only counted).
struct LogCounts {
  std::uint64_t errors = 0;
  std::uint64_t warnings = 0;
  std::uint64_t shown = 0;
};

/// Prints the report of a finished run on stdout: the figures, the faults, pinned memory, the
/// problems and PASS or FAIL (--json: the same as one object).
void print_report(const StressOptions& cfg, const StressTotals& totals, const StressVerdict& v,
                  double seconds, const std::string& engine_name, const LogCounts& log);

}  // namespace zinf::tools::stress
