// SPDX-License-Identifier: Apache-2.0
// The keep-the-default rule of `zinf tune` (choice.h).
#include "choice.h"

#include <algorithm>
#include <cstdio>

#include "bench_common.h"

namespace zinf::tools::tune {

Measured measured(const std::vector<double>& runs) {
  Measured m;
  m.passes = runs.size();
  if (runs.empty()) return m;
  m.median_gbps = median(runs);
  const auto [lo, hi] = std::minmax_element(runs.begin(), runs.end());
  m.spread_gbps = *hi - *lo;
  return m;
}

Choice choose(const std::vector<Measured>& settings, std::size_t default_index) {
  Choice c;
  c.best = default_index;
  for (std::size_t i = 0; i < settings.size(); ++i) {
    // One pass has no spread to judge it by. Strictly greater: an equal median never displaces
    // the default or an earlier setting.
    if (settings[i].passes >= 2 && settings[i].median_gbps > settings[c.best].median_gbps)
      c.best = i;
  }
  const Measured& d = settings[default_index];
  const Measured& b = settings[c.best];
  c.margin_gbps = b.median_gbps - d.median_gbps;
  c.noise_gbps = std::max(b.spread_gbps, d.spread_gbps);
  c.beats_default = c.best != default_index && c.margin_gbps > c.noise_gbps;
  c.chosen = c.beats_default ? c.best : default_index;
  return c;
}

std::string choice_line(const Choice& c, const std::vector<Measured>& settings,
                        const std::vector<std::string>& names, std::size_t default_index) {
  char buf[512];
  const double base = settings[default_index].median_gbps;
  const double pct = base > 0 ? 100.0 * c.margin_gbps / base : 0;
  if (c.best == default_index) {
    std::snprintf(buf, sizeof buf, "the default (%s) measured best: kept",
                  names[default_index].c_str());
  } else if (c.beats_default) {
    std::snprintf(buf, sizeof buf,
                  "%s beats the default (%s) by %.2f GB/s (%.1f%%), more than the spread "
                  "%.2f GB/s: chosen",
                  names[c.best].c_str(), names[default_index].c_str(), c.margin_gbps, pct,
                  c.noise_gbps);
  } else {
    std::snprintf(buf, sizeof buf,
                  "%s beats the default (%s) by %.2f GB/s (%.1f%%), inside the spread %.2f GB/s "
                  "(noise): the default is kept",
                  names[c.best].c_str(), names[default_index].c_str(), c.margin_gbps, pct,
                  c.noise_gbps);
  }
  return buf;
}

}  // namespace zinf::tools::tune
