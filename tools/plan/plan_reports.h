// SPDX-License-Identifier: Apache-2.0
// The reports `zinf plan` reads from the other commands: `zinf tune --report` (drive rates,
// --tune) and `zinf bench h2d --json` (link rates, --h2d). Each is at most 1 MiB of a regular
// file; anything else, or JSON without the fields, is a UsageError naming the file.
#pragma once

#include <string>

#include "plan_model.h"

namespace zinf::tools {

/// The chosen setting's read, write and mixed GB/s of a `zinf tune` report, and the steady
/// write rate of its --sustained run where it ran.
DriveBandwidth read_tune_report(const std::string& path);

/// `zinf bench h2d --json`'s pinned rates at its largest size (small copies pay the per-copy
/// cost; a layer's fetch is large) into in.h2d_gbps and in.d2h_gbps. Sets `simulated` when the
/// figures are the host simulation's.
void read_h2d_report(const std::string& path, PlanInput& in, bool& simulated);

}  // namespace zinf::tools
