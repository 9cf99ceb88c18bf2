// SPDX-License-Identifier: Apache-2.0
// What both modes of `zinf bench step` report: the stage medians of the timed steps (Stages)
// and the --json fields that say what was run.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "json_out.h"
#include "zinf/optim/optimizer.h"

namespace zinf::tools {

// The median of each stage's busy time over the timed steps, and the bytes one step moves:
// the breakdown both the one-process run and the weak-scaling run report.
struct Stages {
  double step = 0;
  double read = 0;
  double write = 0;
  double compute = 0;
  double wait = 0;
  std::uint64_t bytes_read = 0;
  std::uint64_t bytes_written = 0;

  // `all`: at least one step's.
  explicit Stages(const std::vector<optim::StepStats>& all);

  // The stage medians as --json names them (step_seconds is the caller's: its step differs).
  void put(Json& j) const;

  // The table's read, write and compute rows, each label after `indent`.
  void print(const char* indent) const;
};

// The --json fields that say what was run, for both modes.
Json setup_json(const optim::OptimizerOptions& o, std::uint64_t numel, std::string_view engine,
                std::uint64_t steps);

}  // namespace zinf::tools
