// SPDX-License-Identifier: Apache-2.0
// `zinf bench step --reference N`: the ideal the steps are judged by, measured around them.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "bench_common.h"
#include "io_bench.h"
#include "zinf/adam/compact_state.h"
#include "zinf/adam/cpu_adam.h"
#include "zinf/swap/io_engine.h"

namespace zinf::tools {

// The ideal steps are judged by, measured around them (--reference K): the drive's own rates
// from one write and one read pass of the state's size, and the Adam kernel alone on arrays in
// memory. Interleaving them with the steps puts each step within a few seconds of its
// references, which matters on shared virtual disks whose rate moves 2-3x from one minute to
// the next; the mean of the references before and after a block stands for the block.
class StepReference {
 public:
  // `dirs` empty: no drive reference (tier cpu). Lays the reference files out (one write
  // pass), so that the timed writes are overwrites, as the step's are.
  StepReference(const std::vector<std::string>& dirs, std::uint64_t state_bytes,
                const swap::IoOptions& io, std::size_t numel, const adam::CpuAdamOptions& adam,
                const adam::GradView& grads, const adam::CopyOut& out,
                adam::StatePrecision precision);

  struct Figures {
    double read_gbps = 0;  // 0 without I/O (tier cpu)
    double write_gbps = 0;
    double adam_seconds = 0;
    double ideal(std::uint64_t bytes_read, std::uint64_t bytes_written) const {
      double io = 0;
      if (read_gbps > 0) io += static_cast<double>(bytes_read) / (read_gbps * 1e9);
      if (write_gbps > 0) io += static_cast<double>(bytes_written) / (write_gbps * 1e9);
      return std::max(io, adam_seconds);
    }
  };

  // One write and one read pass of the drive reference, then one Adam step in memory.
  Figures measure(adam::AdamParams hp);

 private:
  std::size_t n_;
  adam::GradView grads_;
  adam::CopyOut out_;
  adam::CpuAdam adam_;
  adam::StatePrecision precision_;
  HostArray mem_;
  std::optional<IoBench> io_;
  std::uint64_t step_ = 0;
};

}  // namespace zinf::tools
