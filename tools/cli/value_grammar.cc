// SPDX-License-Identifier: Apache-2.0
// The argument grammar of args.h: sizes, counts, durations, numbers and choices, parsed and
// printed back, each mistake a UsageError naming the option.
#include "args.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <system_error>
#include <utility>

#include "zinf/common/error.h"
#include "zinf/common/suggest.h"

namespace zinf::tools {
namespace {

// Decimal digits only, the whole of `text`, into a uint64; nullopt for anything else or
// overflow (std::from_chars refuses signs, spaces and hex, and reports overflow).
std::optional<std::uint64_t> parse_digits(std::string_view text) {
  std::uint64_t value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end) return std::nullopt;
  return value;
}

// A non-negative decimal number without sign, hex, "inf" or spaces (strtod would take all of
// those): digits, at most one '.', and an exponent only where `exponent` allows it.
std::optional<double> parse_plain_decimal(std::string_view text, bool exponent) {
  if (text.empty() || !std::isdigit(static_cast<unsigned char>(text[0]))) return std::nullopt;
  const char* allowed = exponent ? "0123456789.eE+-" : "0123456789.";
  if (text.find_first_not_of(allowed) != std::string_view::npos) return std::nullopt;
  const std::string s(text);
  char* end = nullptr;
  errno = 0;
  const double d = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size() || errno != 0 || !std::isfinite(d)) return std::nullopt;
  return d;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Splits "1.5GiB" into "1.5" and "GiB": the number is digits, '.', and an 'e'/'E' only where
// a digit follows it (so "1e8" is a number but the 'e' of nothing else is).
std::pair<std::string_view, std::string_view> split_number(std::string_view t) {
  std::size_t i = 0;
  while (i < t.size() && (std::isdigit(static_cast<unsigned char>(t[i])) || t[i] == '.' ||
                          ((t[i] == 'e' || t[i] == 'E') && i > 0 && i + 1 < t.size() &&
                           std::isdigit(static_cast<unsigned char>(t[i + 1]))))) {
    ++i;
  }
  return {t.substr(0, i), t.substr(i)};
}

constexpr std::uint64_t kKi = 1024;

// The unit words of a size, lower case. Binary unless the B follows a letter (kB, MB...):
// those are the SI units, and a drive's capacity is sold in them.
std::optional<std::uint64_t> size_unit(std::string_view suffix) {
  static const std::map<std::string, std::uint64_t> kUnits = {{"", 1},
                                                              {"b", 1},
                                                              {"k", kKi},
                                                              {"kib", kKi},
                                                              {"m", kKi * kKi},
                                                              {"mib", kKi * kKi},
                                                              {"g", kKi * kKi * kKi},
                                                              {"gib", kKi * kKi * kKi},
                                                              {"t", kKi * kKi * kKi * kKi},
                                                              {"tib", kKi * kKi * kKi * kKi},
                                                              {"kb", 1000},
                                                              {"mb", 1000000},
                                                              {"gb", 1000000000},
                                                              {"tb", 1000000000000}};
  const auto it = kUnits.find(lower(suffix));
  if (it == kUnits.end()) return std::nullopt;
  return it->second;
}

std::optional<std::uint64_t> count_unit(std::string_view suffix) {
  const std::string s = lower(suffix);
  if (s.empty()) return 1;
  if (s == "k") return kKi;
  if (s == "m") return kKi * kKi;
  if (s == "g") return kKi * kKi * kKi;
  if (s == "t") return kKi * kKi * kKi * kKi;
  return std::nullopt;
}

}  // namespace

std::uint64_t parse_size(std::string_view text, std::string_view what) {
  const auto bad = [&]() {
    return UsageError("invalid " + std::string(what) + " '" + std::string(text) +
                      "': expected a size such as 4096, 512K, 1M, 2GiB or 1e8");
  };
  const auto [num, suffix] = split_number(text);
  const std::optional<std::uint64_t> mult = size_unit(suffix);
  if (num.empty() || !mult) throw bad();
  // Whole numbers stay integers: exact up to 2^64 - 1, and an overflow is refused rather
  // than rounded.
  if (const auto whole = parse_digits(num)) {
    if (*whole > UINT64_MAX / *mult) throw bad();
    return *whole * *mult;
  }
  const std::optional<double> v = parse_plain_decimal(num, true);
  if (!v) throw bad();
  const double bytes = *v * static_cast<double>(*mult);
  // 2^64 itself is not representable in a uint64; a double compares exactly against it.
  if (bytes >= 18446744073709551616.0 || bytes != std::floor(bytes)) throw bad();
  return static_cast<std::uint64_t>(bytes);
}

