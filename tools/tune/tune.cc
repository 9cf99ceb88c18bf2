// SPDX-License-Identifier: Apache-2.0
// `zinf tune`: checks the setup (O_DIRECT, memlock, io_uring, huge pages, free space), then
// sweeps backend x block size x queue depth (x threads) on the user's directories with the
// optimizer step's I/O pattern, and writes the winner as a zinf config with a DeepSpeed "aio"
// block (--out) and the figures behind it (--report, read by `zinf plan --tune`). With
// --sustained it then writes for a while with the winner (bench io's time-based run) for the
// drive's steady write rate, which a consumer drive's write cache hides from short passes.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "bench_common.h"
#include "choice.h"
#include "grid.h"
#include "progress.h"
#include "scratch.h"
#include "args.h"
#include "commands.h"
#include "interrupt.h"
#include "format.h"
#include "io_bench.h"
#include "json_out.h"
#include "throughput.h"
#include "tune_checks.h"
#include "workload.h"
#include "zinf/common/error.h"
#include "zinf/swap/dir.h"
#include "zinf/swap/io_engine.h"

namespace zinf::tools {
namespace {

using tune::Point;
using tune::Workload;

using Clock = tune::Clock;

constexpr const char* kAbout = R"(
Checks the setup, then measures which I/O settings move the optimizer step's traffic fastest on
these directories (reads of sub-group i+1 interleaved with writes of sub-group i-1, equal bytes,
every byte verified), and writes them as a config zinf and DeepSpeed accept.)";

constexpr const char* kFooter = R"(
zinf's default setting (uring, else threads with 16 workers; 1M; queue depth 16) is always
measured. A setting replaces it only if its median beats the default's by more than the larger
of the two spreads (max - min of each one's passes): the output says which, with the three
best, and ends with the block-size x queue-depth grid of each backend (--plot draws it).

--sustained then writes over --size bytes (one file per DIR, striped) for --sustained-time with
the chosen setting, sampling the rate every second as `zinf bench io --runtime` does: the
steady state (median of the last third) and, if the rate fell by more than its noise, where.
The first lap writes freshly allocated space, later laps overwrite it (as the optimizer's
first step and the later ones do). Where the steady rate is below the burst write figure the
text and the report say so.

--out and --report are written whole to a temporary file that is then renamed over FILE: a
reader never sees half of one, and a symbolic link at FILE is replaced by the file, never
followed. The test files have no name (O_TMPFILE, or a random name unlinked at once): nothing
is left behind however zinf exits, and nothing planted in DIR is opened. SIGINT, SIGTERM and
SIGHUP stop the sweep without writing --out or --report (exit status 128 + the signal's
number).

fio's --bs, --iodepth and --runtime are read as --block-sizes, --queue-depths and
--time-budget. GB/s means 10^9 bytes per second; the mixed figure counts bytes read plus bytes
written.)";

// The choice rule in one line, for the text and the report.
constexpr const char* kRule =
    "a setting replaces zinf's default only if its median beats the default's by more than "
    "the larger of the two spreads (max - min of each one's passes)";

// The sweep's default axes: block sizes around the 1 MiB where the drives here saturate
// (measured with fio on the build machines), queue depths around zinf's default 16, threads for the threads backend.
constexpr std::uint32_t kDefaultBlocks[] = {256u << 10, 1u << 20, 4u << 20};
constexpr std::uint32_t kDefaultDepths[] = {8, 16, 32};
constexpr std::uint32_t kThreadCounts[] = {4, 8, 16};
// The optimizer pipeline needs >= 3 sub-groups in flight (read, update, write); 8 per pass
// keeps the start and end of the pipeline (where only one direction runs) a small share.
constexpr std::uint64_t kGroupsPerPass = 8;
constexpr std::uint64_t kMiB = 1u << 20;

std::string gib(double b) { return human_bytes(static_cast<std::uint64_t>(b)); }

// A comma-separated list of sizes (block sizes) or counts (queue depths), each read by the
// grammar of its kind.
std::vector<std::uint64_t> parse_list(const std::string& text, const char* what, bool sizes) {
  std::vector<std::uint64_t> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    std::uint64_t v = sizes ? parse_size(item, what) : parse_count(item, what);
    if (v == 0 || v > 0xffffffffull) {
      throw UsageError(std::string("invalid ") + what + " '" + item + "': out of range");
    }
    out.push_back(v);
  }
  if (out.empty()) throw UsageError(std::string("invalid ") + what + ": empty list");
  return out;
}

