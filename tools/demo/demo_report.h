// SPDX-License-Identifier: Apache-2.0
// What `zinf demo` says (rank 0): the lines before the first step, and the summary after the
// last (text, and with --json the JSON object on stdout), from what the training loop measured
// and every rank's own NVMe bytes.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "demo_options.h"
#include "zinf/dist/collectives.h"
#include "zinf/offload/config.h"
#include "zinf/offload/engine.h"

namespace zinf::tools::demo {

/// What the training loop measured.
struct TrainResult {
  std::vector<double> losses, step_times;
  // This rank's NVMe bytes (parameters and optimizer state) in each step.
  std::vector<std::uint64_t> step_bytes_read, step_bytes_written;
  double total_s = 0;
  offload::StepStats last_step;  // its collective byte counts are every step's
};

// The NVMe bytes (parameters and optimizer state) read and written since construction.
inline std::uint64_t nvme_bytes_read(const offload::EngineStats& st) {
  return st.param_bytes_read + st.optimizer_bytes_read;
}
inline std::uint64_t nvme_bytes_written(const offload::EngineStats& st) {
  return st.param_bytes_written + st.optimizer_bytes_written;
}

/// One rank's own NVMe bytes: in all (including a load and a save), and in the last step.
struct RankBytes {
  std::uint64_t read = 0, written = 0, step_read = 0, step_written = 0;
};

/// "nvme", or "cpu/nvme" when the parameters and the optimizer state live apart.
std::string offload_name(const offload::EngineConfig& config);

/// What a run says about itself before its first step (rank 0 only).
void print_header(std::FILE* out, const DemoOptions& o, const offload::EngineConfig& config,
                  const std::string& dir_used, std::size_t numel, std::size_t local_batch,
                  dist::Collectives& comm);

/// Every rank's RankBytes, in rank order (collective where there are several ranks).
std::vector<RankBytes> gather_rank_bytes(dist::Collectives& comm, const offload::EngineStats& st,
                                         const TrainResult& r);

/// The summary after training (rank 0): the text, and with --json the JSON object on stdout.
void report(std::FILE* out, const DemoOptions& o, const offload::EngineConfig& config,
            const std::string& dir_used, std::size_t numel, int ranks, const TrainResult& r,
            const offload::EngineStats& st, const std::vector<RankBytes>& per_rank,
            const std::string& sha);

}  // namespace zinf::tools::demo
