// SPDX-License-Identifier: Apache-2.0
// The grids of `zinf tune` (grid.h): laid out from the sweep, written as text and as SVG.
#include "grid.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "svg.h"

namespace zinf::tools::tune {
namespace {

std::string block_label(std::uint32_t b) {
  if (b % (1u << 20) == 0) return std::to_string(b >> 20) + "M";
  if (b % (1u << 10) == 0) return std::to_string(b >> 10) + "K";
  return std::to_string(b);
}

std::size_t index_of(const std::vector<std::uint32_t>& v, std::uint32_t x) {
  return static_cast<std::size_t>(std::find(v.begin(), v.end(), x) - v.begin());
}

// A colour from light (low) to dark blue (high): t in [0, 1].
std::string heat(double t) {
  t = std::clamp(t, 0.0, 1.0);
  auto mix = [t](int lo, int hi) { return static_cast<int>(std::lround(lo + (hi - lo) * t)); };
  char buf[8];
  std::snprintf(buf, sizeof buf, "#%02x%02x%02x", mix(0xde, 0x08), mix(0xeb, 0x30),
                mix(0xf7, 0x6b));
  return buf;
}

}  // namespace

std::vector<Grid> make_grids(const std::vector<GridPoint>& points) {
  std::vector<Grid> grids;
  for (const auto& p : points) {
    auto g = std::find_if(grids.begin(), grids.end(),
                          [&](const Grid& x) { return x.backend == p.backend; });
    if (g == grids.end()) {
      grids.push_back({});
      g = grids.end() - 1;
      g->backend = p.backend;
    }
    if (index_of(g->blocks, p.block) == g->blocks.size()) g->blocks.push_back(p.block);
    if (index_of(g->depths, p.depth) == g->depths.size()) g->depths.push_back(p.depth);
  }
  for (auto& g : grids) {
    std::sort(g.blocks.begin(), g.blocks.end());
    std::sort(g.depths.begin(), g.depths.end());
    g.gbps.assign(g.blocks.size() * g.depths.size(), std::nan(""));
  }
  for (const auto& p : points) {
    auto g = std::find_if(grids.begin(), grids.end(),
                          [&](const Grid& x) { return x.backend == p.backend; });
    const std::size_t cell =
        index_of(g->blocks, p.block) * g->depths.size() + index_of(g->depths, p.depth);
    double& v = g->gbps[cell];
    if (std::isnan(v) || p.gbps > v) v = p.gbps;
    if (p.chosen) g->chosen = cell;
  }
  return grids;
}

std::string grids_text(const std::vector<Grid>& grids) {
  std::string out;
  char buf[64];
  for (const auto& g : grids) {
    std::snprintf(buf, sizeof buf, "%-8s", g.backend.c_str());
    out += buf;
    for (auto d : g.depths) {
      std::snprintf(buf, sizeof buf, "%8s", ("qd" + std::to_string(d)).c_str());
      out += buf;
    }
    out += '\n';
    for (std::size_t r = 0; r < g.blocks.size(); ++r) {
      std::snprintf(buf, sizeof buf, "%-8s", block_label(g.blocks[r]).c_str());
      out += buf;
      for (std::size_t c = 0; c < g.depths.size(); ++c) {
        const double v = g.at(r, c);
        std::string cell = "-";
        if (!std::isnan(v)) {
          std::snprintf(buf, sizeof buf, "%s%.2f", r * g.depths.size() + c == g.chosen ? "*" : "",
                        v);
          cell = buf;
        }
        std::snprintf(buf, sizeof buf, "%8s", cell.c_str());
        out += buf;
      }
      out += '\n';
    }
  }
  return out;
}

std::string grids_svg(const std::vector<Grid>& grids, const std::string& title) {
  // Layout: a title line, then one panel per backend: its name, a row of depth labels, the
  // cells with the block size left of each row; a legend line at the bottom.
  constexpr double kCellW = 72, kCellH = 36, kLabelW = 56, kTop = 40, kPanelHead = 40, kGap = 24,
                   kMargin = 16;
  double lo = INFINITY, hi = -INFINITY;
  std::size_t rows = 0;
  double width = kMargin;
  for (const auto& g : grids) {
    for (double v : g.gbps) {
      if (std::isnan(v)) continue;
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
    rows = std::max(rows, g.blocks.size());
    width += kLabelW + kCellW * static_cast<double>(g.depths.size()) + kGap;
  }
  width = std::max(width, 520.0);  // the legend's lines
  const double height = kTop + kPanelHead + kCellH * static_cast<double>(rows) + 56;
  SvgWriter svg(width, height);
  svg.text(kMargin, 24, title, "start", 14, {{"font-weight", "bold"}});
  double x0 = kMargin;
  for (const auto& g : grids) {
    const double top = kTop + kPanelHead;
    svg.text(x0, kTop + 16, g.backend, "start", 13, {{"font-weight", "bold"}});
    for (std::size_t c = 0; c < g.depths.size(); ++c) {
      svg.text(x0 + kLabelW + kCellW * (static_cast<double>(c) + 0.5), top - 8,
               "qd" + std::to_string(g.depths[c]), "middle", 11);
    }
    for (std::size_t r = 0; r < g.blocks.size(); ++r) {
      const double y = top + kCellH * static_cast<double>(r);
      svg.text(x0 + kLabelW - 8, y + kCellH / 2 + 4, block_label(g.blocks[r]), "end", 11);
      for (std::size_t c = 0; c < g.depths.size(); ++c) {
        const double x = x0 + kLabelW + kCellW * static_cast<double>(c);
        const double v = g.at(r, c);
        const bool chosen = r * g.depths.size() + c == g.chosen;
        const double t = std::isnan(v) ? 0 : (hi > lo ? (v - lo) / (hi - lo) : 1.0);
        SvgWriter::Attrs a = {{"class", chosen ? "cell chosen" : "cell"},
                              {"stroke", chosen ? "#d62728" : "#ffffff"},
                              {"stroke-width", chosen ? "3" : "1"}};
        svg.rect(x, y, kCellW, kCellH, std::isnan(v) ? "#eeeeee" : heat(t), a);
        char label[32];
        if (std::isnan(v)) {
          std::snprintf(label, sizeof label, "-");
        } else {
          std::snprintf(label, sizeof label, "%.2f", v);
        }
        svg.text(x + kCellW / 2, y + kCellH / 2 + 4, label, "middle", 11,
                 {{"fill", t > 0.55 ? "#ffffff" : "#000000"}});
      }
    }
    x0 += kLabelW + kCellW * static_cast<double>(g.depths.size()) + kGap;
  }
  if (lo > hi) lo = hi = 0;  // nothing measured: no scale to state
  char scale[96];
  std::snprintf(scale, sizeof scale, "colour: light %.2f GB/s to dark %.2f GB/s", lo, hi);
  svg.text(kMargin, height - 30,
           "mixed GB/s (optimizer-step reads + writes, 1e9 B/s) by block size (rows) and queue "
           "depth (columns)",
           "start", 11);
  svg.text(kMargin, height - 14,
           std::string(scale) + "; outlined: chosen; threads: its best thread count", "start", 11);
  return svg.str();
}

}  // namespace zinf::tools::tune
