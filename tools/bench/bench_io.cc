// SPDX-License-Identifier: Apache-2.0
// `zinf bench io`: sequential read/write bandwidth of the swap path (File + IoEngine +
// BufferPool) on the user's directories, verified byte for byte, in the shape fio reports.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "bench_common.h"
#include "scratch.h"
#include "args.h"
#include "commands.h"
#include "io_bench.h"
#include "format.h"
#include "json_out.h"
#include "zinf/common/error.h"
#include "zinf/cuda/device.h"
#include "zinf/swap/io_engine.h"

namespace zinf::tools {
namespace {

constexpr const char* kHelp = R"(usage: zinf bench io [options]

Measures sequential O_DIRECT read and write bandwidth through zinf's I/O engine, with every byte
read back verified (a mismatch is an error, exit status 1).

  --dir DIR            directory to test (repeatable: blocks are striped over the files)
                       [default: ./zinf-scratch, created if missing]
  --size N             total bytes over all files [1G]; K/M/G/T = 1024^n, kB/MB/GB = 1000^n
  --block-size N       bytes per request [1M]; a multiple of the direct-I/O alignment
  --queue-depth N      requests kept in flight [16]
  --threads N          worker threads for --engine threads [0 = queue depth]
  --engine KIND        auto | uring | threads [auto]
  --op OP              read | write | both [both]
  --loops N            timed passes per op; the median is reported [3]
  --no-verify          do not check the data (faster, not recommended)
  --no-precondition    time writes into fresh (fallocated) space instead of overwrites
  --no-huge-pages      do not ask for 2 MiB pages for the buffers
  --buffer-bytes N     pinned memory the requests rotate over [queue depth x block size, as
                       fio]; set it to a pipeline's buffer ring (e.g. bench step's
                       pinned_bytes_peak) to measure the drive with that footprint
  --keep               keep the data files afterwards, under fresh names printed on stderr
                       (zinf-bench-io-<pid>-<random>.dat); an interrupted run removes them

Without --keep the data files have no name (O_TMPFILE, or a random name unlinked at once): they
vanish when zinf exits however it exits, a link planted in DIR is never followed, and runs in
one directory never share a file. SIGINT, SIGTERM and SIGHUP stop the run (exit status 128 +
the signal's number, e.g. 130 for SIGINT).
  --json               one JSON object per op on stdout instead of the table

GB/s means 10^9 bytes per second.
)";

struct Config {
  std::vector<std::string> dirs;
  std::uint64_t size = 0;
  std::uint32_t block_size = 0;
  std::uint32_t queue_depth = 0;
  std::uint64_t buffer_bytes = 0;  // 0: queue_depth * block_size
  std::uint32_t threads = 0;
  swap::IoEngineKind engine = swap::IoEngineKind::kAuto;
  bool do_read = true;
  bool do_write = true;
  std::uint32_t loops = 3;
  bool verify = true;
  bool precondition = true;
  bool huge_pages = true;
  bool keep = false;
  bool json = false;
};

struct OpSummary {
  std::string op;
  std::vector<double> gbps_per_loop;
  double seconds = 0;  // of the median loop
  std::uint64_t bytes = 0;
  double gbps = 0;
  double iops = 0;
  double lat_p50_us = 0;
  double lat_p99_us = 0;
};

Config parse(const std::vector<std::string>& tokens, bool* help) {
  Args a("bench io", tokens);
  Config c;
  *help = a.help();
  c.dirs = a.strings("dir");
  c.size = a.size("size", 1ull << 30);
  c.block_size = to_u32(a.size("block-size", 1u << 20), "--block-size");
  c.queue_depth = to_u32(a.uint("queue-depth", 16), "--queue-depth");
  c.threads = static_cast<std::uint32_t>(a.uint("threads", 0, 0, UINT32_MAX));
  c.engine = swap::parse_io_engine_kind(a.string("engine", "auto"));
  std::string op = a.string("op", "both");
  if (op == "read") {
    c.do_write = false;
  } else if (op == "write") {
    c.do_read = false;
  } else if (op != "both") {
    throw UsageError("invalid --op '" + op + "': expected read, write or both");
  }
  c.loops = to_u32(a.uint("loops", 3), "--loops");
  c.verify = !a.flag("no-verify");
  c.precondition = !a.flag("no-precondition");
  c.huge_pages = !a.flag("no-huge-pages");
  c.buffer_bytes = a.size("buffer-bytes", 0);
  c.keep = a.flag("keep");
  c.json = a.flag("json");
  a.finish();
  if (*help) return c;
  check_scratch_dirs(c.dirs);
  if (c.block_size % 4096 != 0) {
    throw UsageError("invalid --block-size " + std::to_string(c.block_size) +
                     ": must be a multiple of 4096 (the direct-I/O alignment zinf uses)");
  }
  const std::uint64_t window = std::uint64_t{c.queue_depth} * c.block_size;
  if (c.buffer_bytes == 0) c.buffer_bytes = window;
  if (c.buffer_bytes < window || c.buffer_bytes % c.block_size != 0) {
    throw UsageError(
        "invalid --buffer-bytes " + std::to_string(c.buffer_bytes) +
        ": must be a multiple of --block-size and at least queue depth x block size (" +
        std::to_string(window) + ")");
  }
  return c;  // IoBench checks the size against one block per file
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  std::size_t idx = static_cast<std::size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(idx, v.size() - 1)];
}

