// SPDX-License-Identifier: Apache-2.0
// A small command-line parser for the zinf tool: `--flag value`, `--flag=value`, repeatable
// flags and switches. Every mistake is a zinf::UsageError whose text the tool prints on one
// line before exiting with status 2.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace zinf::tools {

/// Parses "4096", "1M", "2GiB", "1e8", "512k" into bytes (K/M/G/T and KiB/... are powers of
/// 1024; kB/MB/GB/TB powers of 1000). Whole numbers are exact over the full uint64 range and
/// overflow is an error, never a wrap. Throws UsageError naming `what` on anything else.
std::uint64_t parse_size(std::string_view text, std::string_view what);

/// Parses an integer in [min, max] for the option `what` ("--threads"): decimal digits, exact
/// over the full uint64 range, or an integral number in scientific form ("1e8", "2.5e6") up
/// to 2^53 (where doubles stop being exact). Anything else, a sign, hex, spaces, trailing text,
/// a fraction, overflow or a value outside [min, max], is a UsageError naming the option, the
/// text and the range: "invalid --threads '4294967297': expected an integer in [0, 4294967295]".
std::uint64_t parse_uint(std::string_view text, std::string_view what, std::uint64_t min = 0,
                         std::uint64_t max = UINT64_MAX);

/// Takes options out of argv as the command asks for them, then `finish()` rejects leftovers.
class Args {
 public:
  Args(std::string command, std::vector<std::string> tokens);

  /// The value of `--name` (last one wins), or `fallback`.
  std::string string(std::string_view name, std::string fallback);
  /// Every value of a repeatable `--name`, in order.
  std::vector<std::string> strings(std::string_view name);
  /// A byte size (parse_size).
  std::uint64_t size(std::string_view name, std::uint64_t fallback);
  /// An integer in [min, max] (parse_uint): pass the destination's range (e.g. UINT32_MAX for
  /// a uint32_t field) so that nothing is truncated on the way. `fallback` is not checked.
  std::uint64_t uint(std::string_view name, std::uint64_t fallback, std::uint64_t min = 0,
                     std::uint64_t max = UINT64_MAX);
  double number(std::string_view name, double fallback);
  /// A switch without a value (`--json`).
  bool flag(std::string_view name);
  /// True if `--help` or `-h` was given.
  bool help();
  /// Throws UsageError for any token not consumed, suggesting the closest known option.
  void finish();

  const std::string& command() const { return command_; }

 private:
  std::optional<std::string> take(std::string_view name);
  std::string command_;
  std::vector<std::string> tokens_;
  std::vector<bool> used_;
  std::vector<std::string> known_;
};

}  // namespace zinf::tools
