// SPDX-License-Identifier: Apache-2.0
#include "cli_args.h"

#include <gtest/gtest.h>

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
    EXPECT_STREQ(e.what(), "unknown option '--queue-dpth' for 'bench io' (did you mean --queue-depth?)");
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

}  // namespace
}  // namespace zinf::tools
