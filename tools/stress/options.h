// SPDX-License-Identifier: Apache-2.0
// What `zinf stress` is asked to do: its options, parsed by stress.cc.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "zinf/swap/io_engine.h"

namespace zinf::tools::stress {

// Self-test, deliberately left out of --help (docs/stress.md): `--plant-corruption` flips
// bytes of a tensor in its swap file behind the store's back; the run must then fail.

struct StressOptions {
  std::vector<std::string> dirs;
  std::chrono::milliseconds duration{10000};
  double fault_rate = 0;
  std::uint64_t seed = 1;
  std::uint64_t budget = 64ull << 20;
  std::uint64_t workers = 2;
  bool checksums = false;  // explicit off (the library's default is on): see --help
  bool plant = false;
  swap::IoEngineKind engine = swap::IoEngineKind::kAuto;
  bool json = false;
  /// "host" (the simulation) or "cuda" (the first GPU): where the prefetch worker's layers and
  /// the optimizer worker's gradients go.
  std::string device = "host";
  /// Device memory for both (the prefetch window and the gradients); 0: the prefetch worker's
  /// pinned share, as before --gpu-mem existed. On host it is also the simulated GPU's size.
  std::uint64_t gpu_mem = 0;
  /// Length of one sample of the verified rate over time; parse() turns "not given" (0) into
  /// 1 s, or --duration where that is shorter.
  std::chrono::milliseconds interval{0};
};

}  // namespace zinf::tools::stress
