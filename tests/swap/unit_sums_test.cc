// SPDX-License-Identifier: Apache-2.0
// UnitSums: unit CRCs from pieces added in any order on several threads equal crc32c of each
// unit, and a gap or an overlap is an error rather than a wrong sum.
#include "zinf/swap/unit_sums.h"

#include <algorithm>
#include <random>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "zinf/common/error.h"
#include "zinf/swap/crc32c.h"

namespace zinf::swap {
namespace {

std::vector<std::byte> random_bytes(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::byte> out(n);
  for (auto& b : out) b = static_cast<std::byte>(rng());
  return out;
}

std::vector<std::uint32_t> direct_sums(const std::vector<std::byte>& data, std::uint64_t unit) {
  std::vector<std::uint32_t> out;
  for (std::uint64_t at = 0; at < data.size(); at += unit) {
    const std::uint64_t n = std::min<std::uint64_t>(unit, data.size() - at);
    out.push_back(crc32c(std::span<const std::byte>(data.data() + at, n)));
  }
  return out;
}

// Pieces that straddle unit boundaries, of odd lengths, shuffled and added by four threads; a
// last unit shorter than the others. Two rounds on one object (reset keeps working).
TEST(UnitSums, ShuffledPiecesFromSeveralThreadsGiveEachUnitsCrc) {
  const std::uint64_t unit = 65536;
  UnitSums sums;
  for (std::size_t bytes : {std::size_t{5 * 65536 + 4096}, std::size_t{12288}}) {
    SCOPED_TRACE("bytes=" + std::to_string(bytes));
    const std::vector<std::byte> data = random_bytes(bytes, bytes);
    std::vector<std::pair<std::uint64_t, std::uint64_t>> pieces;
    std::mt19937_64 rng(1);
    for (std::uint64_t at = 0; at < bytes;) {
      const std::uint64_t n = std::min<std::uint64_t>(1 + rng() % 40000, bytes - at);
      pieces.emplace_back(at, n);
      at += n;
    }
    std::shuffle(pieces.begin(), pieces.end(), rng);
    sums.reset(bytes, unit, pieces.size());
    std::vector<std::thread> threads;
    for (std::size_t t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        for (std::size_t i = t; i < pieces.size(); i += 4) {
          sums.add(data.data(), pieces[i].first, pieces[i].second);
        }
      });
    }
    for (auto& th : threads) th.join();
    const auto got = sums.finish();
    EXPECT_EQ(std::vector<std::uint32_t>(got.begin(), got.end()), direct_sums(data, unit));
  }
}

TEST(UnitSums, AGapOrAnOverlapIsAnErrorNamingTheOffset) {
  const std::vector<std::byte> data = random_bytes(8192, 3);
  UnitSums sums;
  sums.reset(8192, 4096);
  sums.add(data.data(), 0, 1000);
  sums.add(data.data(), 1100, 8192 - 1100);
  try {
    (void)sums.finish();
    FAIL() << "a gap was summed";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "UnitSums: missing bytes at offset 1000 of a 8192-byte buffer");
  }
  sums.reset(8192, 4096);
  sums.add(data.data(), 0, 5000);
  sums.add(data.data(), 4000, 8192 - 4000);
  try {
    (void)sums.finish();
    FAIL() << "an overlap was summed";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "UnitSums: overlapping bytes at offset 4000 of a 8192-byte buffer");
  }
  sums.reset(8192, 4096);
  sums.add(data.data(), 0, 8000);
  try {
    (void)sums.finish();
    FAIL() << "a short cover was summed";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "UnitSums: missing bytes at offset 8000 of a 8192-byte buffer");
  }
  EXPECT_THROW(sums.reset(0, 4096), UsageError);
  EXPECT_THROW(sums.reset(4096, 0), UsageError);
}

}  // namespace
}  // namespace zinf::swap