OpSummary summarize(const std::string& op, const std::vector<IoPassResult>& passes,
                    std::uint32_t block_size) {
  OpSummary s;
  s.op = op;
  std::vector<double> lat;
  for (const auto& p : passes) {
    s.gbps_per_loop.push_back(static_cast<double>(p.bytes) / p.seconds / 1e9);
    lat.insert(lat.end(), p.latencies_us.begin(), p.latencies_us.end());
  }
  // The median loop by bandwidth stands for the op (loops are few and noisy here).
  const IoPassResult& mid = passes[median_index(s.gbps_per_loop)];
  s.seconds = mid.seconds;
  s.bytes = mid.bytes;
  s.gbps = static_cast<double>(mid.bytes) / mid.seconds / 1e9;
  s.iops = static_cast<double>(mid.bytes / block_size) / mid.seconds;
  s.lat_p50_us = percentile(lat, 0.50);
  s.lat_p99_us = percentile(lat, 0.99);
  return s;
}

}  // namespace

int bench_io_main(const std::vector<std::string>& tokens) {
  bool help = false;
  Config cfg = parse(tokens, &help);
  if (help) {
    std::fputs(kHelp, stdout);
    return 0;
  }

  IoBenchOptions bo;
  bo.dirs = cfg.dirs;
  bo.size = cfg.size;
  bo.io.kind = cfg.engine;
  bo.io.block_size = cfg.block_size;
  bo.io.queue_depth = cfg.queue_depth;
  bo.io.threads = cfg.threads;
  bo.buffer_bytes = cfg.buffer_bytes;
  bo.huge_pages = cfg.huge_pages;
  bo.verify = cfg.verify;
  bo.keep = cfg.keep;
  IoBench bench(bo);
  const auto file_count = static_cast<std::uint64_t>(bench.file_count());
  const std::uint64_t file_size = bench.file_size();

  // Reads need data on disk, and steady-state writes need blocks written before (an optimizer
  // overwrites its state every step): one untimed pass lays the files out.
  if (cfg.do_read || cfg.precondition) bench.write(!cfg.json, "precondition");

  std::vector<OpSummary> summaries;
  if (cfg.do_write) {
    std::vector<IoPassResult> passes;
    for (std::uint32_t l = 0; l < cfg.loops; ++l) passes.push_back(bench.write(!cfg.json, "write"));
    summaries.push_back(summarize("write", passes, cfg.block_size));
  }
  if (cfg.do_read) {
    std::vector<IoPassResult> passes;
    for (std::uint32_t l = 0; l < cfg.loops; ++l) passes.push_back(bench.read(!cfg.json, "read"));
    summaries.push_back(summarize("read", passes, cfg.block_size));
  }

  const std::string fs = fs_type_name(cfg.dirs[0]);
  if (cfg.json) {
    // What the machine has, for reading figures later; this benchmark never touches a GPU.
    const cuda::CudaAvailability gpu = cuda::probe_cuda();
    const std::string gpu_text = gpu.available()
                                     ? std::to_string(gpu.device_count) + " CUDA device(s)"
                                     : "none (" + gpu.reason + ")";
    for (const auto& s : summaries) {
      Json j;
      j["op"] = s.op;
      j["engine"] = std::string(bench.engine_name());
      j["bytes"] = s.bytes;
      j["seconds"] = s.seconds;
      j["gbps"] = s.gbps;
      j["iops"] = s.iops;
      j["lat_p50_us"] = s.lat_p50_us;
      j["lat_p99_us"] = s.lat_p99_us;
      j["block_size"] = std::uint64_t{cfg.block_size};
      j["queue_depth"] = std::uint64_t{cfg.queue_depth};
      j["buffer_bytes"] = cfg.buffer_bytes;
      j["threads"] = std::uint64_t{bench.engine_threads()};
      j["direct"] = bench.direct();
      j["huge_pages"] = bench.huge_pages();
      j["registered_buffers"] = bench.registered_buffers();
      j["verified"] = s.op == "read" ? cfg.verify : false;
      j["precondition"] = cfg.precondition;
      j["loops"] = std::uint64_t{cfg.loops};
      j["gbps_loops"] = s.gbps_per_loop;
      j["files"] = file_count;
      j["dirs"] = cfg.dirs;
      j["file_system"] = fs;
      j["kernel"] = kernel_release();
      j["cpu"] = cpu_model();
      j["gpu"] = gpu_text;
      std::printf("%s\n", json_text(j).c_str());
    }
  } else {
    std::printf(
        "zinf bench io: engine=%.*s files=%zu size=%.2f GiB block=%u KiB qd=%u direct=%s "
        "huge_pages=%s registered=%s fs=%s verify=%s\n",
        static_cast<int>(bench.engine_name().size()), bench.engine_name().data(),
        bench.file_count(), static_cast<double>(file_size * file_count) / (1u << 30),
        cfg.block_size / 1024, cfg.queue_depth, bench.direct() ? "yes" : "no",
        bench.huge_pages() ? "yes" : "no", bench.registered_buffers() ? "yes" : "no", fs.c_str(),
        cfg.verify ? "every byte" : "off");
    std::printf("%-6s %14s %10s %10s %10s   %s\n", "op", "GB/s (1e9B/s)", "IOPS", "p50 us",
                "p99 us", "GB/s per loop");
    for (const auto& s : summaries) {
      std::printf("%-6s %14.2f %10.0f %10.0f %10.0f   %s\n", s.op.c_str(), s.gbps, s.iops,
                  s.lat_p50_us, s.lat_p99_us, figures_text(s.gbps_per_loop).c_str());
    }
  }
  if (cfg.keep) {
    for (const auto& p : bench.keep_files())
      std::fprintf(stderr, "zinf bench io: kept %s\n", p.c_str());
  }
  return 0;
}

}  // namespace zinf::tools
