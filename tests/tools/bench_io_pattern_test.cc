// SPDX-License-Identifier: Apache-2.0
#include "io_pattern.h"

#include <cstring>
#include <vector>

#include <gtest/gtest.h>

namespace zinf::tools {
namespace {

std::vector<std::byte> block(std::size_t n) { return std::vector<std::byte>(n); }

TEST(BenchIoPattern, RoundTripVerifies) {
  auto b = block(64 * 1024);
  fill_bulk(b, 3);
  stamp_headers(b, 1, 1 << 20, 3);
  EXPECT_EQ(verify_block(b, 1, 1 << 20, 3), "");
}

TEST(BenchIoPattern, DetectsMisplacedBlock) {
  auto b = block(8192);
  fill_bulk(b, 2);
  stamp_headers(b, 0, 8192, 2);
  EXPECT_EQ(verify_block(b, 0, 0, 2),
            "sector at file offset 0 has the header of file 0 generation 2 offset 8192 "
            "(expected file 0 generation 2)");
}

TEST(BenchIoPattern, DetectsStaleGeneration) {
  auto b = block(4096);
  fill_bulk(b, 1);
  stamp_headers(b, 0, 0, 1);
  EXPECT_NE(verify_block(b, 0, 0, 2).find("generation 1"), std::string::npos);
}

TEST(BenchIoPattern, DetectsOneFlippedBodyByte) {
  auto b = block(3 * 4096);
  fill_bulk(b, 7);
  stamp_headers(b, 2, 0, 7);
  b[2 * 4096 + 100] ^= std::byte{1};
  EXPECT_EQ(verify_block(b, 2, 0, 7), "byte at file offset 8292 differs from what was written");
}

TEST(BenchIoPattern, DetectsZeroedSector) {
  auto b = block(4096);
  fill_bulk(b, 1);
  stamp_headers(b, 0, 0, 1);
  std::memset(b.data(), 0, b.size());
  EXPECT_NE(verify_block(b, 0, 0, 1), "");
}

}  // namespace
}  // namespace zinf::tools
