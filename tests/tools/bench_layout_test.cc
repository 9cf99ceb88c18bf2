// SPDX-License-Identifier: Apache-2.0
// `zinf bench adam --layout`: the names round-trip, a wrong one is refused naming the option,
// and HostArray puts each array of a set where its layout says (address mod 2 MiB and 4 KiB).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "bench_common.h"
#include "zinf/common/error.h"

namespace zinf::tools {
namespace {

constexpr ArrayLayout kLayouts[] = {ArrayLayout::kAligned, ArrayLayout::kAligned4K,
                                    ArrayLayout::kStaggered, ArrayLayout::kTorch};

TEST(BenchLayout, NamesRoundTripAndAWrongOneIsRefused) {
  for (ArrayLayout l : kLayouts) {
    EXPECT_EQ(parse_array_layout(std::string(array_layout_name(l)), "--layout"), l);
  }
  try {
    parse_array_layout("aligned4k", "--layout");
    FAIL() << "no error";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(),
                 "invalid --layout 'aligned4k': expected aligned, aligned-4k, staggered or torch");
  }
}

std::uintptr_t address_of(HostArray& a) {
  return reinterpret_cast<std::uintptr_t>(a.as<char>(1).data());
}

TEST(BenchLayout, ArraysLieWhereTheirLayoutSays) {
  constexpr std::uintptr_t kTwoMiB = std::uintptr_t{2} << 20;
  constexpr std::size_t kBytes = 3 << 20;  // more than one huge page: the rounding matters
  for (ArrayLayout l : kLayouts) {
    SCOPED_TRACE(std::string(array_layout_name(l)));
    std::set<std::uintptr_t> offsets_mod_4k;
    for (std::size_t k = 0; k < 4; ++k) {
      HostArray a(kBytes, "test", l, k);
      const std::uintptr_t addr = address_of(a);
      if (l == ArrayLayout::kTorch) {
        EXPECT_EQ(addr % 64, 0u);
      } else {
        EXPECT_EQ(addr % kTwoMiB, array_layout_offset(l, k));
      }
      offsets_mod_4k.insert(addr % 4096);
      // Every byte of the array is there to be written.
      std::memset(a.as<char>(kBytes).data(), 0x5a, kBytes);
    }
    // Staggered: four different offsets mod 4 KiB, pairwise at least 832 bytes apart.
    if (l == ArrayLayout::kStaggered) {
      EXPECT_EQ(offsets_mod_4k.size(), 4u);
      for (std::uintptr_t x : offsets_mod_4k) {
        for (std::uintptr_t y : offsets_mod_4k) {
          if (x == y) continue;
          const std::uintptr_t d = (x + 4096 - y) % 4096;
          EXPECT_GE(std::min(d, 4096 - d), 832u);
        }
      }
    }
    if (l == ArrayLayout::kAligned || l == ArrayLayout::kAligned4K) {
      EXPECT_EQ(offsets_mod_4k.size(), 1u);
    }
  }
}

}  // namespace
}  // namespace zinf::tools
