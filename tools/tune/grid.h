// SPDX-License-Identifier: Apache-2.0
// `zinf tune`'s block-size x queue-depth grid per backend: the sweep's figures laid out so the
// shape of the surface shows (where depth stops paying, which block size is flat), as text at
// the end of the output and as an SVG heat map (--plot). Pure functions of the figures.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace zinf::tools::tune {

/// One measured setting, as the grid sees it.
struct GridPoint {
  std::string backend;
  std::uint32_t block = 0;
  std::uint32_t depth = 0;
  double gbps = 0;  ///< its median
  bool chosen = false;
};

/// One backend's grid: rows are block sizes, columns queue depths, both ascending.
struct Grid {
  static constexpr std::size_t kNone = std::numeric_limits<std::size_t>::max();
  std::string backend;
  std::vector<std::uint32_t> blocks;
  std::vector<std::uint32_t> depths;
  /// Row-major blocks.size() x depths.size(); NaN where nothing was measured. A cell of
  /// several settings (the threads backend's thread counts) holds the best of them.
  std::vector<double> gbps;
  std::size_t chosen = kNone;  ///< the cell of the chosen setting, if in this grid
  double at(std::size_t row, std::size_t col) const { return gbps[row * depths.size() + col]; }
};

/// One grid per backend, in the order the backends first appear in `points`.
std::vector<Grid> make_grids(const std::vector<GridPoint>& points);

/// The grids as text, one block per backend:
///   uring       qd8    qd16    qd32
///   256K       1.20    1.41    1.52
///   1M         1.50   *1.62    1.60
/// (`*` the chosen cell, `-` not measured).
std::string grids_text(const std::vector<Grid>& grids);

/// The grids as an SVG heat map, one panel per backend side by side, a colour scale shared by
/// all, each cell labelled with its GB/s and the chosen one outlined. Every cell is a <rect>
/// with class "cell" (class "cell chosen" for the chosen one). `title` heads the picture.
std::string grids_svg(const std::vector<Grid>& grids, const std::string& title);

}  // namespace zinf::tools::tune
