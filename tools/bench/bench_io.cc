// SPDX-License-Identifier: Apache-2.0
// `zinf bench io`: sequential read/write bandwidth of the swap path (File + IoEngine +
// BufferPool) on the user's directories, verified byte for byte, in the shape fio reports.
#include <sys/resource.h>

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

constexpr const char* kAbout =
    "Measures sequential O_DIRECT read and write bandwidth through zinf's I/O engine, with every\n"
    "byte read back verified (a mismatch is an error, exit status 1).";

constexpr const char* kFooter = R"(
Without --keep the data files have no name (O_TMPFILE, or a random name unlinked at once): they
vanish when zinf exits however it exits, a link planted in DIR is never followed, and runs in
one directory never share a file. SIGINT, SIGTERM and SIGHUP stop the run (exit status 128 +
the signal's number, e.g. 130 for SIGINT).

fio's and ds_io's names are read as zinf's: --bs, --iodepth, --directory/--folder, --io_size,
--rw read|write (zinf has no random or mixed mode: --rw randread, randwrite, rw are refused),
--read (ds_io). GB/s means 10^9 bytes per second.)";

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
  bool json_lines = false;
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
  double usr_s_per_gb = 0;  // CPU seconds of this process per 1e9 bytes moved (fio's usr/sys)
  double sys_s_per_gb = 0;
};

// User and system CPU seconds of the whole process so far.
std::pair<double, double> cpu_seconds() {
  struct rusage u {};
  ::getrusage(RUSAGE_SELF, &u);
  auto s = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) / 1e6;
  };
  return {s(u.ru_utime), s(u.ru_stime)};
}

// fio's --rw as zinf's --op: sequential reads or writes only.
std::vector<std::string> op_from_fio_rw(const std::string& rw) {
  if (rw == "read" || rw == "write") return {"--op=" + rw};
  throw UsageError("--rw " + rw +
                   ": zinf bench io measures sequential reads and writes only (no random or "
                   "mixed mode); use --op read, --op write or --op both");
}