bool has_cap_ipc_lock() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("CapEff:", 0) == 0) {
      unsigned long long caps = std::strtoull(line.c_str() + 7, nullptr, 16);
      return (caps >> 14) & 1u;  // CAP_IPC_LOCK = 14
    }
  }
  return false;
}

// The checks run before measuring; each problem is one warning line (also in the report).
std::vector<std::string> check_setup(const std::vector<swap::Dir>& dirs,
                                     std::uint64_t pinned_budget, bool* uring_ok,
                                     bool* memlock_ok) {
  std::vector<std::string> w;
  for (const auto& d : dirs) {
    // A quiet probe (File::create_unnamed would log its own fallback notice), without a name:
    // nothing planted in the directory is opened, and nothing is left if zinf is killed.
    int err = 0;
    if (!open_unnamed_probe(d, O_DIRECT, err).valid()) {
      w.push_back(direct_io_warning(d.path(), fs_type_name(d.path()), err));
    }
  }
  struct rlimit rl {};
  *memlock_ok = true;
  if (::getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
      !has_cap_ipc_lock()) {
    std::string m = memlock_warning(rl.rlim_cur, pinned_budget);
    if (!m.empty()) {
      *memlock_ok = false;
      w.push_back(m);
    }
  }
  *uring_ok = true;
  try {
    swap::IoOptions o;
    o.kind = swap::IoEngineKind::kUring;
    o.queue_depth = 4;
    (void)swap::make_io_engine(o);
  } catch (const std::exception& e) {
    *uring_ok = false;
    std::string why = swap::io_uring_unavailable_reason();
    w.push_back(uring_warning(why.empty() ? std::string(e.what()) : why));
  }
  std::ifstream thp("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string mode;
  std::getline(thp, mode);
  std::string t = thp_warning(mode);
  if (!t.empty()) w.push_back(t);
  return w;
}

std::uint64_t free_bytes(const std::string& dir) {
  struct statvfs s {};
  if (::statvfs(dir.c_str(), &s) != 0) return 0;
  return static_cast<std::uint64_t>(s.f_bavail) * s.f_frsize;
}

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

// What --sustained measured.
struct Sustained {
  std::uint64_t size = 0;  // bytes over all files
  double duration_s = 0;
  IoPassResult run;
  ThroughputProfile profile;
  double burst_gbps = 0;  // the chosen setting's write pass
  bool below_burst = false;
};

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

}  // namespace

