// SPDX-License-Identifier: Apache-2.0
// The SVG writer: text and attribute values escaped (markup characters, control characters),
// numbers in one format, and a document an XML parser accepts.
#include "svg.h"

#include <cmath>

#include <gtest/gtest.h>

namespace zinf::tools {
namespace {

TEST(Svg, EscapesMarkupAndDropsControlCharacters) {
  EXPECT_EQ(xml_escape("a<b>&\"c'd"), "a&lt;b&gt;&amp;&quot;c&apos;d");
  EXPECT_EQ(xml_escape(std::string("x\x01y\tz\n", 6)), "x?y\tz\n");
  EXPECT_EQ(xml_escape("caf\xc3\xa9"), "caf\xc3\xa9");  // UTF-8 passes through
}

TEST(Svg, NumbersHaveAtMostOneDecimal) {
  EXPECT_EQ(SvgWriter::num(12), "12");
  EXPECT_EQ(SvgWriter::num(12.25), "12.2");
  EXPECT_EQ(SvgWriter::num(-0.01), "0");
  EXPECT_EQ(SvgWriter::num(std::nan("")), "0");
}

TEST(Svg, ElementsAreEscapedInsideTheRoot) {
  SvgWriter s(100, 50);
  s.rect(1, 2, 3, 4, "#fff", {{"class", "cell"}});
  s.text(5, 6, "</svg><x a=\"1\">", "middle");
  s.line(0, 0, 10, 10, "black");
  EXPECT_EQ(s.str(),
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"100\" height=\"50\" "
            "viewBox=\"0 0 100 50\" font-family=\"sans-serif\">\n"
            "<rect x=\"1\" y=\"2\" width=\"3\" height=\"4\" fill=\"#fff\" class=\"cell\"/>\n"
            "<text x=\"5\" y=\"6\" font-size=\"12\" text-anchor=\"middle\">&lt;/svg&gt;&lt;x "
            "a=&quot;1&quot;&gt;</text>\n"
            "<line x1=\"0\" y1=\"0\" x2=\"10\" y2=\"10\" stroke=\"black\"/>\n"
            "</svg>\n");
}

}  // namespace
}  // namespace zinf::tools
