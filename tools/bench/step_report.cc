// SPDX-License-Identifier: Apache-2.0
// What both modes of `zinf bench step` report (step_report.h).
#include "step_report.h"

#include <cstdio>
#include <string>

#include "bench_common.h"

namespace zinf::tools {

Stages::Stages(const std::vector<optim::StepStats>& all) {
  std::vector<double> step_s, read_s, write_s, compute_s, wait_s;
  for (const auto& st : all) {
    step_s.push_back(st.seconds);
    read_s.push_back(st.read_seconds);
    write_s.push_back(st.write_seconds);
    compute_s.push_back(st.compute_seconds);
    wait_s.push_back(st.wait_seconds);
  }
  step = median(step_s);
  read = median(read_s);
  write = median(write_s);
  compute = median(compute_s);
  wait = median(wait_s);
  bytes_read = all.front().bytes_read;
  bytes_written = all.front().bytes_written;
}

void Stages::put(Json& j) const {
  j["read_seconds"] = read;
  j["write_seconds"] = write;
  j["compute_seconds"] = compute;
  j["wait_seconds"] = wait;
  j["bytes_read"] = bytes_read;
  j["bytes_written"] = bytes_written;
}

void Stages::print(const char* indent) const {
  auto gbps = [](std::uint64_t bytes, double s) {
    return s > 0 ? static_cast<double>(bytes) / s / 1e9 : 0.0;
  };
  const int width = 24 - static_cast<int>(std::string_view(indent).size());
  std::printf("%s%-*s %10.3f s   (%.2f GB/s over %.2f GB)\n", indent, width, "read busy", read,
              gbps(bytes_read, read), static_cast<double>(bytes_read) / 1e9);
  std::printf("%s%-*s %10.3f s   (%.2f GB/s over %.2f GB)\n", indent, width, "write busy", write,
              gbps(bytes_written, write), static_cast<double>(bytes_written) / 1e9);
  std::printf("%s%-*s %10.3f s\n", indent, width, "compute busy", compute);
}

// The --json fields that say what was run, for both modes.
Json setup_json(const optim::OptimizerOptions& o, std::uint64_t numel, std::string_view engine,
                std::uint64_t steps) {
  Json j;
  j["bench"] = "step";
  j["tier"] = std::string(optim::state_tier_name(o.tier));
  j["engine"] = std::string(engine);
  j["numel"] = numel;
  j["sub_group"] = o.sub_group_elements;
  j["depth"] = std::uint64_t{o.pipeline_depth};
  j["threads"] = std::uint64_t{o.adam.threads};
  j["checksums"] = o.swap_checksums;
  j["state_precision"] = std::string(adam::state_precision_name(o.state_precision));
  j["steps"] = steps;
  return j;
}

}  // namespace zinf::tools
