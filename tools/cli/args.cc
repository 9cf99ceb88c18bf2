// SPDX-License-Identifier: Apache-2.0
// Command-line parsing for tools/: values, sizes and the "did you mean" suggestion.
#include "args.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <system_error>
#include <utility>

#include "zinf/common/error.h"
#include "zinf/common/suggest.h"

namespace zinf::tools {
namespace {

double parse_number(std::string_view text, std::string_view what) {
  std::string s(text);
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || errno != 0 || !std::isfinite(v)) {
    throw UsageError("invalid " + std::string(what) + " '" + s + "': not a number");
  }
  return v;
}

// Decimal digits only, the whole of `text`, into a uint64; nullopt for anything else or
// overflow (std::from_chars refuses signs, spaces and hex, and reports overflow).
std::optional<std::uint64_t> parse_digits(std::string_view text) {
  std::uint64_t value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end) return std::nullopt;
  return value;
}

}  // namespace

std::uint64_t parse_uint(std::string_view text, std::string_view what, std::uint64_t min,
                         std::uint64_t max) {
  const auto bad = [&]() {
    return UsageError("invalid " + std::string(what) + " '" + std::string(text) +
                      "': expected an integer in [" + std::to_string(min) + ", " +
                      std::to_string(max) + "]");
  };
  std::optional<std::uint64_t> value = parse_digits(text);
  if (!value) {
    // "1e8", "2.5e6": digits, one '.', an exponent; no sign before the number, no hex, no
    // "inf" (strtod would take those). Exact only up to 2^53.
    const bool scientific = !text.empty() && std::isdigit(static_cast<unsigned char>(text[0])) &&
                            text.find_first_of("eE") != std::string_view::npos &&
                            text.find_first_not_of("0123456789.eE+-") == std::string_view::npos;
    if (!scientific) throw bad();
    const std::string s(text);
    char* end = nullptr;
    errno = 0;
    const double d = std::strtod(s.c_str(), &end);
    if (end != s.c_str() + s.size() || errno != 0 || !(d >= 0 && d <= 9007199254740992.0) ||
        d != std::floor(d)) {
      throw bad();
    }
    value = static_cast<std::uint64_t>(d);
  }
  if (*value < min || *value > max) throw bad();
  return *value;
}

std::uint64_t parse_size(std::string_view text, std::string_view what) {
  std::string_view t = text;
  std::size_t i = 0;
  while (i < t.size() && (std::isdigit(static_cast<unsigned char>(t[i])) || t[i] == '.' ||
                          ((t[i] == 'e' || t[i] == 'E') && i > 0 && i + 1 < t.size() &&
                           std::isdigit(static_cast<unsigned char>(t[i + 1]))))) {
    ++i;
  }
  std::string_view num = t.substr(0, i);
  std::string_view suffix = t.substr(i);
  auto bad = [&]() -> UsageError {
    return UsageError("invalid " + std::string(what) + " '" + std::string(text) +
                      "': expected a size such as 4096, 512K, 1M, 2GiB or 1e8");
  };
  if (num.empty()) throw bad();
  // Whole numbers with a binary or no suffix stay integers: exact up to 2^64 - 1, and an
  // overflow is refused rather than rounded.
  static constexpr std::pair<std::string_view, std::uint64_t> kExact[] = {{"", 1},
                                                                          {"B", 1},
                                                                          {"K", 1ull << 10},
                                                                          {"k", 1ull << 10},
                                                                          {"KiB", 1ull << 10},
                                                                          {"M", 1ull << 20},
                                                                          {"m", 1ull << 20},
                                                                          {"MiB", 1ull << 20},
                                                                          {"G", 1ull << 30},
                                                                          {"g", 1ull << 30},
                                                                          {"GiB", 1ull << 30},
                                                                          {"T", 1ull << 40},
                                                                          {"t", 1ull << 40},
                                                                          {"TiB", 1ull << 40},
                                                                          {"kB", 1000},
                                                                          {"KB", 1000},
                                                                          {"MB", 1000000},
                                                                          {"GB", 1000000000},
                                                                          {"TB", 1000000000000}};
  if (const auto whole = parse_digits(num)) {
    for (const auto& [name, mult] : kExact) {
      if (suffix != name) continue;
      if (*whole > UINT64_MAX / mult) throw bad();
      return *whole * mult;
    }
    throw bad();
  }
  double v = 0;
  try {
    v = parse_number(num, what);
  } catch (const UsageError&) {
    throw bad();
  }
  double mult = 1;
  std::string s(suffix);
  if (s.empty() || s == "B") {
    mult = 1;
  } else if (s == "K" || s == "k" || s == "KiB") {
    mult = 1024.0;
  } else if (s == "M" || s == "m" || s == "MiB") {
    mult = 1024.0 * 1024;
  } else if (s == "G" || s == "g" || s == "GiB") {
    mult = 1024.0 * 1024 * 1024;
  } else if (s == "T" || s == "t" || s == "TiB") {
    mult = 1024.0 * 1024 * 1024 * 1024;
  } else if (s == "kB" || s == "KB") {
    mult = 1e3;
  } else if (s == "MB") {
    mult = 1e6;
  } else if (s == "GB") {
    mult = 1e9;
  } else if (s == "TB") {
    mult = 1e12;
  } else {
    throw bad();
  }
  double bytes = v * mult;
  if (bytes < 0 || bytes > 1.8e19 || bytes != std::floor(bytes)) throw bad();
  return static_cast<std::uint64_t>(bytes);
}

