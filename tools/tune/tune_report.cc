// SPDX-License-Identifier: Apache-2.0
// What `zinf tune` writes about a setting (tune_report.h).
#include "tune_report.h"

#include <cstdio>
#include <utility>

#include "args.h"
#include "choice.h"
#include "zinf/swap/io_engine.h"

namespace zinf::tools::tune {

// "uring 1M qd16", "threads 1M qd16 t16": a setting in one line of text.
std::string point_name(const Point& p) {
  std::string s = std::string(swap::io_engine_kind_name(p.kind)) + " " + size_text(p.block) +
                  " qd" + std::to_string(p.depth);
  if (p.kind == swap::IoEngineKind::kThreads) s += " t" + std::to_string(p.threads);
  return s;
}

Json point_json(const Point& p) {
  Json j;
  j["backend"] = std::string(swap::io_engine_kind_name(p.kind));
  j["block_size"] = std::uint64_t{p.block};
  j["queue_depth"] = std::uint64_t{p.depth};
  j["threads"] = std::uint64_t{p.threads};
  j["mixed_gbps"] = p.score();
  j["spread_gbps"] = tune::measured(p.runs).spread_gbps;
  j["runs_gbps"] = p.runs;
  j["default"] = p.is_default;
  return j;
}

// The config zinf's parse_config and DeepSpeed both read: DeepSpeed's "aio" keys with real
// numbers and booleans, zinf's backend and O_DIRECT choice in its own section.
std::string config_json(const Point& p, bool direct) {
  const std::uint32_t intra = p.kind == swap::IoEngineKind::kThreads ? p.threads : 1;
  Json c;
  c["aio"]["block_size"] = p.block;
  c["aio"]["queue_depth"] = p.depth;
  c["aio"]["intra_op_parallelism"] = intra;
  c["aio"]["single_submit"] = false;
  c["aio"]["overlap_events"] = true;
  c["zinf"]["backend"] = std::string(swap::io_engine_kind_name(p.kind));
  c["zinf"]["direct_io"] = direct;
  return c.dump(2) + "\n";
}

Json sustained_json(const Sustained& s) {
  Json j;
  j["size_bytes"] = s.size;
  j["duration_s"] = s.duration_s;
  j["seconds"] = s.run.seconds;
  j["bytes_written"] = s.run.write_bytes;
  j["write_gbps"] = s.run.write_gbps();
  j["steady_write_gbps"] = s.profile.steady_gbps;
  j["noise_gbps"] = s.profile.noise_gbps;
  j["burst_write_gbps"] = s.burst_gbps;
  j["below_burst"] = s.below_burst;
  if (s.profile.cliff) {
    Json c;
    c["at_s"] = s.profile.cliff->at_s;
    c["bytes_before"] = s.profile.cliff->bytes_before;
    c["before_gbps"] = s.profile.cliff->before_gbps;
    c["after_gbps"] = s.profile.cliff->after_gbps;
    j["cliff"] = std::move(c);
  } else {
    j["cliff"] = nullptr;
  }
  if (!s.profile.note.empty()) j["cliff_note"] = s.profile.note;
  Json& samples = j["samples_gbps"] = Json::array();
  for (const auto& t : s.run.write_samples) samples.push_back(t.gbps());
  return j;
}

// The line the text and the report give when the drive slows under sustained writes.
std::string below_burst_note(const Sustained& s) {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "the steady write rate %.2f GB/s is below the burst figure %.2f GB/s: a long run "
                "writes at the steady rate (zinf plan --tune uses it)",
                s.profile.steady_gbps, s.burst_gbps);
  return buf;
}

}  // namespace zinf::tools::tune
