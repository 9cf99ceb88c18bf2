// SPDX-License-Identifier: Apache-2.0
// `zinf tune`'s grids on synthetic sweeps: one per backend, the best thread count per cell, the
// chosen cell marked, unmeasured cells shown as such; the SVG is well-formed XML (parsed by
// python3's xml.etree) with one cell per grid position and the chosen one marked.
#include "grid.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "support/test_dir.h"

namespace zinf::tools::tune {
namespace {

std::vector<GridPoint> sweep() {
  return {
      {"uring", 256u << 10, 8, 1.20, false},  {"uring", 256u << 10, 16, 1.41, false},
      {"uring", 1u << 20, 8, 1.50, false},    {"uring", 1u << 20, 16, 1.62, true},
      {"threads", 1u << 20, 16, 1.10, false}, {"threads", 1u << 20, 16, 1.30, false},
      {"threads", 1u << 20, 8, 0.90, false},  {"threads", 4u << 20, 16, 1.00, false},
  };
}

TEST(TuneGrid, OneGridPerBackendWithTheBestThreadCountPerCell) {
  const std::vector<Grid> g = make_grids(sweep());
  ASSERT_EQ(g.size(), 2u);
  EXPECT_EQ(g[0].backend, "uring");
  EXPECT_EQ(g[0].blocks, (std::vector<std::uint32_t>{256u << 10, 1u << 20}));
  EXPECT_EQ(g[0].depths, (std::vector<std::uint32_t>{8, 16}));
  EXPECT_EQ(g[0].chosen, 3u);
  EXPECT_DOUBLE_EQ(g[1].at(0, 1), 1.30);   // the better of two thread counts
  EXPECT_TRUE(std::isnan(g[1].at(1, 0)));  // 4M qd8 not measured
  EXPECT_EQ(g[1].chosen, Grid::kNone);
}

TEST(TuneGrid, TextMarksTheChosenCell) {
  EXPECT_EQ(grids_text(make_grids(sweep())),
            "uring        qd8    qd16\n"
            "256K        1.20    1.41\n"
            "1M          1.50   *1.62\n"
            "threads      qd8    qd16\n"
            "1M          0.90    1.30\n"
            "4M             -    1.00\n");
}

TEST(TuneGrid, SvgIsWellFormedWithACellPerPosition) {
  const std::string svg = grids_svg(make_grids(sweep()), "zinf tune: /tmp/a&b <dirs>");
  zinf::test::TestDir dir;
  const std::string path = dir.file("grid.svg");
  std::ofstream(path) << svg;
  if (std::FILE* f = std::fopen("/usr/bin/python3", "r"); f != nullptr) {
    std::fclose(f);
  } else {
    GTEST_SKIP() << "/usr/bin/python3 not installed: cannot parse the SVG";
  }
  // Prints the number of cells, of chosen cells, and the title's text as parsed.
  const std::string cmd =
      "/usr/bin/python3 -c \"import sys, xml.etree.ElementTree as E; "
      "r = E.parse(sys.argv[1]).getroot(); ns = '{http://www.w3.org/2000/svg}'; "
      "c = [e.get('class', '').split() for e in r.iter(ns + 'rect')]; "
      "print(sum('cell' in x for x in c), sum('chosen' in x for x in c), "
      "next(r.iter(ns + 'text')).text)\" " +
      path + " 2>&1";
  std::FILE* p = ::popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[256];
  while (std::fgets(buf, sizeof buf, p) != nullptr) out += buf;
  ASSERT_EQ(::pclose(p), 0) << out;
  EXPECT_EQ(out, "8 1 zinf tune: /tmp/a&b <dirs>\n");  // 2x2 uring + 2x2 threads
}

}  // namespace
}  // namespace zinf::tools::tune
