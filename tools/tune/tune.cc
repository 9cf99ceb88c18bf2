// SPDX-License-Identifier: Apache-2.0
// `zinf tune`: checks the setup (O_DIRECT, memlock, io_uring, huge pages, free space), then
// sweeps backend x block size x queue depth (x threads) on the user's directories with the
// optimizer step's I/O pattern, and writes the winner as a zinf config with a DeepSpeed "aio"
// block (--out) and the figures behind it (--report, read by `zinf plan --tune`). With
// --sustained it then writes for a while with the winner (bench io's time-based run) for the
// drive's steady write rate, which a consumer drive's write cache hides from short passes.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <numeric>
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
#include "tune_options.h"
#include "tune_report.h"
#include "tune_setup.h"
#include "workload.h"
#include "zinf/common/error.h"
#include "zinf/swap/dir.h"
#include "zinf/swap/io_engine.h"

namespace zinf::tools {
namespace {

using tune::below_burst_note;
using tune::check_setup;
using tune::config_json;
using tune::free_bytes;
using tune::Point;
using tune::point_json;
using tune::point_name;
using tune::Sustained;
using tune::sustained_json;
using tune::Workload;

using Clock = tune::Clock;
using tune::TuneOptions;

// The choice rule in one line, for the text and the report.
constexpr const char* kRule =
    "a setting replaces zinf's default only if its median beats the default's by more than "
    "the larger of the two spreads (max - min of each one's passes)";

// Thread counts the threads backend is swept over (those up to the queue depth).
constexpr std::uint32_t kThreadCounts[] = {4, 8, 16};
// The optimizer pipeline needs >= 3 sub-groups in flight (read, update, write); 8 per pass
// keeps the start and end of the pipeline (where only one direction runs) a small share.
constexpr std::uint64_t kGroupsPerPass = 8;
constexpr std::uint64_t kMiB = 1u << 20;

std::string gib(double b) { return human_bytes(static_cast<std::uint64_t>(b)); }

// The settings to sweep: blocks x depths for each backend wanted (x thread counts for the
// threads backend), with zinf's default always among them and first.
std::vector<Point> sweep_points(const TuneOptions& o, bool want_uring) {
  std::vector<Point> points;
  for (auto b : o.blocks) {
    for (auto d : o.depths) {
      if (want_uring)
        points.push_back({swap::IoEngineKind::kUring,
                          static_cast<std::uint32_t>(b),
                          static_cast<std::uint32_t>(d),
                          0,
                          {}});
      if (o.want_threads) {
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
  return points;
}

// The sweep's outcome: the settings best first, their figures, and the choice among them.
struct SweepResult {
  std::size_t planned = 0;  // settings planned (some may not fit the budget)
  std::vector<Point> points;
  std::vector<tune::Measured> figures;
  std::vector<std::string> names;
  std::size_t default_index = 0;
  tune::Choice choice;
};

// The chosen setting's read and write figures, all dirs together and each alone.
struct ChosenFigures {
  double write_gbps = 0, read_gbps = 0;
  std::vector<std::pair<double, double>> per_dir;  // read, write
  bool all_direct = true;
};

// One run of `zinf tune`, phase by phase: checks, sizing, sweep, the chosen setting's figures,
// the sustained run, then the report and the text.
class Tuner {
 public:
  explicit Tuner(const TuneOptions& o) : o_(o), t0_(Clock::now()) {}

  int run() {
    check();
    std::vector<Point> points = sweep_points(o_, want_uring_);
    std::uint64_t max_block = 0;
    for (const auto& p : points) max_block = std::max<std::uint64_t>(max_block, p.block);
    const std::uint64_t group = size_state(points, max_block);
    Workload w(o_.opened, group, kGroupsPerPass, memlock_ok_);
    if (!o_.json) {
      std::fprintf(
          stderr,
          "zinf tune: %zu settings, %s test state in %llu sub-groups of %s, %.0f s budget\n",
          points.size(), gib(static_cast<double>(w.bytes())).c_str(),
          static_cast<unsigned long long>(kGroupsPerPass), size_text(group).c_str(), o_.budget_s());
    }
    {
      Point def = points.front();
      auto e = w.engine(def);
      (void)w.single_pass(*e, swap::IoOp::kWrite, -1);
    }
    const SweepResult sw = sweep(w, std::move(points));
    const Point& best = sw.points[sw.choice.chosen];
    const ChosenFigures chosen = measure_chosen(w, best);
    std::optional<Sustained> sustained;
    if (o_.sustained_on) sustained = run_sustained(best, chosen.write_gbps);
    const std::string rep = json_text(report_json(w, group, sw, chosen, sustained));

    // Nothing written after a signal: the figures of a cut-short sweep are not the answer.
    throw_if_interrupted();
    if (!o_.out.empty()) write_output_file(o_.out, config_json(best, chosen.all_direct));
    if (!o_.report.empty()) write_output_file(o_.report, rep + "\n");
    // The grids in the backends' fixed order (uring, then threads), not the ranking's, so that
    // two runs' grids read alike whichever backend won.
    std::vector<std::size_t> order(sw.points.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      return sw.points[a].kind < sw.points[b].kind;
    });
    std::vector<tune::GridPoint> cells;
    for (const std::size_t i : order) {
      cells.push_back({std::string(swap::io_engine_kind_name(sw.points[i].kind)),
                       sw.points[i].block, sw.points[i].depth, sw.points[i].score(),
                       i == sw.choice.chosen});
    }
    const std::vector<tune::Grid> grids = tune::make_grids(cells);
    if (!o_.plot.empty()) {
      std::string title = "zinf tune:";
      for (const auto& d : o_.dirs) title += " " + d;
      write_output_file(o_.plot, tune::grids_svg(grids, title));
    }
    if (o_.json) {
      std::printf("%s\n", rep.c_str());
      return 0;
    }
    print_text(w, group, sw, chosen, sustained, grids);
    return 0;
  }

 private:
  double elapsed() const { return seconds_since(t0_); }

  void warn(const std::string& w) {
    std::fprintf(stderr, "zinf tune: warning: %s\n", w.c_str());
    warnings_.push_back(w);
  }

  // 1. Checks.
  void check() {
    warnings_ = check_setup(o_.opened, o_.pinned_budget, &uring_ok_, &memlock_ok_);
    for (const auto& w : warnings_) std::fprintf(stderr, "zinf tune: warning: %s\n", w.c_str());
    want_uring_ = o_.want_uring;
    if (want_uring_ && !uring_ok_) {
      want_uring_ = false;
      if (!o_.want_threads) throw UsageError("--backends uring: io_uring is unavailable here");
    }
  }

  // 2. Calibrate with a small state at zinf's default setting, then size the test state so
  // that one pass per point fills ~55% of the budget (repeats of the best take ~25%, the
  // per-dir read/write figures the rest). Returns the sub-group size.
  std::uint64_t size_state(const std::vector<Point>& points, std::uint64_t max_block) {
    min_free_ = ~std::uint64_t{0};
    for (const auto& d : o_.dirs) min_free_ = std::min(min_free_, free_bytes(d));
    auto group_for = [&](std::uint64_t total) {
      std::uint64_t g = total / kGroupsPerPass / max_block * max_block;
      return std::max<std::uint64_t>(g, max_block);
    };
    const std::uint64_t dir_count = o_.dirs.size();
    std::uint64_t calib_group = group_for(std::uint64_t{64} * kMiB * dir_count);
    if (calib_group * kGroupsPerPass / dir_count > min_free_ / 2) {
      throw Error("not enough free space to tune: " + gib(static_cast<double>(min_free_)) +
                  " free, the smallest test needs " +
                  gib(static_cast<double>(2 * calib_group * kGroupsPerPass / dir_count)) +
                  " per dir");
    }
    double calib_gbps = 0;
    {
      Workload w(o_.opened, calib_group, kGroupsPerPass, memlock_ok_);
      Point def{
          uring_ok_ && want_uring_ ? swap::IoEngineKind::kUring : swap::IoEngineKind::kThreads,
          static_cast<std::uint32_t>(std::min<std::uint64_t>(max_block, 1u << 20)),
          16,
          16,
          {}};
      auto e = w.engine(def);
      (void)w.single_pass(*e, swap::IoOp::kWrite, -1);  // lay the files out
      calib_gbps = w.mixed_pass(*e);
    }
    const double remaining = std::max(0.0, o_.budget_s() - elapsed());
    const double per_point_s = remaining * 0.55 / static_cast<double>(points.size());
    double want_total = calib_gbps * 1e9 * per_point_s / 2;  // a pass moves the state twice
    // 4 GiB per directory is enough for steady passes (a longer budget buys more passes, not
    // bigger ones); only less free space than that is worth a warning.
    constexpr std::uint64_t kMaxPerDir = std::uint64_t{4} << 30;
    const bool space_limited = min_free_ / 2 < kMaxPerDir;
    std::uint64_t cap = std::min<std::uint64_t>(kMaxPerDir, min_free_ / 2) * dir_count;
    std::uint64_t total = std::clamp<std::uint64_t>(static_cast<std::uint64_t>(want_total),
                                                    calib_group * kGroupsPerPass,
                                                    std::max(cap, calib_group * kGroupsPerPass));
    if (space_limited && static_cast<double>(total) < want_total &&
        cap < static_cast<std::uint64_t>(want_total)) {
      warn("free space limits the test state to " + gib(static_cast<double>(total)) +
           " (the time budget asks for " + gib(want_total) + "); short passes are noisier");
    }
    return group_for(total);
  }

  // 3. Sweep: every point once while the budget lasts, then two more passes of the three best
  // and of the default, so that each candidate has a median and a spread (max - min of its
  // passes) for the choice rule. The progress line counts passes: one per setting plus the
  // repeats (2 x 4).
  SweepResult sweep(Workload& w, std::vector<Point> points) {
    const double budget_s = o_.budget_s();
    SweepResult r;
    r.planned = points.size();
    Progress progress("zinf tune", static_cast<double>(r.planned + 8), "passes", !o_.json);
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
    for (std::size_t i = 0; i < points.size(); ++i) {
      r.figures.push_back(tune::measured(points[i].runs));
      r.names.push_back(point_name(points[i]));
      if (points[i].is_default) r.default_index = i;
    }
    r.choice = tune::choose(r.figures, r.default_index);
    r.points = std::move(points);
    return r;
  }

  // 4. The chosen setting's read and write figures, all dirs together and each alone.
  ChosenFigures measure_chosen(Workload& w, const Point& best) const {
    ChosenFigures c;
    auto e = w.engine(best);
    c.write_gbps = w.single_pass(*e, swap::IoOp::kWrite, -1);
    c.read_gbps = w.single_pass(*e, swap::IoOp::kRead, -1);
    for (std::size_t i = 0; i < o_.dirs.size(); ++i) {
      if (o_.dirs.size() == 1) {
        c.per_dir.emplace_back(c.read_gbps, c.write_gbps);
      } else {
        double wg = w.single_pass(*e, swap::IoOp::kWrite, static_cast<int>(i));
        double rg = w.single_pass(*e, swap::IoOp::kRead, static_cast<int>(i));
        c.per_dir.emplace_back(rg, wg);
      }
    }
    for (std::size_t i = 0; i < o_.dirs.size(); ++i) c.all_direct = c.all_direct && w.direct(i);
    return c;
  }

  // 5. Sustained writes with the chosen setting: bench io's time-based run over --size.
  Sustained run_sustained(const Point& best, double burst_write_gbps) {
    Sustained su;
    constexpr std::uint64_t kDefaultSustained = std::uint64_t{16} << 30;
    const std::uint64_t room = min_free_ / 2 / best.block * best.block * o_.dirs.size();
    su.size = o_.sustained_size.value_or(kDefaultSustained);
    if (su.size > room) {
      warn("free space limits the sustained test to " + gib(static_cast<double>(room)) + " (" +
           (o_.sustained_size ? "--size" : "the default") + " asks for " +
           gib(static_cast<double>(su.size)) + ")");
      su.size = room;
    }
    IoBenchOptions bo;
    bo.dirs = o_.dirs;
    bo.size = su.size;
    bo.io.kind = best.kind;
    bo.io.block_size = best.block;
    bo.io.queue_depth = best.depth;
    bo.io.threads = best.threads;
    bo.huge_pages = true;
    bo.file_stem = "zinf-tune-sustained";
    IoBench bench(bo);  // UsageError for a size below one block per dir
    su.size = bench.file_size() * bench.file_count();
    if (!o_.json) {
      std::fprintf(stderr, "zinf tune: sustained write of %s for %s\n",
                   gib(static_cast<double>(su.size)).c_str(),
                   duration_text(o_.sustained_time).c_str());
    }
    IoRunSpec spec;
    spec.duration = o_.sustained_time;
    su.duration_s = std::chrono::duration<double>(o_.sustained_time).count();
    su.run = bench.run(spec, !o_.json, "zinf tune: sustained write");
    su.profile = analyze_throughput(su.run.write_samples);
    su.burst_gbps = burst_write_gbps;
    su.below_burst = su.profile.steady_gbps > 0 &&
                     significant_drop(su.burst_gbps, su.profile.steady_gbps, su.profile.noise_gbps);
    return su;
  }

  // 6. Report.
  Json report_json(const Workload& w, std::uint64_t group, const SweepResult& sw,
                   const ChosenFigures& c, const std::optional<Sustained>& sustained) const {
    const std::vector<std::string>& dirs = o_.dirs;
    Json report_doc;
    report_doc["tool"] = "zinf tune";
    Json& dir_list = report_doc["dirs"] = Json::array();
    for (std::size_t i = 0; i < dirs.size(); ++i) {
      Json j;
      j["dir"] = dirs[i];
      j["file_system"] = fs_type_name(dirs[i]);
      j["direct"] = w.direct(i);
      j["free_bytes"] = free_bytes(dirs[i]);
      j["read_gbps"] = c.per_dir[i].first;
      j["write_gbps"] = c.per_dir[i].second;
      dir_list.push_back(std::move(j));
    }
    report_doc["warnings"] = warnings_;
    report_doc["time_budget_s"] = o_.budget_s();
    report_doc["elapsed_s"] = elapsed();
    report_doc["test_state_bytes"] = w.bytes();
    report_doc["sub_group_bytes"] = group;
    report_doc["settings_planned"] = std::uint64_t{sw.planned};
    report_doc["kernel"] = kernel_release();
    report_doc["cpu"] = cpu_model();
    Json& sweep = report_doc["sweep"] = Json::array();
    for (const Point& p : sw.points) sweep.push_back(point_json(p));
    Json& rule = report_doc["choice"];
    rule["rule"] = kRule;
    rule["default"] = point_json(sw.points[sw.default_index]);
    rule["best"] = point_json(sw.points[sw.choice.best]);
    rule["margin_gbps"] = sw.choice.margin_gbps;
    rule["noise_gbps"] = sw.choice.noise_gbps;
    rule["beats_default"] = sw.choice.beats_default;
    rule["summary"] = tune::choice_line(sw.choice, sw.figures, sw.names, sw.default_index);
    Json& chosen = report_doc["chosen"] = point_json(sw.points[sw.choice.chosen]);
    chosen["read_gbps"] = c.read_gbps;
    chosen["write_gbps"] = c.write_gbps;
    if (sustained) {
      Json& sj = report_doc["sustained"] = sustained_json(*sustained);
      if (sustained->below_burst) sj["note"] = below_burst_note(*sustained);
    }
    return report_doc;
  }

  // The text: the sweep's table, the three best, the rule, the chosen setting's figures, the
  // sustained run, the grids and the config.
  void print_text(const Workload& w, std::uint64_t group, const SweepResult& sw,
                  const ChosenFigures& c, const std::optional<Sustained>& sustained,
                  const std::vector<tune::Grid>& grids) const {
    const std::vector<std::string>& dirs = o_.dirs;
    const std::vector<Point>& points = sw.points;
    const std::vector<tune::Measured>& figures = sw.figures;
    const Point& best = points[sw.choice.chosen];
    std::printf(
        "zinf tune: %zu dir%s, %s test state, sub-groups of %s, %zu of %zu settings in "
        "%.1f s; mixed = optimizer-step reads+writes, GB/s = 1e9 B/s\n",
        dirs.size(), dirs.size() == 1 ? "" : "s", gib(static_cast<double>(w.bytes())).c_str(),
        size_text(group).c_str(), points.size(), sw.planned, elapsed());
    std::printf("%-8s %6s %5s %8s %11s %7s   %s\n", "backend", "block", "qd", "threads",
                "mixed GB/s", "spread", "runs");
    for (std::size_t i = 0; i < points.size(); ++i) {
      const Point& p = points[i];
      std::printf("%-8s %6s %5u %8s %11.2f %7.2f   %s%s\n",
                  std::string(swap::io_engine_kind_name(p.kind)).c_str(),
                  size_text(p.block).c_str(), p.depth,
                  p.kind == swap::IoEngineKind::kThreads ? std::to_string(p.threads).c_str() : "-",
                  p.score(), figures[i].spread_gbps, figures_text(p.runs).c_str(),
                  p.is_default ? "(default)" : "");
    }
    // The three best and how far apart they are: on a flat top the choice matters little.
    const std::size_t top = std::min<std::size_t>(3, points.size());
    const double lead = figures[0].median_gbps;
    const double within = lead > 0 ? 100.0 * (lead - figures[top - 1].median_gbps) / lead : 0;
    std::printf("top %zu within %.1f%%:", top, within);
    for (std::size_t i = 0; i < top; ++i) {
      std::printf("%s %s %.2f GB/s (spread %.2f, %zu pass%s)", i == 0 ? "" : ";",
                  sw.names[i].c_str(), figures[i].median_gbps, figures[i].spread_gbps,
                  figures[i].passes, figures[i].passes == 1 ? "" : "es");
    }
    std::printf("\nrule: %s\n%s\n", kRule,
                tune::choice_line(sw.choice, figures, sw.names, sw.default_index).c_str());
    std::printf(
        "chosen: backend=%s block_size=%s queue_depth=%u%s: mixed %.2f GB/s, read %.2f GB/s, "
        "write %.2f GB/s\n",
        std::string(swap::io_engine_kind_name(best.kind)).c_str(), size_text(best.block).c_str(),
        best.depth,
        best.kind == swap::IoEngineKind::kThreads
            ? (" threads=" + std::to_string(best.threads)).c_str()
            : "",
        best.score(), c.read_gbps, c.write_gbps);
    for (std::size_t i = 0; i < dirs.size(); ++i) {
      std::printf("  %s (%s%s): read %.2f GB/s, write %.2f GB/s\n", dirs[i].c_str(),
                  fs_type_name(dirs[i]).c_str(), w.direct(i) ? ", O_DIRECT" : ", buffered",
                  c.per_dir[i].first, c.per_dir[i].second);
    }
    if (sustained) print_sustained(*sustained);
    std::printf(
        "mixed GB/s by block size x queue depth (* chosen; threads: its best thread count):\n%s",
        tune::grids_text(grids).c_str());
    if (!o_.plot.empty()) std::printf("wrote %s (the grid as an SVG heat map)\n", o_.plot.c_str());
    // Always shown, as DeepSpeed's tuner prints its aio block: the answer even without --out.
    // The config takes no comment (the reader refuses unknown keys): the header says it.
    std::string about_config = o_.out.empty() ? "; --out FILE writes it" : "";
    if (sustained && sustained->below_burst) {
      char buf[160];
      std::snprintf(buf, sizeof buf, "; sustained writes run at %.2f GB/s, below the %.2f burst",
                    sustained->profile.steady_gbps, sustained->burst_gbps);
      about_config += buf;
    }
    std::printf("config (the DeepSpeed \"aio\" block + \"zinf\" section%s):\n%s\n",
                about_config.c_str(), config_json(best, c.all_direct).c_str());
    if (!o_.out.empty())
      std::printf("wrote %s (DeepSpeed \"aio\" block + \"zinf\" section)\n", o_.out.c_str());
    if (!o_.report.empty()) std::printf("wrote %s (for zinf plan --tune)\n", o_.report.c_str());
  }

  void print_sustained(const Sustained& su) const {
    const std::size_t dir_count = o_.dirs.size();
    std::vector<double> rates;
    for (const auto& t : su.run.write_samples) rates.push_back(t.gbps());
    std::printf(
        "sustained write: %s over %zu dir%s for %.0f s with the chosen setting: steady %.2f GB/s "
        "(median of the last third, noise %.2f GB/s), burst %.2f GB/s\n",
        gib(static_cast<double>(su.size)).c_str(), dir_count, dir_count == 1 ? "" : "s",
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

  const TuneOptions& o_;
  const Clock::time_point t0_;
  std::vector<std::string> warnings_;
  bool uring_ok_ = false, memlock_ok_ = false, want_uring_ = true;
  std::uint64_t min_free_ = 0;
};

}  // namespace

int tune_main(const std::vector<std::string>& tokens) {
  const std::optional<TuneOptions> o = tune::parse_options(tokens);
  if (!o) return 0;
  return Tuner(*o).run();
}

}  // namespace zinf::tools
