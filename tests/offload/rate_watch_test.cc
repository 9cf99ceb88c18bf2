// SPDX-License-Identifier: Apache-2.0
// RateWatch, the engine's drive-slowdown notice, on synthetic per-step rates: one notice after
// the set number of slow steps in a row, none for isolated slow steps or a healthy series, one
// more on recovery, the reference from the first steps' median or a tuned rate.
#include "rate_watch.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

namespace zinf::offload::detail {
namespace {

// Feeds `rates` and returns every line the watch gave, with the index of the step that gave it.
std::vector<std::pair<std::size_t, std::string>> feed(RateWatch& w,
                                                      const std::vector<double>& rates) {
  std::vector<std::pair<std::size_t, std::string>> out;
  for (std::size_t i = 0; i < rates.size(); ++i) {
    if (auto line = w.observe(rates[i])) out.emplace_back(i, *line);
  }
  return out;
}

TEST(RateWatch, OneNoticeAfterConsecutiveSlowStepsAndOneOnRecovery) {
  RateWatch w("optimizer writes to /nvme0/zinf", 0.5, 3, 0);
  // Reference: the median of 3.0, 3.4, 3.2 = 3.2 GB/s; half of it is 1.6.
  auto lines = feed(w, {3.0, 3.4, 3.2, 3.1, 0.9, 0.8, 0.7, 0.6, 0.9, 3.0, 3.1, 3.2, 0.5, 0.5, 0.5});
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(w.reference_gbps(), 3.2);
  EXPECT_EQ(lines[0].first, 6u);  // the third slow step in a row
  EXPECT_EQ(lines[0].second,
            "NVMe optimizer writes to /nvme0/zinf slowed down: 0.90, 0.80, 0.70 GB/s in the last "
            "3 steps, below 50% of 3.20 GB/s (median of the first steps); the drive's write "
            "cache may be full or it is throttling (hot): the steps take longer while it lasts");
  EXPECT_EQ(lines[1].first, 11u);  // the third step back at the rate
  EXPECT_EQ(lines[1].second,
            "NVMe optimizer writes to /nvme0/zinf recovered: 3.00, 3.10, 3.20 GB/s in the last 3 "
            "steps, against 3.20 GB/s (median of the first steps)");
  // After the recovery notice the watch is done: the later fall says nothing more.
}

TEST(RateWatch, IsolatedSlowStepsAndAHealthySeriesSayNothing) {
  RateWatch w("optimizer writes to /d", 0.5, 3, 0);
  EXPECT_TRUE(feed(w, {2, 2, 2, 0.5, 0.5, 2, 0.5, 2, 0.5, 0.5, 1.1, 2, 2}).empty());
  RateWatch healthy("optimizer writes to /d", 0.5, 3, 0);
  EXPECT_TRUE(feed(healthy, {2, 1.5, 2.5, 1.2, 1.0, 1.3, 2.2, 1.9}).empty());  // never < 1.0
}

TEST(RateWatch, TunedReferenceAndOff) {
  RateWatch w("optimizer reads from /d", 0.25, 2, 4.0);  // 25% of 4 GB/s: below 1.0
  auto lines = feed(w, {0.9, 0.9});                      // no learning phase with a tuned rate
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0].first, 1u);
  EXPECT_NE(lines[0].second.find("below 25% of 4.00 GB/s (tuned)"), std::string::npos)
      << lines[0].second;
  RateWatch off("optimizer writes to /d", 0, 3, 0);
  EXPECT_TRUE(feed(off, {3, 3, 3, 0.1, 0.1, 0.1, 0.1}).empty());
}

}  // namespace
}  // namespace zinf::offload::detail
