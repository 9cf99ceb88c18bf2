// SPDX-License-Identifier: Apache-2.0
// Throughput over time for the time-based runs (`zinf bench io --runtime`, `zinf tune
// --sustained`): the steady-state rate of a series of per-interval samples, its noise, and
// whether and where it fell off a cliff (a drive's write cache filling up) rather than
// wandering with noise or drifting slowly. Pure functions of the series, unit-tested on
// synthetic ones; the rule is stated here and in docs/consumer.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace zinf::tools {

/// One interval of a time-based run.
struct ThroughputSample {
  double end_s = 0;         ///< seconds from the start of the run to the end of the interval
  double seconds = 0;       ///< the interval's length
  std::uint64_t bytes = 0;  ///< bytes completed in the interval
  std::uint64_t cumulative_bytes = 0;  ///< bytes completed from the start to end_s
  double gbps() const { return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0; }
};

/// Where a run's rate fell for good.
struct Cliff {
  std::size_t index = 0;           ///< the first sample after the fall
  double at_s = 0;                 ///< seconds into the run when it fell (start of that sample)
  std::uint64_t bytes_before = 0;  ///< bytes moved before the fall
  double before_gbps = 0;          ///< median rate of the samples before
  double after_gbps = 0;           ///< median rate of the samples from the fall on
};

/// What a series says.
struct ThroughputProfile {
  double steady_gbps = 0;  ///< median of the last third of the samples (at least one)
  double noise_gbps = 0;   ///< robust spread of the rate from one sample to the next
  std::optional<Cliff> cliff;
  /// Why no cliff was looked for ("" when it was): fewer than kMinSamples samples.
  std::string note;
};

/// The fewest samples a fall is judged on: three each side of it.
inline constexpr std::size_t kMinCliffSamples = 6;

/// Noise, for the rule below: 1.048 x the median of |r[i+1] - r[i]| over the rates r, the
/// standard deviation of independent noise estimated from successive differences (the median
/// of |a - b| for two normal draws is 0.954 sigma) and barely moved by one step in the series.
double successive_noise(const std::vector<double>& rates);

/// True when a level of `after` GB/s is a real fall from `before`: by more than 4 x `noise`
/// and by more than 10% of `before` (a smaller change is no cliff a user plans around).
bool significant_drop(double before, double after, double noise);

/// Analyses per-interval rates (GB/s) with the bytes moved before each sample (for
/// Cliff::bytes_before; pass an empty vector to leave it 0). The rule for a cliff at sample k
/// (3 <= k <= n - 3):
///   1. the median of the samples before k and the median from k on differ by a
///      significant_drop (the level fell, by more than the noise);
///   2. the fall is abrupt: the median of the 3 samples before k minus the median of the 3
///      from k is at least half of that difference (a slow drift spreads its fall over the
///      whole run, so no 6-sample window holds half of it);
///   3. the level stays down: no later window of 3 samples has a median back above the
///      midpoint of the two levels.
/// Of the k that pass, the one with the largest fall across its 6-sample window is the
/// cliff. With fewer than kMinCliffSamples samples nothing is judged (`note` says so).
ThroughputProfile analyze_throughput(const std::vector<double>& rates,
                                     const std::vector<std::uint64_t>& bytes_before = {});
/// The same over samples.
ThroughputProfile analyze_throughput(const std::vector<ThroughputSample>& samples);

/// The rates as a one-line sparkline of block characters (U+2581..U+2588), scaled from 0 to
/// the highest rate; more than `width` samples are averaged in equal groups to fit. "" for
/// none.
std::string sparkline(const std::vector<double>& rates, std::size_t width = 60);

}  // namespace zinf::tools
