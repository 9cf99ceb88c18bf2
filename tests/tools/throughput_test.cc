// SPDX-License-Identifier: Apache-2.0
// The cliff detector of the time-based runs on synthetic series: a clean cliff is found with
// the bytes before it, noise alone and a slow drift are not cliffs, and the steady state is the
// median of the last third. The noise is drawn from a seeded generator (seed in the test).
#include "throughput.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include <gtest/gtest.h>

namespace zinf::tools {
namespace {

// `n` rates around `level`, normal noise of `sigma` (seeded: the same series every run).
std::vector<double> noisy(std::size_t n, double level, double sigma, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> d(0, sigma);
  std::vector<double> v;
  for (std::size_t i = 0; i < n; ++i) v.push_back(level + d(rng));
  return v;
}

std::vector<ThroughputSample> samples_of(const std::vector<double>& gbps) {
  std::vector<ThroughputSample> out;
  std::uint64_t total = 0;
  for (std::size_t i = 0; i < gbps.size(); ++i) {
    ThroughputSample s;
    s.seconds = 1;
    s.end_s = static_cast<double>(i + 1);
    s.bytes = static_cast<std::uint64_t>(gbps[i] * 1e9);
    total += s.bytes;
    s.cumulative_bytes = total;
    out.push_back(s);
  }
  return out;
}

TEST(Throughput, CleanCliffIsFoundWithTheBytesBeforeIt) {
  // 3 GB/s for 20 s (an SLC cache), then 0.8 GB/s: 60 GB written before the fall.
  std::vector<double> r = noisy(20, 3.0, 0.05, 1);
  for (double x : noisy(20, 0.8, 0.05, 2)) r.push_back(x);
  const std::vector<ThroughputSample> s = samples_of(r);
  const ThroughputProfile p = analyze_throughput(s);
  ASSERT_TRUE(p.cliff.has_value());
  EXPECT_EQ(p.cliff->index, 20u);
  EXPECT_DOUBLE_EQ(p.cliff->at_s, 20.0);
  EXPECT_EQ(p.cliff->bytes_before, s[19].cumulative_bytes);
  EXPECT_NEAR(static_cast<double>(p.cliff->bytes_before), 60e9, 1e9);
  EXPECT_NEAR(p.cliff->before_gbps, 3.0, 0.1);
  EXPECT_NEAR(p.cliff->after_gbps, 0.8, 0.1);
  EXPECT_NEAR(p.steady_gbps, 0.8, 0.1);
  EXPECT_TRUE(p.note.empty());
}

TEST(Throughput, NoiseAloneIsNoCliff) {
  // 20% noise around 2 GB/s, many seeds: never a cliff, the steady state near the level.
  for (std::uint32_t seed = 1; seed <= 50; ++seed) {
    const ThroughputProfile p = analyze_throughput(noisy(40, 2.0, 0.4, seed));
    EXPECT_FALSE(p.cliff.has_value()) << "seed " << seed << ": at " << p.cliff->index;
    EXPECT_NEAR(p.steady_gbps, 2.0, 0.5) << "seed " << seed;
    EXPECT_GT(p.noise_gbps, 0.2) << "seed " << seed;
  }
}

TEST(Throughput, SlowDriftIsNoCliff) {
  // From 3 GB/s down to 1.5 GB/s evenly over 40 s (a drive warming up), a little noise: the
  // level falls by half, but no window holds the fall.
  std::vector<double> r = noisy(40, 0, 0.02, 3);
  for (std::size_t i = 0; i < r.size(); ++i) r[i] += 3.0 - 1.5 * static_cast<double>(i) / 39;
  const ThroughputProfile p = analyze_throughput(r);
  EXPECT_FALSE(p.cliff.has_value()) << "at " << p.cliff->index;
  EXPECT_LT(p.steady_gbps, 2.0);
}

TEST(Throughput, ARecoveredDipIsNoCliff) {
  std::vector<double> r = noisy(30, 2.0, 0.02, 4);
  for (std::size_t i = 10; i < 15; ++i) r[i] = 0.5;  // five slow seconds, then back
  EXPECT_FALSE(analyze_throughput(r).cliff.has_value());
}

TEST(Throughput, ShortSeriesAreNotJudged) {
  const ThroughputProfile p = analyze_throughput(std::vector<double>{3, 3, 1, 1});
  EXPECT_FALSE(p.cliff.has_value());
  EXPECT_EQ(p.note, "too few samples to judge a fall (4 of 6)");
  EXPECT_DOUBLE_EQ(p.steady_gbps, 1.0);  // the last third of 4 samples: the last one
  EXPECT_EQ(analyze_throughput(std::vector<double>{}).note, "no samples");
}

TEST(Throughput, SignificantDropNeedsNoiseAndTenPercent) {
  EXPECT_TRUE(significant_drop(3.0, 1.0, 0.1));
  EXPECT_FALSE(significant_drop(3.0, 1.0, 0.6));  // within 4 x the noise
  EXPECT_FALSE(significant_drop(3.0, 2.8, 0.0));  // less than 10%
  EXPECT_FALSE(significant_drop(1.0, 1.5, 0.0));  // a rise
}

TEST(Throughput, SparklineScalesToTheTopAndFitsTheWidth) {
  EXPECT_EQ(sparkline({}), "");
  EXPECT_EQ(sparkline({0, 1, 2}), "\u2581\u2585\u2588");
  EXPECT_EQ(sparkline({2, 2, 2, 2, 1, 1, 1, 1}, 2), "\u2588\u2585");  // averaged in pairs
  std::vector<double> many(1000, 1.0);
  EXPECT_EQ(sparkline(many, 60).size(), 60u * 3);  // 3 bytes per block character
}

}  // namespace
}  // namespace zinf::tools