Args::Args(std::string command, std::vector<std::string> tokens)
    : command_(std::move(command)), tokens_(std::move(tokens)), used_(tokens_.size(), false) {}

std::optional<std::string> Args::take(std::string_view name) {
  // The same scan as strings(), so `--name v` and `--name=v` are accepted alike; the last
  // occurrence wins.
  std::vector<std::string> values = strings(name);
  if (values.empty()) return std::nullopt;
  return std::move(values.back());
}

std::string Args::string(std::string_view name, std::string fallback) {
  auto v = take(name);
  return v ? *v : std::move(fallback);
}

std::vector<std::string> Args::strings(std::string_view name) {
  known_.emplace_back("--" + std::string(name));
  std::vector<std::string> out;
  const std::string flag = "--" + std::string(name);
  for (std::size_t i = 0; i < tokens_.size(); ++i) {
    if (used_[i]) continue;
    if (tokens_[i] == flag) {
      if (i + 1 >= tokens_.size()) throw UsageError("option " + flag + " needs a value");
      used_[i] = used_[i + 1] = true;
      out.push_back(tokens_[i + 1]);
      ++i;
    } else if (tokens_[i].rfind(flag + "=", 0) == 0) {
      used_[i] = true;
      out.push_back(tokens_[i].substr(flag.size() + 1));
    }
  }
  return out;
}

std::uint64_t Args::size(std::string_view name, std::uint64_t fallback) {
  auto v = take(name);
  return v ? parse_size(*v, "--" + std::string(name)) : fallback;
}

std::uint64_t Args::uint(std::string_view name, std::uint64_t fallback, std::uint64_t min,
                         std::uint64_t max) {
  auto v = take(name);
  return v ? parse_uint(*v, "--" + std::string(name), min, max) : fallback;
}

double Args::number(std::string_view name, double fallback) {
  auto v = take(name);
  return v ? parse_number(*v, "--" + std::string(name)) : fallback;
}

bool Args::flag(std::string_view name) {
  const std::string f = "--" + std::string(name);
  known_.push_back(f);
  bool found = false;
  for (std::size_t i = 0; i < tokens_.size(); ++i) {
    if (!used_[i] && tokens_[i] == f) {
      used_[i] = true;
      found = true;
    }
  }
  return found;
}

bool Args::help() {
  bool found = false;
  for (std::size_t i = 0; i < tokens_.size(); ++i) {
    if (!used_[i] && (tokens_[i] == "--help" || tokens_[i] == "-h")) {
      used_[i] = true;
      found = true;
    }
  }
  return found;
}

void Args::finish() {
  for (std::size_t i = 0; i < tokens_.size(); ++i) {
    if (used_[i]) continue;
    const std::string& tok = tokens_[i];
    std::string name = tok.substr(0, tok.find('='));
    std::string msg = "unknown option '" + name + "' for '" + command_ + "'";
    // A typo is at most 2 edits, or one per 3 characters of what was typed.
    const std::string_view s = closest_match(name, known_, typo_distance(name, 3));
    if (!s.empty()) msg += " (did you mean " + std::string(s) + "?)";
    throw UsageError(msg);
  }
}

}  // namespace zinf::tools
