// SPDX-License-Identifier: Apache-2.0
#include "over_time.h"

#include <algorithm>
#include <cstdio>

#include "format.h"

namespace zinf::tools {

std::string over_time_text(const std::string& label, const std::vector<ThroughputSample>& samples,
                           const ThroughputProfile& p, const std::string& interval) {
  if (samples.empty()) return "";
  std::vector<double> rates;
  for (const auto& t : samples) rates.push_back(t.gbps());
  const double top = *std::max_element(rates.begin(), rates.end());
  char line[256];
  std::string out = label + " over time (" + std::to_string(samples.size()) + " samples of " +
                    interval + ", scale 0 to ";
  std::snprintf(line, sizeof line, "%.2f GB/s): ", top);
  out += line + sparkline(rates) + "\n";
  std::snprintf(line, sizeof line,
                "  steady state %.2f GB/s (median of the last third), noise %.2f GB/s; ",
                p.steady_gbps, p.noise_gbps);
  out += line;
  if (p.cliff) {
    std::snprintf(line, sizeof line, "fell from %.2f to %.2f GB/s after %s (%.0f s in)\n",
                  p.cliff->before_gbps, p.cliff->after_gbps,
                  decimal_bytes(static_cast<double>(p.cliff->bytes_before)).c_str(), p.cliff->at_s);
    out += line;
  } else if (!p.note.empty()) {
    out += p.note + "\n";
  } else {
    out += "no fall beyond the noise\n";
  }
  return out;
}

void add_over_time(Json& j, const std::vector<ThroughputSample>& samples,
                   const ThroughputProfile& p) {
  Json& out = j["samples"] = Json::array();
  for (const auto& t : samples) {
    Json x;
    x["t_s"] = t.end_s;
    x["seconds"] = t.seconds;
    x["bytes"] = t.bytes;
    x["gbps"] = t.gbps();
    out.push_back(std::move(x));
  }
  j["steady_gbps"] = p.steady_gbps;
  j["noise_gbps"] = p.noise_gbps;
  if (p.cliff) {
    const Cliff& c = *p.cliff;
    Json x;
    x["at_s"] = c.at_s;
    x["bytes_before"] = c.bytes_before;
    x["before_gbps"] = c.before_gbps;
    x["after_gbps"] = c.after_gbps;
    j["cliff"] = std::move(x);
  } else {
    j["cliff"] = nullptr;
  }
  if (!p.note.empty()) j["cliff_note"] = p.note;
}

}  // namespace zinf::tools