std::uint64_t parse_count(std::string_view text, std::string_view what, std::uint64_t min,
                          std::uint64_t max) {
  const auto bad = [&]() {
    return UsageError("invalid " + std::string(what) + " '" + std::string(text) +
                      "': expected an integer in [" + std::to_string(min) + ", " +
                      std::to_string(max) + "]");
  };
  const auto [num, suffix] = split_number(text);
  const std::optional<std::uint64_t> mult = count_unit(suffix);
  if (num.empty() || !mult) throw bad();
  std::uint64_t value = 0;
  if (const auto whole = parse_digits(num)) {
    if (*whole > UINT64_MAX / *mult) throw bad();
    value = *whole * *mult;
  } else {
    // "1e8", "2.5e6", "1.5K": exact only up to 2^53, where doubles stop counting by one.
    const std::optional<double> v = parse_plain_decimal(num, true);
    if (!v) throw bad();
    const double d = *v * static_cast<double>(*mult);
    if (!(d <= 9007199254740992.0) || d != std::floor(d)) throw bad();
    value = static_cast<std::uint64_t>(d);
  }
  if (value < min || value > max) throw bad();
  return value;
}

std::chrono::milliseconds parse_duration(std::string_view text, std::string_view what) {
  const auto bad = [&]() {
    return UsageError("invalid " + std::string(what) + " '" + std::string(text) +
                      "': expected a duration such as 250ms, 10s, 5m or 1h");
  };
  std::size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.'))
    ++i;
  const std::optional<double> v = parse_plain_decimal(text.substr(0, i), false);
  const std::string unit = lower(text.substr(i));
  double ms_per_unit = 0;
  if (unit.empty() || unit == "s") {
    ms_per_unit = 1e3;
  } else if (unit == "ms") {
    ms_per_unit = 1;
  } else if (unit == "m" || unit == "min") {
    ms_per_unit = 60e3;
  } else if (unit == "h") {
    ms_per_unit = 3600e3;
  }
  if (!v || ms_per_unit == 0) throw bad();
  const double ms = *v * ms_per_unit;
  // A week bounds a soak or a sweep far beyond any use, and keeps every sum in range.
  if (!(ms >= 1) || ms > 7 * 24 * 3600e3) throw bad();
  return std::chrono::milliseconds(static_cast<std::int64_t>(std::llround(ms)));
}

double parse_number(std::string_view text, std::string_view what) {
  std::string s(text);
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || errno != 0 || !std::isfinite(v)) {
    throw UsageError("invalid " + std::string(what) + " '" + s +
                     "': expected a number such as 0.5 or 1e-3");
  }
  return v;
}

std::string parse_choice(std::string_view text, std::string_view what,
                         const std::vector<std::string>& choices) {
  for (const std::string& c : choices) {
    if (c == text) return c;
  }
  std::string list;
  for (std::size_t i = 0; i < choices.size(); ++i) {
    list += (i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ") + choices[i];
  }
  std::string msg =
      "invalid " + std::string(what) + " '" + std::string(text) + "': expected " + list;
  // Case is a typo too ("Read"), and so is a transposition ("randwirte", 2 edits).
  std::string lower(text);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  const std::string_view s =
      lower.empty() ? "" : closest_match(lower, choices, typo_distance(lower, 3));
  if (!s.empty()) msg += " (did you mean " + std::string(s) + "?)";
  throw UsageError(msg);
}

std::string size_text(std::uint64_t bytes) {
  static constexpr std::pair<char, unsigned> kUnits[] = {
      {'T', 40}, {'G', 30}, {'M', 20}, {'K', 10}};
  for (const auto& [letter, shift] : kUnits) {
    const std::uint64_t unit = std::uint64_t{1} << shift;
    if (bytes != 0 && bytes % unit == 0) return std::to_string(bytes / unit) + letter;
  }
  return std::to_string(bytes);
}

std::string duration_text(std::chrono::milliseconds d) {
  const auto ms = d.count();
  if (ms != 0 && ms % 3600000 == 0) return std::to_string(ms / 3600000) + "h";
  if (ms != 0 && ms % 60000 == 0) return std::to_string(ms / 60000) + "m";
  if (ms % 1000 == 0) return std::to_string(ms / 1000) + "s";
  return std::to_string(ms) + "ms";
}

}  // namespace zinf::tools
