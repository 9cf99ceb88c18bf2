// SPDX-License-Identifier: Apache-2.0
// RateWatch: one notice when a step's NVMe rate stays below a share of the reference.
#include "rate_watch.h"

#include <algorithm>
#include <cstdio>
#include <utility>

namespace zinf::offload::detail {
namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::string rates(const std::vector<double>& v) {
  std::string out;
  char b[32];
  for (double r : v) {
    std::snprintf(b, sizeof b, "%s%.2f", out.empty() ? "" : ", ", r);
    out += b;
  }
  return out;
}

}  // namespace

RateWatch::RateWatch(std::string what, double share, std::uint32_t steps, double reference_gbps)
    : what_(std::move(what)),
      share_(share),
      steps_(std::max<std::uint32_t>(steps, 1)),
      reference_(reference_gbps),
      tuned_(reference_gbps > 0) {}

std::optional<std::string> RateWatch::observe(double gbps) {
  if (share_ <= 0 || recovered_ || !(gbps > 0)) return std::nullopt;
  if (reference_ <= 0) {
    // The first steps set the reference; the median, so that one odd step (a cold start, a
    // neighbour's burst) does not.
    first_.push_back(gbps);
    if (first_.size() == steps_) reference_ = median(first_);
    return std::nullopt;
  }
  const bool slow = gbps < share_ * reference_;
  // Before the notice a run counts slow steps; after it, steps back at the rate. Any other
  // step breaks the run: a notice needs `steps_` in a row, so single odd steps never give one.
  if (slow != fell_) {
    run_.push_back(gbps);
  } else {
    run_.clear();
  }
  if (run_.size() < steps_) return std::nullopt;
  char head[256];
  std::snprintf(head, sizeof head, "%.2f GB/s (%s)", reference_,
                tuned_ ? "tuned" : "median of the first steps");
  std::string line;
  if (!fell_) {
    fell_ = true;
    line = "NVMe " + what_ + " slowed down: " + rates(run_) + " GB/s in the last " +
           std::to_string(run_.size()) + " steps, below " +
           std::to_string(static_cast<int>(share_ * 100 + 0.5)) + "% of " + head +
           "; the drive's write cache may be full or it is throttling (hot): the steps take "
           "longer while it lasts";
  } else {
    recovered_ = true;
    line = "NVMe " + what_ + " recovered: " + rates(run_) + " GB/s in the last " +
           std::to_string(run_.size()) + " steps, against " + head;
  }
  run_.clear();
  return line;
}

}  // namespace zinf::offload::detail
