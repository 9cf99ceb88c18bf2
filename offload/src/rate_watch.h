// SPDX-License-Identifier: Apache-2.0
// RateWatch: the engine's drive-slowdown notice. A consumer SSD writes at its burst rate until
// its write cache fills, then at a fraction of it, and throttles when hot; an offloaded
// optimizer meets that mid-run. This judges one direction's per-step rate against a reference
// and says, once, when it has stayed low for several steps (and once more if it comes back).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace zinf::offload::detail {

class RateWatch {
 public:
  /// `what` names the traffic and where it goes ("optimizer writes to /nvme0/zinf"); `share`
  /// in (0, 1) (0 disables the watch); `steps` >= 1 consecutive steps; `reference_gbps` the
  /// tuned rate, or 0 for the median of the first `steps` rates observed.
  RateWatch(std::string what, double share, std::uint32_t steps, double reference_gbps);

  /// Takes one step's rate (GB/s; steps that moved nothing are not passed). Returns the line
  /// to log when this step completes a run of `steps` slow steps for the first time, or of
  /// `steps` steps back at or above the share after that notice; otherwise nothing.
  std::optional<std::string> observe(double gbps);

  double reference_gbps() const noexcept { return reference_; }

 private:
  std::string what_;
  double share_;
  std::uint32_t steps_;
  double reference_;
  bool tuned_;
  std::vector<double> first_;  // the first rates, until the reference is their median
  std::vector<double> run_;    // the current run of slow (or, after the notice, normal) rates
  bool fell_ = false;          // the slowdown notice was given
  bool recovered_ = false;     // ... and the recovery notice
};

}  // namespace zinf::offload::detail
