// SPDX-License-Identifier: Apache-2.0
// What `zinf tune` writes about a setting: its name in the text, its JSON in the report, the
// config (--out) that selects it, and the figures of the sustained write run (--sustained).
#pragma once

#include <cstdint>
#include <string>

#include "io_bench.h"
#include "json_out.h"
#include "throughput.h"
#include "workload.h"

namespace zinf::tools::tune {

/// "uring 1M qd16", "threads 1M qd16 t16": a setting in one line of text.
std::string point_name(const Point& p);

/// A setting and its passes as the report's "sweep" entries.
Json point_json(const Point& p);

/// The config zinf's parse_config and DeepSpeed both read: DeepSpeed's "aio" keys with real
/// numbers and booleans, zinf's backend and O_DIRECT choice in its own section.
std::string config_json(const Point& p, bool direct);

/// What --sustained measured.
struct Sustained {
  std::uint64_t size = 0;  ///< bytes over all files
  double duration_s = 0;
  IoPassResult run;
  ThroughputProfile profile;
  double burst_gbps = 0;  ///< the chosen setting's write pass
  bool below_burst = false;
};

/// The report's "sustained" object.
Json sustained_json(const Sustained& s);

/// The line the text and the report give when the drive slows under sustained writes.
std::string below_burst_note(const Sustained& s);

}  // namespace zinf::tools::tune