int tune_main(const std::vector<std::string>& tokens) {
  std::vector<std::string> dirs;
  std::chrono::milliseconds budget = std::chrono::seconds(60);
  std::string out, report, plot, backends, block_list, depth_list;
  std::uint64_t pinned_budget = std::uint64_t{2} << 30;
  bool json = false, sustained_on = false;
  std::optional<std::uint64_t> sustained_size;
  std::chrono::milliseconds sustained_time = std::chrono::seconds(60);
  Cli cli("tune", kAbout, kFooter);
  cli.texts("--dir", dirs, "DIR", "directory to tune (repeatable: the state is striped over them)",
            "required");
  cli.duration("--time-budget", budget, "time for the whole sweep", "60s");
  cli.text("--out", out, "FILE",
           "write the chosen settings: DeepSpeed \"aio\" block + \"zinf\" "
           "section");
  cli.text("--report", report, "FILE",
           "write the figures (per-dir read/write GB/s, the sweep) as "
           "JSON, for `zinf plan --tune FILE`");
  cli.flag("--json", json, "print the report JSON on stdout instead of the table");
  cli.text("--plot", plot, "FILE.svg",
           "draw the block-size x queue-depth grid of each backend as an SVG heat map");
  cli.text("--backends", backends, "LIST", "uring,threads", "both where available");
  cli.text("--block-sizes", block_list, "LIST", "block sizes to try (SIZE,...)", "256K,1M,4M");
  cli.text("--queue-depths", depth_list, "LIST", "queue depths to try (N,...)", "8,16,32");
  cli.size("--pinned-budget", pinned_budget,
           "pinned memory the engine will hold, for the memlock check");
  cli.flag("--sustained", sustained_on,
           "then write with the chosen setting for --sustained-time and report the steady "
           "write rate (a consumer drive's cache hides it from short passes)");
  cli.size("--size", sustained_size,
           "bytes --sustained writes over, all dirs together; larger than the drive's write "
           "cache to see past it",
           "16G, at most half the free space");
  cli.duration("--sustained-time", sustained_time, "how long --sustained writes", "60s");
  cli.alias("--bs", "--block-sizes");
  cli.alias("--iodepth", "--queue-depths");
  cli.alias("--runtime", "--time-budget");
  if (!cli.parse(tokens)) return 0;
  const double budget_s = std::chrono::duration<double>(budget).count();
  if (dirs.empty())
    throw UsageError("--dir is required (a directory on the drive to tune; repeatable)");
  if (budget > std::chrono::hours(24)) throw UsageError("invalid --time-budget: at most 24h");
  if (sustained_size && !sustained_on) {
    throw UsageError("--size is the size --sustained writes over; give --sustained with it");
  }
  std::vector<swap::Dir> opened;  // each directory opened once; every file made relative to it
  for (const auto& d : dirs) opened.push_back(check_dir(d));
  std::vector<std::uint64_t> blocks(std::begin(kDefaultBlocks), std::end(kDefaultBlocks));
  std::vector<std::uint64_t> depths(std::begin(kDefaultDepths), std::end(kDefaultDepths));
  if (!block_list.empty()) blocks = parse_list(block_list, "--block-sizes", true);
  if (!depth_list.empty()) depths = parse_list(depth_list, "--queue-depths", false);
  for (auto b : blocks) {
    if (b % 4096 != 0) {
      throw UsageError("invalid --block-sizes entry " + std::to_string(b) +
                       ": must be a multiple of 4096");
    }
  }
  bool want_uring = true, want_threads = true;
  if (!backends.empty()) {
    want_uring = want_threads = false;
    std::stringstream ss(backends);
    std::string b;
    while (std::getline(ss, b, ',')) {
      if (b == "uring") {
        want_uring = true;
      } else if (b == "threads") {
        want_threads = true;
      } else {
        throw UsageError("invalid --backends entry '" + b + "': expected uring or threads");
      }
    }
  }

  const auto t0 = Clock::now();
  auto elapsed = [&] { return seconds_since(t0); };

  // 1. Checks.
  bool uring_ok = false, memlock_ok = false;
  std::vector<std::string> warnings = check_setup(opened, pinned_budget, &uring_ok, &memlock_ok);
  for (const auto& w : warnings) std::fprintf(stderr, "zinf tune: warning: %s\n", w.c_str());
  if (want_uring && !uring_ok) {
    want_uring = false;
    if (!want_threads) throw UsageError("--backends uring: io_uring is unavailable here");
  }

  std::vector<Point> points;
  for (auto b : blocks) {
    for (auto d : depths) {
      if (want_uring)
        points.push_back({swap::IoEngineKind::kUring,
                          static_cast<std::uint32_t>(b),
                          static_cast<std::uint32_t>(d),
                          0,
                          {}});
      if (want_threads) {
        for (auto t : kThreadCounts) {
          if (t > d) continue;
          points.push_back({swap::IoEngineKind::kThreads,
                            static_cast<std::uint32_t>(b),
                            static_cast<std::uint32_t>(d),
                            t,
                            {}});
        }
      }
    }
  }
  // zinf's default (IoOptions: uring where it runs, 1 MiB, queue depth 16; the threads
  // backend's 16 workers otherwise) is always measured, swept or not: it is what a user gets
  // without tuning, and what a setting must beat by more than the noise to replace it.
  {
    const Point def{want_uring ? swap::IoEngineKind::kUring : swap::IoEngineKind::kThreads,
                    1u << 20,
                    16,
                    want_uring ? 0u : 16u,
                    {},
                    true};
    auto same = [&](const Point& p) {
      return p.kind == def.kind && p.block == def.block && p.depth == def.depth &&
             p.threads == def.threads;
    };
    auto it = std::find_if(points.begin(), points.end(), same);
    if (it == points.end()) {
      points.insert(points.begin(), def);
    } else {
      it->is_default = true;
      std::rotate(points.begin(), it, it + 1);  // measured first: it never misses the budget
    }
  }
  std::uint64_t max_block = 0;
  for (const auto& p : points) max_block = std::max<std::uint64_t>(max_block, p.block);

  // 2. Calibrate with a small state at zinf's default setting, then size the test state so
  // that one pass per point fills ~55% of the budget (repeats of the best take ~25%, the
  // per-dir read/write figures the rest).
  std::uint64_t min_free = ~std::uint64_t{0};
  for (const auto& d : dirs) min_free = std::min(min_free, free_bytes(d));
  auto group_for = [&](std::uint64_t total) {
    std::uint64_t g = total / kGroupsPerPass / max_block * max_block;
    return std::max<std::uint64_t>(g, max_block);
  };
  const std::uint64_t dir_count = dirs.size();
  std::uint64_t calib_group = group_for(std::uint64_t{64} * kMiB * dir_count);
  if (calib_group * kGroupsPerPass / dir_count > min_free / 2) {
    throw Error("not enough free space to tune: " + gib(static_cast<double>(min_free)) +
                " free, the smallest test needs " +
                gib(static_cast<double>(2 * calib_group * kGroupsPerPass / dir_count)) +
                " per dir");
  }
  double calib_gbps = 0;
  {
    Workload w(opened, calib_group, kGroupsPerPass, memlock_ok);
    Point def{uring_ok && want_uring ? swap::IoEngineKind::kUring : swap::IoEngineKind::kThreads,
              static_cast<std::uint32_t>(std::min<std::uint64_t>(max_block, 1u << 20)),
              16,
              16,
              {}};
    auto e = w.engine(def);
    (void)w.single_pass(*e, swap::IoOp::kWrite, -1);  // lay the files out
    calib_gbps = w.mixed_pass(*e);
  }
  const double remaining = std::max(0.0, budget_s - elapsed());
  const double per_point_s = remaining * 0.55 / static_cast<double>(points.size());
  double want_total = calib_gbps * 1e9 * per_point_s / 2;  // a pass moves the state twice
  // 4 GiB per directory is enough for steady passes (a longer budget buys more passes, not
  // bigger ones); only less free space than that is worth a warning.
  constexpr std::uint64_t kMaxPerDir = std::uint64_t{4} << 30;
  const bool space_limited = min_free / 2 < kMaxPerDir;
  std::uint64_t cap = std::min<std::uint64_t>(kMaxPerDir, min_free / 2) * dir_count;
  std::uint64_t total = std::clamp<std::uint64_t>(static_cast<std::uint64_t>(want_total),
                                                  calib_group * kGroupsPerPass,
                                                  std::max(cap, calib_group * kGroupsPerPass));
  if (space_limited && static_cast<double>(total) < want_total &&
      cap < static_cast<std::uint64_t>(want_total)) {
    std::string w = "free space limits the test state to " + gib(static_cast<double>(total)) +
                    " (the time budget asks for " + gib(want_total) + "); short passes are noisier";
    std::fprintf(stderr, "zinf tune: warning: %s\n", w.c_str());
    warnings.push_back(w);
  }
  const std::uint64_t group = group_for(total);
  Workload w(opened, group, kGroupsPerPass, memlock_ok);
  if (!json) {
    std::fprintf(
        stderr, "zinf tune: %zu settings, %s test state in %llu sub-groups of %s, %.0f s budget\n",
        points.size(), gib(static_cast<double>(w.bytes())).c_str(),
        static_cast<unsigned long long>(kGroupsPerPass), size_text(group).c_str(), budget_s);
  }
  {
    Point def = points.front();
    auto e = w.engine(def);
    (void)w.single_pass(*e, swap::IoOp::kWrite, -1);
  }

  // 3. Sweep: every point once while the budget lasts, then two more passes of the three best
  // and of the default, so that each candidate has a median and a spread (max - min of its
  // passes) for the choice rule. The progress line counts passes: one per setting plus the
  // repeats (2 x 4).
  const std::size_t planned = points.size();
  Progress progress("zinf tune", static_cast<double>(planned + 8), "passes", !json);
  std::size_t passes = 0;
  auto measure = [&](Point& p) {
    auto e = w.engine(p);
    p.runs.push_back(w.mixed_pass(*e));
    char detail[96];
    std::snprintf(detail, sizeof detail, "%s %.2f GB/s", point_name(p).c_str(), p.runs.back());
    progress.update(static_cast<double>(++passes), detail);
  };
  std::size_t measured = 0;
  const double phase1_end = budget_s * 0.75;
  for (auto& p : points) {
    if (measured > 0 && elapsed() > phase1_end) break;
    measure(p);
    ++measured;
  }
  points.resize(measured);
  auto by_score = [](const Point& x, const Point& y) { return x.score() > y.score(); };
  std::stable_sort(points.begin(), points.end(), by_score);
  const std::size_t others = std::min<std::size_t>(3, points.size() - 1);
  progress.set_total(static_cast<double>(measured + 2 * (others + 1)));
  for (int round = 0; round < 2; ++round) {
    std::size_t seen = 0;
    for (auto& p : points) {
      // The default always (the rule needs its spread), the three best others while the
      // budget lasts.
      if (p.is_default) {
        measure(p);
      } else if (seen < others) {
        ++seen;
        if (elapsed() <= budget_s * 0.85) measure(p);
      }
    }
  }
  progress.finish();
  std::stable_sort(points.begin(), points.end(), by_score);
  std::vector<tune::Measured> figures;
  std::vector<std::string> names;
  std::size_t default_index = 0;
  for (std::size_t i = 0; i < points.size(); ++i) {
    figures.push_back(tune::measured(points[i].runs));
    names.push_back(point_name(points[i]));
    if (points[i].is_default) default_index = i;
  }
  const tune::Choice choice = tune::choose(figures, default_index);
  const Point& best = points[choice.chosen];

  // 4. The chosen setting's read and write figures, all dirs together and each alone.
  auto e = w.engine(best);
  const double write_gbps = w.single_pass(*e, swap::IoOp::kWrite, -1);
  const double read_gbps = w.single_pass(*e, swap::IoOp::kRead, -1);
  std::vector<std::pair<double, double>> per_dir;
  for (std::size_t i = 0; i < dirs.size(); ++i) {
    if (dirs.size() == 1) {
      per_dir.emplace_back(read_gbps, write_gbps);
    } else {
      double wg = w.single_pass(*e, swap::IoOp::kWrite, static_cast<int>(i));
      double rg = w.single_pass(*e, swap::IoOp::kRead, static_cast<int>(i));
      per_dir.emplace_back(rg, wg);
    }
  }
  bool all_direct = true;
  for (std::size_t i = 0; i < dirs.size(); ++i) all_direct = all_direct && w.direct(i);

  // 5. Sustained writes with the chosen setting: bench io's time-based run over --size.
  std::optional<Sustained> sustained;
  if (sustained_on) {
    Sustained su;
    constexpr std::uint64_t kDefaultSustained = std::uint64_t{16} << 30;
    const std::uint64_t room = min_free / 2 / best.block * best.block * dir_count;
    su.size = sustained_size.value_or(kDefaultSustained);
    if (su.size > room) {
      std::string m = "free space limits the sustained test to " + gib(static_cast<double>(room)) +
                      " (" + (sustained_size ? "--size" : "the default") + " asks for " +
                      gib(static_cast<double>(su.size)) + ")";
      std::fprintf(stderr, "zinf tune: warning: %s\n", m.c_str());
      warnings.push_back(m);
      su.size = room;
    }
    IoBenchOptions bo;
    bo.dirs = dirs;
    bo.size = su.size;
    bo.io.kind = best.kind;
    bo.io.block_size = best.block;
    bo.io.queue_depth = best.depth;
    bo.io.threads = best.threads;
    bo.huge_pages = true;
    bo.file_stem = "zinf-tune-sustained";
    IoBench bench(bo);  // UsageError for a size below one block per dir
    su.size = bench.file_size() * bench.file_count();
    if (!json) {
      std::fprintf(stderr, "zinf tune: sustained write of %s for %s\n",
                   gib(static_cast<double>(su.size)).c_str(),
                   duration_text(sustained_time).c_str());
    }
    IoRunSpec spec;
    spec.duration = sustained_time;
    su.duration_s = std::chrono::duration<double>(sustained_time).count();
    su.run = bench.run(spec, !json, "zinf tune: sustained write");
    su.profile = analyze_throughput(su.run.write_samples);
    su.burst_gbps = write_gbps;
    su.below_burst = su.profile.steady_gbps > 0 &&
                     significant_drop(su.burst_gbps, su.profile.steady_gbps, su.profile.noise_gbps);
    sustained = std::move(su);
  }

  // 6. Report.
  Json report_doc;
  report_doc["tool"] = "zinf tune";
  Json& dir_list = report_doc["dirs"] = Json::array();
  for (std::size_t i = 0; i < dirs.size(); ++i) {
    Json j;
    j["dir"] = dirs[i];
    j["file_system"] = fs_type_name(dirs[i]);
    j["direct"] = w.direct(i);
    j["free_bytes"] = free_bytes(dirs[i]);
    j["read_gbps"] = per_dir[i].first;
    j["write_gbps"] = per_dir[i].second;
    dir_list.push_back(std::move(j));
  }
  report_doc["warnings"] = warnings;
  report_doc["time_budget_s"] = budget_s;
  report_doc["elapsed_s"] = elapsed();
  report_doc["test_state_bytes"] = w.bytes();
  report_doc["sub_group_bytes"] = group;
  report_doc["settings_planned"] = std::uint64_t{planned};
  report_doc["kernel"] = kernel_release();
  report_doc["cpu"] = cpu_model();
  Json& sweep = report_doc["sweep"] = Json::array();
  for (const Point& p : points) sweep.push_back(point_json(p));
  Json& rule = report_doc["choice"];
  rule["rule"] = kRule;
  rule["default"] = point_json(points[default_index]);
  rule["best"] = point_json(points[choice.best]);
  rule["margin_gbps"] = choice.margin_gbps;
  rule["noise_gbps"] = choice.noise_gbps;
  rule["beats_default"] = choice.beats_default;
  rule["summary"] = tune::choice_line(choice, figures, names, default_index);
  Json& chosen = report_doc["chosen"] = point_json(best);
  chosen["read_gbps"] = read_gbps;
  chosen["write_gbps"] = write_gbps;
  if (sustained) {
    Json& sj = report_doc["sustained"] = sustained_json(*sustained);
    if (sustained->below_burst) sj["note"] = below_burst_note(*sustained);
  }
  const std::string rep = json_text(report_doc);

  // Nothing written after a signal: the figures of a cut-short sweep are not the answer.
  throw_if_interrupted();
  if (!out.empty()) write_output_file(out, config_json(best, all_direct));
  if (!report.empty()) write_output_file(report, rep + "\n");
  std::vector<tune::GridPoint> cells;
  for (std::size_t i = 0; i < points.size(); ++i) {
    cells.push_back({std::string(swap::io_engine_kind_name(points[i].kind)), points[i].block,
                     points[i].depth, points[i].score(), i == choice.chosen});
  }
  const std::vector<tune::Grid> grids = tune::make_grids(cells);
  if (!plot.empty()) {
    std::string title = "zinf tune:";
    for (const auto& d : dirs) title += " " + d;
    write_output_file(plot, tune::grids_svg(grids, title));
  }
  if (json) {
    std::printf("%s\n", rep.c_str());
    return 0;
  }
  std::printf(
      "zinf tune: %zu dir%s, %s test state, sub-groups of %s, %zu of %zu settings in "
      "%.1f s; mixed = optimizer-step reads+writes, GB/s = 1e9 B/s\n",
      dirs.size(), dirs.size() == 1 ? "" : "s", gib(static_cast<double>(w.bytes())).c_str(),
      size_text(group).c_str(), points.size(), planned, elapsed());
  std::printf("%-8s %6s %5s %8s %11s %7s   %s\n", "backend", "block", "qd", "threads", "mixed GB/s",
              "spread", "runs");
  for (std::size_t i = 0; i < points.size(); ++i) {
    const Point& p = points[i];
    std::printf(
        "%-8s %6s %5u %8s %11.2f %7.2f   %s%s\n",
        std::string(swap::io_engine_kind_name(p.kind)).c_str(), size_text(p.block).c_str(), p.depth,
        p.kind == swap::IoEngineKind::kThreads ? std::to_string(p.threads).c_str() : "-", p.score(),
        figures[i].spread_gbps, figures_text(p.runs).c_str(), p.is_default ? "(default)" : "");
  }
  // The three best and how far apart they are: on a flat top the choice matters little.
  const std::size_t top = std::min<std::size_t>(3, points.size());
  const double lead = figures[0].median_gbps;
  const double within = lead > 0 ? 100.0 * (lead - figures[top - 1].median_gbps) / lead : 0;
  std::printf("top %zu within %.1f%%:", top, within);
  for (std::size_t i = 0; i < top; ++i) {
    std::printf("%s %s %.2f GB/s (spread %.2f, %zu pass%s)", i == 0 ? "" : ";", names[i].c_str(),
                figures[i].median_gbps, figures[i].spread_gbps, figures[i].passes,
                figures[i].passes == 1 ? "" : "es");
  }
  std::printf("\nrule: %s\n%s\n", kRule,
              tune::choice_line(choice, figures, names, default_index).c_str());
  std::printf(
      "chosen: backend=%s block_size=%s queue_depth=%u%s: mixed %.2f GB/s, read %.2f GB/s, "
      "write %.2f GB/s\n",
      std::string(swap::io_engine_kind_name(best.kind)).c_str(), size_text(best.block).c_str(),
      best.depth,
      best.kind == swap::IoEngineKind::kThreads
          ? (" threads=" + std::to_string(best.threads)).c_str()
          : "",
      best.score(), read_gbps, write_gbps);
  for (std::size_t i = 0; i < dirs.size(); ++i) {
    std::printf("  %s (%s%s): read %.2f GB/s, write %.2f GB/s\n", dirs[i].c_str(),
                fs_type_name(dirs[i]).c_str(), w.direct(i) ? ", O_DIRECT" : ", buffered",
                per_dir[i].first, per_dir[i].second);
  }
  if (sustained) {
    const Sustained& su = *sustained;
    std::vector<double> rates;
    for (const auto& t : su.run.write_samples) rates.push_back(t.gbps());
    std::printf(
        "sustained write: %s over %zu dir%s for %.0f s with the chosen setting: steady %.2f GB/s "
        "(median of the last third, noise %.2f GB/s), burst %.2f GB/s\n",
        gib(static_cast<double>(su.size)).c_str(), dirs.size(), dirs.size() == 1 ? "" : "s",
        su.duration_s, su.profile.steady_gbps, su.profile.noise_gbps, su.burst_gbps);
    std::printf("  %s  (1 s per mark)\n", sparkline(rates).c_str());
    if (su.profile.cliff) {
      std::printf("  fell from %.2f to %.2f GB/s after %s (%.0f s in)\n",
                  su.profile.cliff->before_gbps, su.profile.cliff->after_gbps,
                  decimal_bytes(static_cast<double>(su.profile.cliff->bytes_before)).c_str(),
                  su.profile.cliff->at_s);
    } else if (!su.profile.note.empty()) {
      std::printf("  %s\n", su.profile.note.c_str());
    }
    if (su.below_burst) std::printf("note: %s\n", below_burst_note(su).c_str());
  }
  std::printf(
      "mixed GB/s by block size x queue depth (* chosen; threads: its best thread count):\n%s",
      tune::grids_text(grids).c_str());
  if (!plot.empty()) std::printf("wrote %s (the grid as an SVG heat map)\n", plot.c_str());
  // Always shown, as DeepSpeed's tuner prints its aio block: the answer even without --out.
  // The config takes no comment (the reader refuses unknown keys): the header says it.
  std::string about_config = out.empty() ? "; --out FILE writes it" : "";
  if (sustained && sustained->below_burst) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "; sustained writes run at %.2f GB/s, below the %.2f burst",
                  sustained->profile.steady_gbps, sustained->burst_gbps);
    about_config += buf;
  }
  std::printf("config (the DeepSpeed \"aio\" block + \"zinf\" section%s):\n%s\n",
              about_config.c_str(), config_json(best, all_direct).c_str());
  if (!out.empty())
    std::printf("wrote %s (DeepSpeed \"aio\" block + \"zinf\" section)\n", out.c_str());
  if (!report.empty()) std::printf("wrote %s (for zinf plan --tune)\n", report.c_str());
  return 0;
}

}  // namespace zinf::tools
