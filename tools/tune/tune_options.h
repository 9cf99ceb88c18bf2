// SPDX-License-Identifier: Apache-2.0
// `zinf tune`'s command line: its options, their defaults and help, and the checks on them.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "zinf/swap/dir.h"

namespace zinf::tools::tune {

/// The command line, parsed and checked.
struct TuneOptions {
  std::vector<std::string> dirs;
  std::chrono::milliseconds budget = std::chrono::seconds(60);
  std::string out, report, plot, backends, block_list, depth_list;
  std::uint64_t pinned_budget = std::uint64_t{2} << 30;
  bool json = false, sustained_on = false;
  std::optional<std::uint64_t> sustained_size;
  std::chrono::milliseconds sustained_time = std::chrono::seconds(60);
  // Parsed from the texts above.
  std::vector<swap::Dir> opened;  // each directory opened once; every file made relative to it
  std::vector<std::uint64_t> blocks, depths;
  bool want_uring = true, want_threads = true;
  double budget_s() const { return std::chrono::duration<double>(budget).count(); }
};

/// Parses and checks the options and opens the directories (each must be a directory zinf may
/// write to); nullopt when --help was given (and printed). UsageError for a mistake.
std::optional<TuneOptions> parse_options(const std::vector<std::string>& tokens);

}  // namespace zinf::tools::tune
