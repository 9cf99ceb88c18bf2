// SPDX-License-Identifier: Apache-2.0
// A minimal SVG writer for the commands' plots (`zinf tune --plot`): rectangles, lines and
// text with their attributes escaped, nothing else. Our own: Debian packages no small C++ SVG
// writer (librsvg and Qt SVG render, svg++ parses), and a plot needs only these three shapes.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace zinf::tools {

/// Escapes `text` for XML character data and attribute values: & < > " ' become entities, and
/// control characters XML 1.0 does not allow (below 0x20 except tab, newline, return) become
/// '?'. Bytes >= 0x80 pass through (UTF-8 stays UTF-8).
std::string xml_escape(std::string_view text);

/// An SVG document built element by element; str() returns it whole. Coordinates are user
/// units (pixels at 100%). Not thread-safe.
class SvgWriter {
 public:
  using Attrs = std::vector<std::pair<std::string, std::string>>;
  SvgWriter(double width, double height);

  /// Appends <name attrs...>text</name> (or <name .../> when text is empty); names are the
  /// caller's literals, values and text are escaped.
  void element(std::string_view name, const Attrs& attrs, std::string_view text = {});
  void rect(double x, double y, double w, double h, std::string_view fill, Attrs extra = {});
  void line(double x1, double y1, double x2, double y2, std::string_view stroke);
  /// `anchor`: start, middle or end.
  void text(double x, double y, std::string_view text, std::string_view anchor = "start",
            double size = 12, Attrs extra = {});
  /// The document: XML declaration, <svg> root with its namespace and size, the elements.
  std::string str() const;

  /// "12.5": a coordinate with at most one decimal, in the C locale's format.
  static std::string num(double v);

 private:
  double width_, height_;
  std::string body_;
};

}  // namespace zinf::tools
