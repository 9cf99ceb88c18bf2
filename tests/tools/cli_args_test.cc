// SPDX-License-Identifier: Apache-2.0
#include "args.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "zinf/common/error.h"

namespace zinf::tools {
namespace {

TEST(ParseSize, AcceptsUnitsAndScientific) {
  EXPECT_EQ(parse_size("4096", "x"), 4096u);
  EXPECT_EQ(parse_size("512K", "x"), 512u * 1024);
  EXPECT_EQ(parse_size("1M", "x"), 1u << 20);
  EXPECT_EQ(parse_size("2GiB", "x"), 2ull << 30);
  EXPECT_EQ(parse_size("1GB", "x"), 1000000000ull);
  EXPECT_EQ(parse_size("1e8", "x"), 100000000ull);
  EXPECT_EQ(parse_size("1.5M", "x"), 1572864u);
}

TEST(ParseSize, RejectsGarbageWithClearText) {
  try {
    parse_size("12Q", "--size");
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(),
                 "invalid --size '12Q': expected a size such as 4096, 512K, 1M, 2GiB or 1e8");
  }
  EXPECT_THROW(parse_size("", "--size"), UsageError);
  EXPECT_THROW(parse_size("-1M", "--size"), UsageError);
  EXPECT_THROW(parse_size("0.3", "--size"), UsageError);
}

TEST(Args, TakesValuesFlagsAndRepeats) {
  Args a("bench io", {"--dir", "a", "--json", "--dir=b", "--size", "1G", "--loops", "3"});
  EXPECT_EQ(a.strings("dir"), (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(a.flag("json"));
  EXPECT_FALSE(a.flag("keep"));
  EXPECT_EQ(a.size("size", 0), 1ull << 30);
  EXPECT_EQ(a.uint("loops", 1), 3u);
  EXPECT_EQ(a.uint("threads", 7), 7u);
  EXPECT_NO_THROW(a.finish());
}

TEST(Args, UnknownOptionSuggestsClosest) {
  Args a("bench io", {"--queue-dpth", "8"});
  (void)a.uint("queue-depth", 16);
  try {
    a.finish();
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(),
                 "unknown option '--queue-dpth' for 'bench io' (did you mean --queue-depth?)");
  }
}

TEST(Args, MissingValueIsAnError) {
  Args a("bench io", {"--size"});
  EXPECT_THROW(a.size("size", 0), UsageError);
}

TEST(Args, NonIntegerRejected) {
  Args a("x", {"--loops", "2.5"});
  EXPECT_THROW(a.uint("loops", 1), UsageError);
}

// Integers are parsed exactly over uint64 and range-checked against what the option feeds:
// `--threads 4294967297` once became 1 thread on its way into a uint32_t.
TEST(Args, UintIsExactOverTheFullRange) {
  Args a("x", {"--seed", "18446744073709551615", "--big", "9007199254740993", "--sci", "2.5e6"});
  EXPECT_EQ(a.uint("seed", 1), 18446744073709551615u);
  EXPECT_EQ(a.uint("big", 1), 9007199254740993u);  // above 2^53: a double would round it
  EXPECT_EQ(a.uint("sci", 1), 2500000u);
}

TEST(Args, UintRejectsOverflowSignsAndGarbageNamingTheRange) {
  for (const char* text : {"18446744073709551616", "99999999999999999999", "-1", "-0", "+1", " 1",
                           "1 ", "12abc", "0x10", "1.5", "1e20", "1e", "inf", "nan", ""}) {
    Args a("x", {std::string("--seed=") + text});
    try {
      (void)a.uint("seed", 1);
      ADD_FAILURE() << "accepted '" << text << "'";
    } catch (const UsageError& e) {
      EXPECT_EQ(std::string(e.what()), std::string("invalid --seed '") + text +
                                           "': expected an integer in [0, 18446744073709551615]");
    }
  }
}

TEST(Args, UintChecksTheDestinationsRange) {
  Args a("bench io", {"--threads", "4294967297", "--depth", "2"});
  try {
    (void)a.uint("threads", 0, 0, UINT32_MAX);
    ADD_FAILURE() << "no error";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(),
                 "invalid --threads '4294967297': expected an integer in [0, 4294967295]");
  }
  try {
    (void)a.uint("depth", 4, 3, 64);
    ADD_FAILURE() << "no error";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(), "invalid --depth '2': expected an integer in [3, 64]");
  }
  EXPECT_EQ(parse_uint("4294967295", "--threads", 0, UINT32_MAX), 4294967295u);
}

TEST(ParseSize, WholeNumbersAreExactAndOverflowIsRefused) {
  EXPECT_EQ(parse_size("18446744073709551615", "x"), 18446744073709551615u);
  EXPECT_EQ(parse_size("9007199254740993", "x"), 9007199254740993u);
  EXPECT_EQ(parse_size("16777215T", "x"), 16777215ull << 40);
  EXPECT_THROW(parse_size("16777216T", "x"), UsageError);  // 2^64
  EXPECT_THROW(parse_size("18446744073709551616", "x"), UsageError);
  EXPECT_THROW(parse_size("0x10", "x"), UsageError);
}

}  // namespace
}  // namespace zinf::tools
