// SPDX-License-Identifier: Apache-2.0
// Progress: the line's text, redrawn in place and cleared at the end; nothing at all when not
// wanted (--json) — and, through the terminal check, when stderr is a file or a pipe.
#include "progress.h"

#include <cstdio>
#include <string>

#include <gtest/gtest.h>

namespace zinf::tools {
namespace {

std::string contents(std::FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string s;
  for (int c; (c = std::fgetc(f)) != EOF;) s.push_back(static_cast<char>(c));
  return s;
}

TEST(Progress, LineSaysDoneTotalRateAndElapsed) {
  Progress p("bench step", 10, "steps", true, nullptr);
  EXPECT_EQ(p.line(4, 2.0), "bench step: 4/10 steps (40%), 2.0 steps/s, 2 s elapsed");
  EXPECT_EQ(p.line(1, 0.01), "bench step: 1/10 steps (10%), 0.0 steps/s, 0 s elapsed");
  Progress t("stress", 600, "s", true, nullptr);  // a fixed duration: no rate
  EXPECT_EQ(t.line(150, 150), "stress: 150/600 s (25%)");
}

TEST(Progress, DetailDigitsAndANewTotal) {
  Progress p("zinf tune", 10, "passes", true, nullptr);
  EXPECT_EQ(p.line(2, 4.0, "uring 1M qd16 1.62 GB/s"),
            "zinf tune: 2/10 passes (20%), 0.5 passes/s, 4 s elapsed, uring 1M qd16 1.62 GB/s");
  p.set_total(8);
  EXPECT_EQ(p.line(2, 4.0), "zinf tune: 2/8 passes (25%), 0.5 passes/s, 4 s elapsed");
  Progress b("zinf bench io write", 2.5, "GB", true, nullptr);
  b.set_digits(2);
  EXPECT_EQ(b.line(1, 2.0), "zinf bench io write: 1.00/2.50 GB (40%), 0.50 GB/s, 2 s elapsed");
  Progress t("zinf bench io write", 10, "s", true, nullptr);
  EXPECT_EQ(t.line(3, 3.0, "2.31 GB/s"), "zinf bench io write: 3/10 s (30%), 2.31 GB/s");
  t.set_digits(1);
  EXPECT_EQ(t.line(0.25, 0.25), "zinf bench io write: 0.2/10.0 s (2%)");
}

TEST(Progress, DrawsInPlaceAndClearsAtTheEnd) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  {
    Progress p("stress", 3, "s", true, f);
    p.update(0);
    p.update(3);  // the end is always drawn
  }
  const std::string s = contents(f);
  EXPECT_EQ(s.rfind("\rstress: 0/3 s (0%)", 0), 0u) << s;
  EXPECT_NE(s.find("\rstress: 3/3 s (100%)"), std::string::npos) << s;
  EXPECT_EQ(s.back(), '\r') << "the line is blanked and the cursor back at its start";
  std::fclose(f);
}

TEST(Progress, NotWantedWritesNothing) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  {
    Progress p("bench step", 3, "steps", false, f);
    EXPECT_FALSE(p.enabled());
    p.update(1);
    p.update(3);
  }
  EXPECT_EQ(contents(f), "");
  std::fclose(f);
  // Under ctest stderr is not a terminal: the plain constructor stays silent too.
  Progress q("x", 1, "u", true);
  EXPECT_FALSE(q.enabled());
}

}  // namespace
}  // namespace zinf::tools
