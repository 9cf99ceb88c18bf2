// SPDX-License-Identifier: Apache-2.0
// How a time-based run's per-interval rates are shown: the text lines under a report (a
// sparkline, the steady state, the cliff if any) and the JSON fields. One presentation for
// `zinf bench io --duration` and `zinf stress`; the analysis itself is throughput.h's.
#pragma once

#include <string>
#include <vector>

#include "json_out.h"
#include "throughput.h"

namespace zinf::tools {

/// Two lines, each ending in '\n': "<label> over time (N samples of <interval>, scale 0 to X
/// GB/s): <sparkline>" and the steady state with its noise, then where the rate fell (with the
/// bytes moved before), or why no fall was judged, or "no fall beyond the noise". "" for no
/// samples. `interval` names the nominal sample length ("1 s").
std::string over_time_text(const std::string& label, const std::vector<ThroughputSample>& samples,
                           const ThroughputProfile& profile, const std::string& interval);

/// Sets `samples` ([{t_s, seconds, bytes, gbps}, ...]), `steady_gbps`, `noise_gbps`, `cliff`
/// ({at_s, bytes_before, before_gbps, after_gbps} or null) and, when no fall was judged,
/// `cliff_note` in `j`.
void add_over_time(Json& j, const std::vector<ThroughputSample>& samples,
                   const ThroughputProfile& profile);

}  // namespace zinf::tools
