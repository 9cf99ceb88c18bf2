// SPDX-License-Identifier: Apache-2.0
// The reports `zinf plan` reads from the other commands (plan_reports.h).
#include "plan_reports.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "zinf/common/error.h"
#include "zinf/common/small_file.h"

namespace zinf::tools {

DriveBandwidth read_tune_report(const std::string& path) {
  // A tune report is a few KiB; a FIFO or a device must not block or flood the planner.
  const std::string text = read_small_regular_file(path, std::uint64_t{1} << 20, "--tune file");
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw UsageError(path + ": " + e.what());
  }
  DriveBandwidth d;
  double* dst[] = {&d.read_gbps, &d.write_gbps, &d.mixed_gbps};
  const char* keys[] = {"read_gbps", "write_gbps", "mixed_gbps"};
  const auto chosen = doc.is_object() ? doc.find("chosen") : doc.end();
  for (int i = 0; i < 3; ++i) {
    const bool ok = chosen != doc.end() && chosen->is_object() && chosen->contains(keys[i]) &&
                    (*chosen)[keys[i]].is_number() && (*chosen)[keys[i]].get<double>() > 0;
    if (!ok) {
      throw UsageError(path +
                       ": not a zinf tune report (needs \"chosen\" with positive "
                       "read_gbps, write_gbps and mixed_gbps)");
    }
    *dst[i] = (*chosen)[keys[i]].get<double>();
  }
  // `zinf tune --sustained`'s steady write rate, where it ran.
  const auto sustained = doc.find("sustained");
  if (sustained != doc.end() && sustained->is_object()) {
    const auto steady = sustained->find("steady_write_gbps");
    if (steady != sustained->end() && steady->is_number() && steady->get<double>() > 0) {
      d.sustained_write_gbps = steady->get<double>();
    }
  }
  return d;
}

void read_h2d_report(const std::string& path, PlanInput& in, bool& simulated) {
  const std::string text = read_small_regular_file(path, std::uint64_t{1} << 20, "--h2d file");
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw UsageError(path + ": " + e.what());
  }
  const auto bad = [&]() {
    return UsageError(path +
                      ": not a zinf bench h2d --json report (needs \"sizes\" with bytes and a "
                      "positive h2d_pinned_gbps)");
  };
  if (!doc.is_object() || !doc.contains("sizes") || !doc["sizes"].is_array()) throw bad();
  const nlohmann::json* largest = nullptr;
  for (const auto& e : doc["sizes"]) {
    if (!e.is_object() || !e.contains("bytes") || !e["bytes"].is_number()) throw bad();
    if (!largest || e["bytes"].get<double>() > (*largest)["bytes"].get<double>()) largest = &e;
  }
  if (!largest || !largest->contains("h2d_pinned_gbps") ||
      !(*largest)["h2d_pinned_gbps"].is_number() ||
      (*largest)["h2d_pinned_gbps"].get<double>() <= 0) {
    throw bad();
  }
  in.h2d_gbps = (*largest)["h2d_pinned_gbps"].get<double>();
  if (largest->contains("d2h_pinned_gbps") && (*largest)["d2h_pinned_gbps"].is_number()) {
    in.d2h_gbps = std::max(0.0, (*largest)["d2h_pinned_gbps"].get<double>());
  }
  simulated = doc.value("simulated", false);
}

}  // namespace zinf::tools
