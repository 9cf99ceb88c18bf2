// SPDX-License-Identifier: Apache-2.0
// A minimal writer of one flat JSON object per line, for the tool's --json output.
#pragma once

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

namespace zinf::tools {

class JsonWriter {
 public:
  void field(std::string_view key, const std::string& v) {
    key_(key);
    quote(v);
  }
  void field(std::string_view key, const char* v) { field(key, std::string(v)); }
  void field(std::string_view key, bool v) {
    key_(key);
    out_ += v ? "true" : "false";
  }
  void field(std::string_view key, std::uint64_t v) {
    key_(key);
    out_ += std::to_string(v);
  }
  void field(std::string_view key, std::int64_t v) {
    key_(key);
    out_ += std::to_string(v);
  }
  void field(std::string_view key, double v) {
    key_(key);
    number(v);
  }
  void field(std::string_view key, const std::vector<double>& v) {
    array(key, v, [this](double x) { number(x); });
  }
  void field(std::string_view key, const std::vector<std::string>& v) {
    array(key, v, [this](const std::string& x) { quote(x); });
  }
  /// The object, e.g. {"op":"read","gbps":3.1}
  std::string str() const { return out_ + '}'; }

 private:
  void key_(std::string_view k) {
    out_ += out_.size() > 1 ? "," : "";
    quote(std::string(k));
    out_ += ':';
  }
  // `key`:[e0,e1,...], each element written by `write`.
  template <typename T, typename Write>
  void array(std::string_view key, const std::vector<T>& v, Write write) {
    key_(key);
    out_ += '[';
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (i) out_ += ',';
      write(v[i]);
    }
    out_ += ']';
  }
  void number(double v) {
    if (!std::isfinite(v)) {
      out_ += "null";
      return;
    }
    // The shortest text that reads back as the same double: consumers (tests, `zinf plan
    // --tune`, scripts) compute with these numbers, and "%.6g" lost up to 5e-6 of them.
    char b[32];
    const auto r = std::to_chars(b, b + sizeof b, v);
    out_.append(b, r.ptr);
  }
  void quote(const std::string& s) {
    out_ += '"';
    for (char c : s) {
      switch (c) {
        case '"': out_ += "\\\""; break;
        case '\\': out_ += "\\\\"; break;
        case '\n': out_ += "\\n"; break;
        case '\t': out_ += "\\t"; break;
        default:
          if (static_cast<unsigned char>(c) < 0x20) {
            char b[8];
            std::snprintf(b, sizeof b, "\\u%04x", c);
            out_ += b;
          } else {
            out_ += c;
          }
      }
    }
    out_ += '"';
  }
  std::string out_ = "{";
};

}  // namespace zinf::tools
