// SPDX-License-Identifier: Apache-2.0
#include "throughput.h"

#include <algorithm>
#include <cmath>

#include "bench_common.h"

namespace zinf::tools {
namespace {

double median_of(const std::vector<double>& v, std::size_t from, std::size_t to) {
  return median(std::vector<double>(v.begin() + static_cast<std::ptrdiff_t>(from),
                                    v.begin() + static_cast<std::ptrdiff_t>(to)));
}

constexpr std::size_t kWindow = 3;  // samples each side of a fall, for its abruptness

}  // namespace

double successive_noise(const std::vector<double>& rates) {
  if (rates.size() < 2) return 0;
  std::vector<double> d;
  for (std::size_t i = 1; i < rates.size(); ++i) d.push_back(std::fabs(rates[i] - rates[i - 1]));
  return 1.048 * median(std::move(d));
}

bool significant_drop(double before, double after, double noise) {
  const double fall = before - after;
  return fall > 4 * noise && fall > 0.10 * before;
}

ThroughputProfile analyze_throughput(const std::vector<double>& rates,
                                     const std::vector<std::uint64_t>& bytes_before) {
  ThroughputProfile p;
  const std::size_t n = rates.size();
  if (n == 0) {
    p.note = "no samples";
    return p;
  }
  p.steady_gbps = median_of(rates, n - std::max<std::size_t>(1, n / 3), n);
  p.noise_gbps = successive_noise(rates);
  if (n < kMinCliffSamples) {
    p.note = "too few samples to judge a fall (" + std::to_string(n) + " of " +
             std::to_string(kMinCliffSamples) + ")";
    return p;
  }
  double best_step = 0;
  for (std::size_t k = kWindow; k + kWindow <= n; ++k) {
    const double before = median_of(rates, 0, k);
    const double after = median_of(rates, k, n);
    if (!significant_drop(before, after, p.noise_gbps)) continue;  // 1. a real fall
    const double step = median_of(rates, k - kWindow, k) - median_of(rates, k, k + kWindow);
    if (step < 0.5 * (before - after)) continue;  // 2. abrupt, not a drift
    const double mid = (before + after) / 2;
    bool stays_down = true;  // 3. no later window climbs back above the midpoint
    for (std::size_t j = k; j + kWindow <= n; ++j) {
      if (median_of(rates, j, j + kWindow) > mid) {
        stays_down = false;
        break;
      }
    }
    if (!stays_down || step <= best_step) continue;
    best_step = step;
    Cliff c;
    c.index = k;
    c.before_gbps = before;
    c.after_gbps = after;
    c.bytes_before = k < bytes_before.size() ? bytes_before[k] : 0;
    p.cliff = c;
  }
  return p;
}

ThroughputProfile analyze_throughput(const std::vector<ThroughputSample>& samples) {
  std::vector<double> rates;
  std::vector<std::uint64_t> before;
  for (const auto& s : samples) {
    rates.push_back(s.gbps());
    before.push_back(s.cumulative_bytes - s.bytes);
  }
  ThroughputProfile p = analyze_throughput(rates, before);
  if (p.cliff) {
    const ThroughputSample& s = samples[p.cliff->index];
    p.cliff->at_s = s.end_s - s.seconds;
  }
  return p;
}

std::string sparkline(const std::vector<double>& rates, std::size_t width) {
  if (rates.empty() || width == 0) return {};
  std::vector<double> cols;
  const std::size_t groups = std::min(width, rates.size());
  for (std::size_t g = 0; g < groups; ++g) {
    // Equal groups of consecutive samples (their sizes differ by at most one).
    const std::size_t from = g * rates.size() / groups, to = (g + 1) * rates.size() / groups;
    double sum = 0;
    for (std::size_t i = from; i < to; ++i) sum += rates[i];
    cols.push_back(sum / static_cast<double>(to - from));
  }
  const double top = *std::max_element(cols.begin(), cols.end());
  static const char* const kBars[] = {"\u2581", "\u2582", "\u2583", "\u2584",
                                      "\u2585", "\u2586", "\u2587", "\u2588"};
  std::string out;
  for (double c : cols) {
    int level = top > 0 ? static_cast<int>(std::lround(c / top * 7)) : 0;
    out += kBars[std::clamp(level, 0, 7)];
  }
  return out;
}

}  // namespace zinf::tools
