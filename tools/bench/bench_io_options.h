// SPDX-License-Identifier: Apache-2.0
// `zinf bench io`'s command line: the jobs --op and --rw ask for and the run's settings, parsed
// and checked.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "zinf/swap/io_engine.h"

namespace zinf::tools::bench_io {

// What --op and --rw ask for: one job, or --op both's two (write, then read).
struct Job {
  std::string rw;         // fio's name for it: read, write, randread, randwrite, rw, randrw
  double read_share = 0;  // 0 writes, 1 reads, between: a mix
  bool random = false;
};

// The run's settings.
struct Config {
  std::vector<std::string> dirs;
  std::vector<Job> jobs;
  std::uint64_t rwmixread = 50;  // percent, for rw and randrw
  std::uint64_t seed = 1;
  std::chrono::milliseconds duration{0};  // 0: --loops passes; else one time-based run per job
  std::uint64_t size = 0;
  std::uint32_t block_size = 0;
  std::uint32_t queue_depth = 0;
  std::uint64_t buffer_bytes = 0;  // 0: queue_depth * block_size
  std::uint32_t threads = 0;
  swap::IoEngineKind engine = swap::IoEngineKind::kAuto;
  std::uint32_t loops = 3;
  std::uint32_t repeat = 1;  // fresh benches (engine, buffers, files) run one after another
  bool verify = true;
  bool precondition = true;
  bool huge_pages = true;
  bool keep = false;
  bool json = false;
  bool json_lines = false;
  std::string dist = "auto";  // --dist: one directory per rank under mpirun
};

/// Parses and checks the command line (the scratch directory made where none is given).
/// Sets *help and returns a default Config when --help was given (and printed).
Config parse(const std::vector<std::string>& tokens, bool* help);

}  // namespace zinf::tools::bench_io
