// SPDX-License-Identifier: Apache-2.0
// The zinf tool's argument grammar, one function per kind of value (sizes, counts, durations,
// numbers), and Cli: a command's options declared once over CLI11 (libcli11-dev), which does
// the tokenizing (`--flag value`, `--flag=value`, repeats, missing values) and generates the
// help. zinf adds what CLI11 does not: its unit grammar, "did you mean" for unknown options,
// and fio's and DeepSpeed ds_io's option names mapped to zinf's. Every mistake is a
// zinf::UsageError whose text the tool prints on one line before exiting with status 2.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace zinf::tools {

/// Parses a byte size: digits with an optional fraction or exponent, then an optional unit in
/// any case: none or B (bytes); K, M, G, T and KiB, MiB, GiB, TiB (powers of 1024); kB, MB,
/// GB, TB (powers of 1000). "4K", "1.5G", "4GiB", "64mb", "1e8". Whole numbers are exact over
/// the full uint64 range; a fraction must come to whole bytes. A sign, hex, trailing text or
/// overflow is a UsageError naming `what`: "invalid --size '12Q': expected a size such as
/// 4096, 512K, 1M, 2GiB or 1e8".
std::uint64_t parse_size(std::string_view text, std::string_view what);

/// Parses a count in [min, max] for the option `what`: decimal digits (exact over the full
/// uint64 range), an integral number in scientific form ("1e8", "2.5e6", exact up to 2^53), or
/// either with a K, M, G or T multiplier in any case (powers of 1024, as sizes: "20M" is
/// 20 x 2^20). A sign, hex, spaces, trailing text, a fraction, overflow or a value outside
/// [min, max] is a UsageError naming the option, the text and the range: "invalid --threads
/// '4294967297': expected an integer in [0, 4294967295]".
std::uint64_t parse_count(std::string_view text, std::string_view what, std::uint64_t min = 0,
                          std::uint64_t max = UINT64_MAX);

/// Parses a duration: a number (fraction allowed) and a unit, ms, s, m (or min) or h, in any
/// case; a bare number is seconds. "250ms", "10s", "1.5m", "1h". From 1 ms up to a week;
/// anything else is a UsageError: "invalid --duration '10parsecs': expected a duration such
/// as 250ms, 10s, 5m or 1h".
std::chrono::milliseconds parse_duration(std::string_view text, std::string_view what);

/// Checks that `text` is one of `choices` (exactly, case included) and returns it; otherwise a
/// UsageError naming `what`, the choices and the nearest one: "invalid --rw 'randwirte':
/// expected read, write, randread, randwrite, rw or randrw (did you mean randwrite?)".
std::string parse_choice(std::string_view text, std::string_view what,
                         const std::vector<std::string>& choices);

/// Parses a finite decimal number ("0.5", "1e-3"); UsageError naming `what` otherwise.
double parse_number(std::string_view text, std::string_view what);

/// `bytes` in the shortest form parse_size reads back exactly: "1G", "256K", "4097".
std::string size_text(std::uint64_t bytes);
/// `d` in the shortest form parse_duration reads back exactly: "10s", "5m", "250ms".
std::string duration_text(std::chrono::milliseconds d);

/// One command's options. Declare each option bound to its destination, then parse(): the
/// destination's value on entry is the default `--help` shows (unless `shown` gives the text),
/// and it is overwritten only when the option is given (the last one wins, except texts()).
/// Not thread-safe; the destinations must outlive parse().
class Cli {
 public:
  /// `command` is the command as typed after `zinf` ("bench io"); `about` the text under the
  /// usage line; `footer` the text after the options.
  Cli(std::string command, std::string about, std::string footer = "");
  ~Cli();
  Cli(const Cli&) = delete;
  Cli& operator=(const Cli&) = delete;

  /// Starts a titled group of options in --help (options before any group are "options").
  Cli& group(std::string title);

  /// `--name VALUE` as text. `value_name` is the placeholder shown in --help ("FILE").
  Cli& text(const std::string& name, std::string& dest, std::string value_name, std::string help,
            std::string shown = "");
  /// A repeatable `--name VALUE`: every value in order, each occurrence taking one.
  Cli& texts(const std::string& name, std::vector<std::string>& dest, std::string value_name,
             std::string help, std::string shown);
  /// One of `choices` (parse_choice); `value_name` is the placeholder in --help ("MODE").
  Cli& choice(const std::string& name, std::string& dest, std::vector<std::string> choices,
              std::string value_name, std::string help, std::string shown = "");
  /// A byte size (parse_size); shown as size_text(dest) unless `shown` is given.
  Cli& size(const std::string& name, std::uint64_t& dest, std::string help, std::string shown = "");
  /// A byte size that has no default: unset unless given.
  Cli& size(const std::string& name, std::optional<std::uint64_t>& dest, std::string help,
            std::string shown = "none");
  /// A count in [min, max] (parse_count): pass the destination's range so that nothing is
  /// truncated on the way. The default is not checked.
  Cli& count(const std::string& name, std::uint64_t& dest, std::string help, std::uint64_t min = 0,
             std::uint64_t max = UINT64_MAX, std::string shown = "");
  /// A finite number (parse_number).
  Cli& number(const std::string& name, double& dest, std::string help, std::string shown = "");
  /// A duration (parse_duration).
  Cli& duration(const std::string& name, std::chrono::milliseconds& dest, std::string help,
                std::string shown = "");
  /// A switch: sets dest to true when given. Off unless given.
  Cli& flag(const std::string& name, bool& dest, std::string help);

  /// A switch for testing zinf itself, left out of --help (documented where it is used).
  Cli& hidden_flag(const std::string& name, bool& dest);

  /// Another tool's option name that means `to` here, value and all ("--bs" -> "--block-size").
  /// fio's and ds_io's common names are built in wherever this command has the option; this
  /// adds or overrides one.
  Cli& alias(const std::string& from, const std::string& to);
  /// Another tool's option whose value maps to zinf tokens (fio's `--rw read` -> `--op=read`):
  /// `map` returns the replacement tokens or throws a UsageError naming the zinf option to use.
  Cli& alias_value(const std::string& from,
                   std::function<std::vector<std::string>(const std::string& value)> map);
  /// Another tool's switch that means these zinf tokens (ds_io's `--read` -> `--op=read`).
  Cli& alias_switch(const std::string& from, std::vector<std::string> tokens);
  /// Another tool's option with no counterpart here: giving it is a UsageError with `why`,
  /// which names the zinf option to use instead.
  Cli& refuse(const std::string& from, std::string why);

  /// Parses the tokens after the command's name and stores every option given. Returns false
  /// when `--help` or `-h` was given: the help is then printed on stdout, nothing is stored,
  /// and the command returns 0. Throws UsageError for an unknown option (with the nearest
  /// known one), a missing value or a value the grammar refuses.
  bool parse(const std::vector<std::string>& tokens);

  /// The --help text: usage line, about, every option with its default, footer.
  std::string help() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zinf::tools
