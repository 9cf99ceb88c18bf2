// SPDX-License-Identifier: Apache-2.0
#include "prefetch_tuner.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

#include "zinf/adam/cpu_adam.h"
#include "zinf/common/error.h"
#include "zinf/common/log.h"

namespace zinf::adam::detail {
namespace {

double median_of(std::vector<double> v) {
  if (v.empty()) return std::numeric_limits<double>::quiet_NaN();
  const auto mid = v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2);
  std::nth_element(v.begin(), mid, v.end());
  if (v.size() % 2 == 1) return *mid;
  return (*mid + *std::max_element(v.begin(), mid)) / 2;
}

}  // namespace

void PrefetchTuner::record(std::size_t index, double ns_per_element) {
  std::lock_guard lock(mu_);
  if (calibrated()) return;  // a chunk still in flight when the choice was made
  if (samples_[index].size() < kSamples) samples_[index].push_back(ns_per_element);
  for (const auto& s : samples_) {
    if (s.size() < kSamples) return;
  }
  const auto med = medians_locked();
  const auto best =
      static_cast<std::size_t>(std::min_element(med.begin(), med.end()) - med.begin());
  current_.store(kPrefetchCandidates[best], std::memory_order_relaxed);
  calibrated_.store(true, std::memory_order_release);
  std::string text = "cpu adam: prefetch distance " + std::to_string(kPrefetchCandidates[best]) +
                     " elements, calibrated (median ns per element:";
  for (std::size_t i = 0; i < med.size(); ++i) {
    char buf[48];
    std::snprintf(buf, sizeof buf, " %u: %.3f", static_cast<unsigned>(kPrefetchCandidates[i]),
                  med[i]);
    text += buf;
  }
  log(LogLevel::kInfo, text + ")");
}

std::array<double, kPrefetchCandidates.size()> PrefetchTuner::medians() const {
  std::lock_guard lock(mu_);
  return medians_locked();
}

std::array<double, kPrefetchCandidates.size()> PrefetchTuner::medians_locked() const {
  std::array<double, kPrefetchCandidates.size()> out{};
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = median_of(samples_[i]);
  return out;
}

PrefetchTuner& prefetch_tuner(std::size_t isa_index) {
  // One per Isa enumerator; never destroyed, so a step on a thread still running at exit
  // cannot touch a dead object.
  static auto* tuners = new std::array<PrefetchTuner, 8>();
  return tuners->at(isa_index);
}

}  // namespace zinf::adam::detail

namespace zinf::adam {

std::optional<std::size_t> parse_prefetch(std::string_view text, std::string_view what) {
  if (text == "auto") return std::nullopt;
  if (text == "off") return 0;
  std::size_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < 1 ||
      value > detail::kMaxPrefetchElems) {
    throw UsageError(std::string(what) + ": expected auto, off or a number of elements in [1, " +
                     std::to_string(detail::kMaxPrefetchElems) + "], got '" + std::string(text) +
                     "'");
  }
  return value;
}

}  // namespace zinf::adam
