// SPDX-License-Identifier: Apache-2.0
// `zinf demo`'s command line: its options, their defaults and help and the checks on them, and
// the engine config built from them (a config file's, with the command line on top).
#pragma once

#include <chrono>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "demo_model.h"
#include "launch.h"
#include "zinf/offload/config.h"

namespace zinf::tools::demo {

// The command line, parsed and checked; the engine config is built from it later.
struct DemoOptions {
  // kUnset is outside --adam-threads' range, so no value given can be mistaken for it.
  static constexpr std::uint64_t kUnset = ~std::uint64_t{0};
  std::string offload_text, dir_option, config_path, device_text = "host", dist_text = "auto";
  std::string weights_out, save_dir, resume_dir;
  std::uint64_t steps = 50, seed = 1, every_option = 0;
  MlpShape shape;
  double lr = std::nan("");
  std::uint64_t adam_threads = kUnset;
  std::uint64_t zero_stage = kUnset;
  bool json = false;
  DistMode dist_mode = DistMode::kAuto;  // --dist, parsed
  // How long a collective waits for the other ranks (a step of the largest demo is far
  // shorter); a test of a lost node shortens it.
  std::chrono::milliseconds collective_timeout{std::chrono::seconds(120)};
};

/// Parses and checks the options; nullopt when --help was given (and printed).
std::optional<DemoOptions> parse_options(const std::vector<std::string>& tokens);

/// Builds the engine config: the file's (if any), then the command line on top. `dir_used`:
/// where the NVMe swap files go (empty without an NVMe tier).
offload::EngineConfig make_config(const std::string& config_path, const std::string& offload_text,
                                  const std::string& dir_option, double lr,
                                  std::uint64_t adam_threads, bool adam_threads_given,
                                  std::optional<int> zero_stage, std::string& dir_used);

}  // namespace zinf::tools::demo
