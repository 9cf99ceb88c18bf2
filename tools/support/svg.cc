// SPDX-License-Identifier: Apache-2.0
#include "svg.h"

#include <cmath>
#include <cstdio>

namespace zinf::tools {

std::string xml_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default:
        // A parser refuses these even as character references (XML 1.0, Char).
        out += (c < 0x20 && c != '\t' && c != '\n' && c != '\r') ? '?' : ch;
    }
  }
  return out;
}

SvgWriter::SvgWriter(double width, double height) : width_(width), height_(height) {}

std::string SvgWriter::num(double v) {
  char buf[32];
  if (!std::isfinite(v)) v = 0;  // NaN or inf would make the attribute unparseable
  std::snprintf(buf, sizeof buf, "%.1f", v);
  std::string s = buf;
  if (s.size() > 2 && s.compare(s.size() - 2, 2, ".0") == 0) s.resize(s.size() - 2);
  return s == "-0" ? "0" : s;
}

void SvgWriter::element(std::string_view name, const Attrs& attrs, std::string_view text) {
  body_ += '<';
  body_ += name;
  for (const auto& [k, v] : attrs) body_ += " " + k + "=\"" + xml_escape(v) + "\"";
  if (text.empty()) {
    body_ += "/>\n";
  } else {
    body_ += ">" + xml_escape(text) + "</" + std::string(name) + ">\n";
  }
}

void SvgWriter::rect(double x, double y, double w, double h, std::string_view fill, Attrs extra) {
  Attrs a = {{"x", num(x)},
             {"y", num(y)},
             {"width", num(w)},
             {"height", num(h)},
             {"fill", std::string(fill)}};
  a.insert(a.end(), extra.begin(), extra.end());
  element("rect", a);
}

void SvgWriter::line(double x1, double y1, double x2, double y2, std::string_view stroke) {
  element("line", {{"x1", num(x1)},
                   {"y1", num(y1)},
                   {"x2", num(x2)},
                   {"y2", num(y2)},
                   {"stroke", std::string(stroke)}});
}

void SvgWriter::text(double x, double y, std::string_view text, std::string_view anchor,
                     double size, Attrs extra) {
  Attrs a = {
      {"x", num(x)}, {"y", num(y)}, {"font-size", num(size)}, {"text-anchor", std::string(anchor)}};
  a.insert(a.end(), extra.begin(), extra.end());
  element("text", a, text);
}

std::string SvgWriter::str() const {
  return "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
         "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" +
         num(width_) + "\" height=\"" + num(height_) + "\" viewBox=\"0 0 " + num(width_) + " " +
         num(height_) + "\" font-family=\"sans-serif\">\n" + body_ + "</svg>\n";
}

}  // namespace zinf::tools