Config parse(const std::vector<std::string>& tokens, bool* help) {
  Config c;
  std::uint64_t block_size = 1u << 20, queue_depth = 16, threads = 0, loops = 3;
  std::string engine = "auto", op = "both";
  bool no_verify = false, no_precondition = false, no_huge_pages = false;
  Cli cli("bench io", kAbout, kFooter);
  cli.texts("--dir", c.dirs, "DIR",
            "directory to test (repeatable: blocks are striped over the files)",
            "./zinf-scratch, created if missing");
  c.size = 1ull << 30;
  cli.size("--size", c.size, "total bytes over all files");
  cli.size("--block-size", block_size,
           "bytes per request; a multiple of the direct-I/O alignment (4096)");
  cli.count("--queue-depth", queue_depth, "requests kept in flight");
  cli.count("--threads", threads, "worker threads for --engine threads (0 = queue depth)", 0,
            UINT32_MAX);
  cli.text("--engine", engine, "KIND", "auto | uring | threads");
  cli.text("--op", op, "OP", "read | write | both");
  cli.count("--loops", loops, "timed passes per op; the median is reported");
  cli.flag("--no-verify", no_verify, "do not check the data (faster, not recommended)");
  cli.flag("--no-precondition", no_precondition,
           "time writes into fresh (fallocated) space instead of overwrites");
  cli.flag("--no-huge-pages", no_huge_pages, "do not ask for 2 MiB pages for the buffers");
  cli.size("--buffer-bytes", c.buffer_bytes,
           "pinned memory the requests rotate over; set it to a pipeline's buffer ring "
           "(e.g. bench step's pinned_bytes_peak) to measure the drive with that footprint",
           "queue depth x block size, as fio");
  cli.flag("--keep", c.keep,
           "keep the data files afterwards, under fresh names printed on stderr "
           "(zinf-bench-io-<pid>-<random>.dat); an interrupted run removes them");
  cli.flag("--json", c.json,
           "one JSON document on stdout instead of the table: {\"jobs\": [one per op], "
           "\"host\": {...}}, as fio's --output-format=json");
  cli.flag("--json-lines", c.json_lines,
           "one JSON object per op, one per line, each with the host fields (streaming)");
  cli.alias_value("--rw", op_from_fio_rw);
  cli.alias_switch("--read", {"--op=read"});  // ds_io's read switch
  cli.refuse("--numjobs",
             "--numjobs: zinf bench io runs one job; set --queue-depth (requests in flight) and, "
             "for --engine threads, --threads (worker threads)");
  cli.refuse("--runtime",
             "--runtime: zinf bench io has no time-based mode; it times --loops passes of --size "
             "bytes (raise --size for a longer pass)");
  *help = !cli.parse(tokens);
  if (*help) return c;
  c.block_size = to_u32(block_size, "--block-size");
  c.queue_depth = to_u32(queue_depth, "--queue-depth");
  c.threads = static_cast<std::uint32_t>(threads);
  c.engine = swap::parse_io_engine_kind(engine);
  if (op == "read") {
    c.do_write = false;
  } else if (op == "write") {
    c.do_read = false;
  } else if (op != "both") {
    throw UsageError("invalid --op '" + op + "': expected read, write or both");
  }
  c.loops = to_u32(loops, "--loops");
  c.verify = !no_verify;
  c.precondition = !no_precondition;
  c.huge_pages = !no_huge_pages;
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
  if (help) return 0;

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

  for (const auto& d : cfg.dirs) {
    const std::string t = fs_type_name(d);
    if (t == "tmpfs" || t == "overlayfs" || t == "nfs" || t == "fuse") {
      std::fprintf(stderr,
                   "zinf bench io: warning: %s is on %s: the figures are those of memory, a "
                   "container layer or a network, not of a drive\n",
                   d.c_str(), t.c_str());
    }
  }
  // Reads need data on disk, and steady-state writes need blocks written before (an optimizer
  // overwrites its state every step): one untimed pass lays the files out.
  const bool progress = !cfg.json && !cfg.json_lines;
  if (cfg.do_read || cfg.precondition) bench.write(progress, "precondition");

  std::vector<OpSummary> summaries;
  // The CPU time of every timed loop of an op, per byte moved, as fio reports usr/sys.
  auto timed = [&](const char* op, auto&& pass) {
    std::vector<IoPassResult> passes;
    const auto [u0, s0] = cpu_seconds();
    for (std::uint32_t l = 0; l < cfg.loops; ++l) passes.push_back(pass());
    const auto [u1, s1] = cpu_seconds();
    OpSummary s = summarize(op, passes, cfg.block_size);
    double moved = 0;
    for (const auto& p : passes) moved += static_cast<double>(p.bytes);
    s.usr_s_per_gb = (u1 - u0) / (moved / 1e9);
    s.sys_s_per_gb = (s1 - s0) / (moved / 1e9);
    summaries.push_back(s);
  };
  if (cfg.do_write) timed("write", [&] { return bench.write(progress, "write"); });
  if (cfg.do_read) timed("read", [&] { return bench.read(progress, "read"); });

  const std::string fs = fs_type_name(cfg.dirs[0]);
  if (cfg.json || cfg.json_lines) {
    // What the machine has, for reading figures later; this benchmark never touches a GPU.
    const cuda::CudaAvailability gpu = cuda::probe_cuda();
    const std::string gpu_text = gpu.available()
                                     ? std::to_string(gpu.device_count) + " CUDA device(s)"
                                     : "none (" + gpu.reason + ")";
    Json host;
    host["files"] = file_count;
    host["dirs"] = cfg.dirs;
    host["file_system"] = fs;
    host["kernel"] = kernel_release();
    host["cpu"] = cpu_model();
    host["gpu"] = gpu_text;
    Json jobs = Json::array();
    for (const auto& s : summaries) {
      Json j;
      j["op"] = s.op;
      // A timed write overwrites the blocks the precondition pass wrote (as an optimizer's
      // write-back does); a fresh-file write (fio's default) is slower on most drives.
      if (s.op == "write") j["overwrite"] = cfg.precondition;
      j["engine"] = std::string(bench.engine_name());
      j["bytes"] = s.bytes;
      j["seconds"] = s.seconds;
      j["gbps"] = s.gbps;
      j["iops"] = s.iops;
      j["lat_p50_us"] = s.lat_p50_us;
      j["lat_p99_us"] = s.lat_p99_us;
      j["usr_s_per_gb"] = s.usr_s_per_gb;
      j["sys_s_per_gb"] = s.sys_s_per_gb;
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
      if (cfg.json_lines) {
        for (const auto& [k, v] : host.items()) j[k] = v;
        std::printf("%s\n", json_text(j).c_str());
      }
      jobs.push_back(std::move(j));
    }
    if (cfg.json) {
      Json doc;
      doc["jobs"] = std::move(jobs);
      doc["host"] = std::move(host);
      std::printf("%s\n", json_text(doc).c_str());
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
    std::printf("%-17s %14s %10s %10s %10s %9s %9s   %s\n", "op", "GB/s (1e9B/s)", "IOPS",
                "p50 us", "p99 us", "usr s/GB", "sys s/GB", "GB/s per loop");
    for (const auto& s : summaries) {
      const std::string label =
          s.op == "write" && cfg.precondition ? "write (overwrite)" : s.op;
      std::printf("%-17s %14.2f %10.0f %10.0f %10.0f %9.3f %9.3f   %s\n", label.c_str(), s.gbps,
                  s.iops, s.lat_p50_us, s.lat_p99_us, s.usr_s_per_gb, s.sys_s_per_gb,
                  figures_text(s.gbps_per_loop).c_str());
    }
  }
  if (cfg.keep) {
    for (const auto& p : bench.keep_files())
      std::fprintf(stderr, "zinf bench io: kept %s\n", p.c_str());
  }
  return 0;
}

}  // namespace zinf::tools
