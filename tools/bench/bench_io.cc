// SPDX-License-Identifier: Apache-2.0
// `zinf bench io`: read/write bandwidth of the swap path (File + IoEngine + BufferPool) on the
// user's directories, sequential or random, reads, writes or a mix, timed passes or a
// time-based run with its throughput over time, verified byte for byte, in the shape fio
// reports.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "bench_common.h"
#include "bench_io_options.h"
#include "scratch.h"
#include "args.h"
#include "commands.h"
#include "io_bench.h"
#include "format.h"
#include "json_out.h"
#include "launch.h"
#include "over_time.h"
#include "throughput.h"
#include "zinf/common/error.h"
#include "zinf/dist/collectives.h"
#include "zinf/dist/rank_directory.h"
#include "zinf/cuda/device.h"
#include "zinf/swap/io_engine.h"

namespace zinf::tools {
namespace {

using bench_io::Config;
using bench_io::Job;

struct OpSummary {
  std::string op;  // "read" or "write": a mixed job has one of each
  const Job* job = nullptr;
  std::vector<double> gbps_per_loop;
  double seconds = 0;  // of the median loop
  std::uint64_t bytes = 0;
  double gbps = 0;
  double iops = 0;
  double lat_p50_us = 0;
  double lat_p99_us = 0;
  double usr_s_per_gb = 0;  // CPU seconds of this process per 1e9 bytes moved (fio's usr/sys)
  double sys_s_per_gb = 0;
  std::vector<ThroughputSample> samples;  // time-based runs
  ThroughputProfile profile;
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

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  std::size_t idx = static_cast<std::size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(idx, v.size() - 1)];
}

// One direction ("read" or "write") of a job's runs.
OpSummary summarize(const std::string& op, const Job& job, const std::vector<IoPassResult>& passes,
                    std::uint32_t block_size) {
  const bool read = op == "read";
  OpSummary s;
  s.op = op;
  s.job = &job;
  std::vector<double> lat;
  for (const auto& p : passes) {
    s.gbps_per_loop.push_back(read ? p.read_gbps() : p.write_gbps());
    const auto& l = read ? p.read_latencies_us : p.write_latencies_us;
    lat.insert(lat.end(), l.begin(), l.end());
  }
  // The median loop by bandwidth stands for the op (loops are few and noisy here).
  const IoPassResult& mid = passes[median_index(s.gbps_per_loop)];
  s.seconds = mid.seconds;
  s.bytes = read ? mid.read_bytes : mid.write_bytes;
  s.gbps = read ? mid.read_gbps() : mid.write_gbps();
  s.iops = static_cast<double>(s.bytes / block_size) / mid.seconds;
  s.lat_p50_us = percentile(lat, 0.50);
  s.lat_p99_us = percentile(lat, 0.99);
  s.samples = read ? mid.read_samples : mid.write_samples;
  if (!s.samples.empty()) s.profile = analyze_throughput(s.samples);
  return s;
}

// A job's name in the table: the op, and how it ran when not plainly sequential.
std::string op_label(const OpSummary& s, bool precondition) {
  const Job& j = *s.job;
  if (j.read_share > 0 && j.read_share < 1) return s.op + " (" + j.rw + ")";
  if (j.random) return j.rw;
  return s.op == "write" && precondition ? "write (overwrite)" : s.op;
}

// One bench from its construction to its results: a fresh engine, buffer pool and files.
struct RunOutcome {
  std::vector<OpSummary> summaries;
  std::string engine;
  std::uint32_t threads = 0;
  bool direct = false;
  bool huge_pages = false;
  bool registered = false;
  std::size_t file_count = 0;
  std::uint64_t file_size = 0;
};

// `run` counts from 1 of `runs` (--repeat), for the progress labels.
RunOutcome run_once(const Config& cfg, const IoBenchOptions& bo, bool progress, std::uint32_t run,
                    std::uint32_t runs) {
  IoBench bench(bo);
  const std::string of_runs =
      runs > 1 ? " (run " + std::to_string(run) + "/" + std::to_string(runs) + ")" : "";
  // Reads need data on disk, and steady-state writes need blocks written before (an optimizer
  // overwrites its state every step): one untimed pass lays the files out.
  const bool any_read =
      std::any_of(cfg.jobs.begin(), cfg.jobs.end(), [](const Job& j) { return j.read_share > 0; });
  if (any_read || cfg.precondition) {
    bench.write(progress, ("zinf bench io precondition" + of_runs).c_str());
  }
  RunOutcome out;
  // Each job's loops (or its one time-based run); the CPU time of them all per byte moved, as
  // fio reports usr/sys (a mixed job's two directions share theirs).
  for (const Job& job : cfg.jobs) {
    IoRunSpec spec;
    spec.read_share = job.read_share;
    spec.random = job.random;
    spec.seed = cfg.seed;
    spec.duration = cfg.duration;
    std::vector<IoPassResult> passes;
    const auto [u0, s0] = cpu_seconds();
    for (std::uint32_t l = 0; l < cfg.loops; ++l) {
      std::string label = "zinf bench io " + job.rw;
      if (cfg.loops > 1) label += " " + std::to_string(l + 1) + "/" + std::to_string(cfg.loops);
      passes.push_back(bench.run(spec, progress, (label + of_runs).c_str()));
    }
    const auto [u1, s1] = cpu_seconds();
    double moved = 0;
    for (const auto& p : passes) moved += static_cast<double>(p.bytes);
    for (const char* op : {"write", "read"}) {
      const bool read = op[0] == 'r';
      if (read ? job.read_share == 0 : job.read_share == 1) continue;
      OpSummary s = summarize(op, job, passes, cfg.block_size);
      s.usr_s_per_gb = moved > 0 ? (u1 - u0) / (moved / 1e9) : 0;
      s.sys_s_per_gb = moved > 0 ? (s1 - s0) / (moved / 1e9) : 0;
      out.summaries.push_back(std::move(s));
    }
  }
  out.engine = std::string(bench.engine_name());
  out.threads = bench.engine_threads();
  out.direct = bench.direct();
  out.huge_pages = bench.huge_pages();
  out.registered = bench.registered_buffers();
  out.file_count = bench.file_count();
  out.file_size = bench.file_size();
  if (cfg.keep) {
    for (const auto& p : bench.keep_files())
      std::fprintf(stderr, "zinf bench io: kept %s\n", p.c_str());
  }
  return out;
}

// One op over the --repeat runs: each run's rate (its median loop) and the run that stands for
// them (the median one), whose latencies and CPU figures the report shows.
struct Spread {
  std::vector<double> gbps_runs;
  std::size_t median_run = 0;
  double min = 0;
  double max = 0;
};

Spread spread_of(const std::vector<RunOutcome>& runs, std::size_t op_index) {
  Spread s;
  for (const auto& r : runs) s.gbps_runs.push_back(r.summaries[op_index].gbps);
  s.median_run = median_index(s.gbps_runs);
  s.min = *std::min_element(s.gbps_runs.begin(), s.gbps_runs.end());
  s.max = *std::max_element(s.gbps_runs.begin(), s.gbps_runs.end());
  return s;
}

// Under mpirun: every rank runs the passes on its own rank<R> folders. Each op is measured
// twice: rank 0 alone (the others wait at a barrier), then every rank at once (each loop
// starting from a barrier); a loop's aggregate is every rank's bytes over the slowest rank's
// time, and the scaling efficiency the aggregate over N times rank 0's rate alone.
int run_distributed(const Config& cfg, IoBench& bench, dist::Collectives& comm) {
  const int n = comm.size();
  const bool leader = comm.rank() == 0;
  Json ops = Json::array();
  if (leader && !cfg.json) {
    std::printf(
        "zinf bench io: %d ranks (%s), engine=%.*s, %.2f GiB per rank in rank<R> folders, "
        "block=%u KiB qd=%u, %u loops (median)\n",
        n, std::string(comm.name()).c_str(), static_cast<int>(bench.engine_name().size()),
        bench.engine_name().data(),
        static_cast<double>(bench.file_size() * bench.file_count()) / (1u << 30),
        cfg.block_size / 1024, cfg.queue_depth, cfg.loops);
  }
  for (const Job& job : cfg.jobs) {
    IoRunSpec spec;
    spec.read_share = job.read_share;
    spec.random = job.random;
    spec.seed = cfg.seed;
    for (const char* op : {"write", "read"}) {
      const bool read = op[0] == 'r';
      if (read ? job.read_share == 0 : job.read_share == 1) continue;
      auto rate = [read](const IoPassResult& p) { return read ? p.read_gbps() : p.write_gbps(); };
      std::vector<double> alone, mine, aggregate;
      comm.barrier();
      if (leader) {
        for (std::uint32_t l = 0; l < cfg.loops; ++l)
          alone.push_back(rate(bench.run(spec, false, "")));
      }
      comm.barrier();
      for (std::uint32_t l = 0; l < cfg.loops; ++l) {
        comm.barrier();
        const IoPassResult p = bench.run(spec, false, "");
        // [bytes of this direction, seconds]: every rank's, in rank order.
        const double moved = rate(p) * p.seconds * 1e9;
        std::vector<double> all(2 * static_cast<std::size_t>(n));
        const double pair[2] = {moved, p.seconds};
        dist::all_gather<double>(comm, std::span<const double>(pair, 2), all);
        double bytes = 0, slowest = 0;
        for (int r = 0; r < n; ++r) {
          bytes += all[2 * r];
          slowest = std::max(slowest, all[2 * r + 1]);
        }
        mine.push_back(rate(p));
        aggregate.push_back(slowest > 0 ? bytes / slowest / 1e9 : 0);
      }
      // Every rank's median rate, gathered for the report.
      const double my_median = median(mine);
      std::vector<double> per_rank(static_cast<std::size_t>(n));
      dist::all_gather<double>(comm, std::span<const double>(&my_median, 1), per_rank);
      if (!leader) continue;
      const double alone_gbps = median(alone);
      const double agg = median(aggregate);
      const double efficiency = alone_gbps > 0 ? agg / (n * alone_gbps) : 0;
      const std::string label = job.rw == op ? job.rw : job.rw + " " + op;
      if (cfg.json) {
        Json j;
        j["op"] = op;
        j["rw"] = job.rw;
        j["ranks"] = n;
        j["alone_gbps"] = alone_gbps;
        j["per_rank_gbps"] = per_rank;
        j["aggregate_gbps"] = agg;
        j["scaling_efficiency"] = efficiency;
        ops.push_back(std::move(j));
      } else {
        std::string ranks;
        for (int r = 0; r < n; ++r) {
          char cell[32];
          std::snprintf(cell, sizeof cell, "%s%.2f", r == 0 ? "" : " ", per_rank[r]);
          ranks += cell;
        }
        std::printf(
            "%-10s rank 0 alone %6.2f GB/s | together: per rank %s GB/s, aggregate %.2f "
            "GB/s, efficiency %.0f%% (aggregate / %d x alone)\n",
            label.c_str(), alone_gbps, ranks.c_str(), agg, 100 * efficiency, n);
      }
    }
  }
  if (leader && cfg.json) {
    Json doc;
    doc["ranks"] = n;
    doc["dirs"] = cfg.dirs;
    doc["jobs"] = std::move(ops);
    std::printf("%s\n", json_text(doc).c_str());
  }
  return 0;
}

// The ops' figures of every run: each op's figures from its median run, and the spread.
struct Figures {
  std::vector<Spread> spreads;
  std::vector<const OpSummary*> summaries;
};

// --json and --json-lines: one object per op with the host fields (--json-lines: each on its
// own line as it is made; --json: one document at the end).
void report_json(const Config& cfg, const RunOutcome& first, const Figures& f,
                 const std::string& fs) {
  const std::vector<Spread>& spreads = f.spreads;
  const std::vector<const OpSummary*>& summaries = f.summaries;
  // What the machine has, for reading figures later; this benchmark never touches a GPU.
  const cuda::CudaAvailability gpu = cuda::probe_cuda();
  const std::string gpu_text = gpu.available()
                                   ? std::to_string(gpu.device_count) + " CUDA device(s)"
                                   : "none (" + gpu.reason + ")";
  Json host;
  host["files"] = first.file_count;
  host["dirs"] = cfg.dirs;
  host["file_system"] = fs;
  host["kernel"] = kernel_release();
  host["cpu"] = cpu_model();
  host["gpu"] = gpu_text;
  Json jobs = Json::array();
  for (std::size_t i = 0; i < summaries.size(); ++i) {
    const OpSummary& s = *summaries[i];
    Json j;
    j["op"] = s.op;
    // A timed write overwrites the blocks the precondition pass wrote (as an optimizer's
    // write-back does); a fresh-file write (fio's default) is slower on most drives.
    if (s.op == "write") j["overwrite"] = cfg.precondition;
    j["rw"] = s.job->rw;
    j["random"] = s.job->random;
    const bool mixed = s.job->read_share > 0 && s.job->read_share < 1;
    if (mixed) j["rwmixread"] = cfg.rwmixread;
    if (mixed || s.job->random) j["seed"] = cfg.seed;
    j["engine"] = first.engine;
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
    j["threads"] = std::uint64_t{first.threads};
    j["direct"] = first.direct;
    j["huge_pages"] = first.huge_pages;
    j["registered_buffers"] = first.registered;
    j["verified"] = s.op == "read" ? cfg.verify : false;
    j["precondition"] = cfg.precondition;
    j["loops"] = std::uint64_t{cfg.loops};
    j["gbps_loops"] = s.gbps_per_loop;
    if (cfg.repeat > 1) {
      j["repeat"] = std::uint64_t{cfg.repeat};
      j["gbps_runs"] = spreads[i].gbps_runs;
      j["gbps_min"] = spreads[i].min;
      j["gbps_max"] = spreads[i].max;
    }
    if (cfg.duration.count() > 0) {
      j["duration_s"] = std::chrono::duration<double>(cfg.duration).count();
      add_over_time(j, s.samples, s.profile);
    }
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
}

// The table, the spread over --repeat runs and the time-based runs' throughput over time.
void report_text(const Config& cfg, const RunOutcome& first, const Figures& f,
                 const std::string& fs) {
  const std::vector<Spread>& spreads = f.spreads;
  const std::vector<const OpSummary*>& summaries = f.summaries;
  // How it ran, when not the default passes: the time and the seed that redraws the run.
  std::string how;
  if (cfg.duration.count() > 0) how += " duration=" + duration_text(cfg.duration);
  for (const Job& j : cfg.jobs) {
    if (j.random || (j.read_share > 0 && j.read_share < 1)) {
      how += " rw=" + j.rw + " seed=" + std::to_string(cfg.seed);
      if (j.read_share > 0 && j.read_share < 1)
        how += " rwmixread=" + std::to_string(cfg.rwmixread);
    }
  }
  if (cfg.repeat > 1) how += " repeat=" + std::to_string(cfg.repeat);
  std::printf(
      "zinf bench io: engine=%s files=%zu size=%.2f GiB block=%u KiB qd=%u direct=%s "
      "huge_pages=%s registered=%s fs=%s verify=%s%s\n",
      first.engine.c_str(), first.file_count,
      static_cast<double>(first.file_size * first.file_count) / (1u << 30), cfg.block_size / 1024,
      cfg.queue_depth, first.direct ? "yes" : "no", first.huge_pages ? "yes" : "no",
      first.registered ? "yes" : "no", fs.c_str(), cfg.verify ? "every byte" : "off", how.c_str());
  std::printf("%-17s %14s %10s %10s %10s %9s %9s   %s\n", "op", "GB/s (1e9B/s)", "IOPS", "p50 us",
              "p99 us", "usr s/GB", "sys s/GB", "GB/s per loop");
  for (const OpSummary* s : summaries) {
    std::printf("%-17s %14.2f %10.0f %10.0f %10.0f %9.3f %9.3f   %s\n",
                op_label(*s, cfg.precondition).c_str(), s->gbps, s->iops, s->lat_p50_us,
                s->lat_p99_us, s->usr_s_per_gb, s->sys_s_per_gb,
                figures_text(s->gbps_per_loop).c_str());
  }
  if (cfg.repeat > 1) {
    // The spread over fresh engines: a process that lands in a slow mode shows up here,
    // where a median alone would hide it.
    std::printf(
        "over %u runs (fresh engine, buffers and files each; the rows above are the "
        "median run's):\n",
        cfg.repeat);
    for (std::size_t i = 0; i < summaries.size(); ++i) {
      std::printf("  %-15s min %.2f  median %.2f  max %.2f GB/s   runs: %s\n",
                  op_label(*summaries[i], cfg.precondition).c_str(), spreads[i].min,
                  summaries[i]->gbps, spreads[i].max, figures_text(spreads[i].gbps_runs).c_str());
    }
  }
  for (const OpSummary* s : summaries) {
    std::printf(
        "%s",
        over_time_text(op_label(*s, cfg.precondition), s->samples, s->profile, "1 s").c_str());
  }
}

// The settings of every bench the run makes.
IoBenchOptions io_bench_options(const Config& cfg) {
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
  return bo;
}

// Figures of memory, a container layer or a network say nothing about a drive.
void warn_not_a_drive(const std::vector<std::string>& dirs) {
  for (const auto& d : dirs) {
    const std::string t = fs_type_name(d);
    if (t == "tmpfs" || t == "overlayfs" || t == "nfs" || t == "fuse") {
      std::fprintf(stderr,
                   "zinf bench io: warning: %s is on %s: the figures are those of memory, a "
                   "container layer or a network, not of a drive\n",
                   d.c_str(), t.c_str());
    }
  }
}

}  // namespace

int bench_io_main(const std::vector<std::string>& tokens) {
  bool help = false;
  Config cfg = bench_io::parse(tokens, &help);
  if (help) return 0;
  DistJob ranks(parse_dist_mode(cfg.dist), std::chrono::minutes(10));
  // Under mpirun each rank's <dir>/rank<R>, removed again at the end (declared before the
  // bench, so it goes after the bench's files): the run leaves nothing it made.
  dist::RankFolders rank_folders;
  if (ranks.size() > 1) {
    if (cfg.duration.count() > 0 || cfg.keep || cfg.json_lines || cfg.repeat > 1) {
      throw UsageError(
          "under mpirun bench io runs --loops passes with a table or --json; "
          "--duration, --keep, --json-lines and --repeat are for one process");
    }
    for (auto& d : cfg.dirs) d = rank_folders.add(d, ranks.rank());
  }

  const IoBenchOptions bo = io_bench_options(cfg);
  if (ranks.size() > 1) {
    IoBench bench(bo);
    const bool progress = ranks.rank() == 0 && !cfg.json;
    bench.write(progress, "zinf bench io precondition");
    return run_distributed(cfg, bench, ranks.comm());
  }

  warn_not_a_drive(cfg.dirs);
  const bool progress = !cfg.json && !cfg.json_lines;
  std::vector<RunOutcome> runs;
  for (std::uint32_t r = 1; r <= cfg.repeat; ++r)
    runs.push_back(run_once(cfg, bo, progress, r, cfg.repeat));
  // The ops are the same in every run; each op's figures come from its median run.
  Figures f;
  for (std::size_t i = 0; i < runs[0].summaries.size(); ++i) {
    f.spreads.push_back(spread_of(runs, i));
    f.summaries.push_back(&runs[f.spreads.back().median_run].summaries[i]);
  }
  const std::string fs = fs_type_name(cfg.dirs[0]);
  if (cfg.json || cfg.json_lines) {
    report_json(cfg, runs[0], f, fs);
  } else {
    report_text(cfg, runs[0], f, fs);
  }
  return 0;
}

}  // namespace zinf::tools
