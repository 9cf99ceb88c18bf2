// SPDX-License-Identifier: Apache-2.0
// `zinf bench step`: times OffloadedOptimizer steps (state on NVMe or in pinned memory) on a
// model-sized parameter group and reports the step time with the busy time of each pipeline
// stage (read, update, write-back), so that it can be set against the drive's and the
// kernel's own rates (bench/compare_step.sh). Under mpirun it measures weak scaling instead:
// the sharded optimizer over every rank's parameters against one rank's step alone.
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "bench_common.h"
#include "args.h"
#include "commands.h"
#include "interrupt.h"
#include "io_bench.h"
#include "format.h"
#include "progress.h"
#include "json_out.h"
#include "launch.h"
#include "scratch.h"
#include "step_reference.h"
#include "step_report.h"
#include "step_weak_scaling.h"
#include "zinf/common/error.h"
#include "zinf/dist/collectives.h"
#include "zinf/offload/config.h"
#include "zinf/optim/optimizer.h"

namespace zinf::tools {
namespace {

using adam::GradView;
using optim::OffloadedOptimizer;
using optim::StateTier;

constexpr const char* kAbout = R"(
Times steps of zinf's offloaded optimizer: the fp32 parameters and Adam moments (12 bytes per
element; 8 with --state-precision bf16, 6.125 with int8) live on NVMe (--tier nvme, one swap file per --dir) or in pinned host memory (--tier
cpu), and each step streams them through the CPU Adam kernel with fp32 gradients held in memory.
Reports the median step and, for that step count, the median busy time of each stage.

Under mpirun (--dist): weak scaling. --numel is each rank's share of one group of N x numel
parameters, which zinf's sharded optimizer (ZeRO's partitioned Adam) updates over the MPI
collectives, each rank's state in its own <dir>/rank<R>. Every round, rank 0 first steps an
optimizer of numel parameters alone (the one-rank step; the other ranks wait at a barrier),
then every rank steps the sharded one; rank 0 reports both medians and their ratio.)";

constexpr const char* kFooter = R"(
--reference N: every N timed steps (and after the last), measure what the steps are judged by:
one write and one read pass of the state's size through `zinf bench io`'s code (same engine,
queue depth and 1 MiB requests over fio's footprint of queue depth x 1 MiB, on a file without a
name in each --dir) and one Adam step over the same elements in plain memory; each step is
reported against the mean of the two references around its block of N steps:
  ideal = max(bytes read / read rate + bytes written / write rate, Adam)
where the bytes are the step's own (the mode's records) and Adam is the kernel of the same
--state-precision. N > 1 keeps steps back to back, as a trainer's are. Needs the state's bytes
per element more memory and
the state's size again on the drive.

Stage times: read/write = time with at least one state read/write-back in flight; compute =
time inside the Adam kernel; they overlap, so the step takes about the longest of them.

Weak scaling (mpirun -np N): each rank averages its own gradients (the same generator, a
different stretch of it per rank) with the others' by reduce-scatter, updates its numel
elements and all-gathers the N x numel parameters. The sharded step's time is the slowest
rank's (a step ends on every rank only when the last has sent its slice); ratio = sharded step /
one-rank step, both medians over --steps rounds that alternate the two, so that both share the
drive's and the host's moments. --reference, --checkpoint-*, --idle-ms, --grad-dtype and
--copy-out are for one process.

SIGINT, SIGTERM and SIGHUP stop the run between steps and remove its files (exit status 128 +
the signal's number, e.g. 130 for SIGINT).)";

// The command line, parsed and checked.
struct StepOptions {
  std::vector<std::string> dirs;
  std::uint64_t numel = std::uint64_t{256} << 20, sub_group = 0, depth = 4;
  std::uint64_t threads = 0, steps = 5, queue_depth = 16, budget = 0, reference_every = 0;
  std::string tier_text = "nvme", engine_text = "auto", grad_text = "fp32", copy_text = "none";
  std::string checksums_text = "on";
  std::string precision_text = "fp32";
  std::uint64_t checkpoint_every = 0;
  std::string checkpoint_dir, checkpoint_mode = "async";
  std::uint64_t idle_ms = 0;
  std::string dist_text = "auto";
  bool json = false;
  // Parsed from the texts above.
  StateTier tier = StateTier::kNvme;
  swap::IoEngineKind engine_kind = swap::IoEngineKind::kAuto;
  ElementType grad_dtype = ElementType::kF32;
  bool checksums = true;
  adam::StatePrecision precision = adam::StatePrecision::kF32;
  std::optional<ElementType> copy_dtype;
  bool checkpoint_async = true;
};

// Declares the options on `cli`, bound to `o`.
void declare_options(Cli& cli, StepOptions& o) {
  cli.texts("--dir", o.dirs, "DIR", "directory for the state (repeatable: striped over the files)",
            "./zinf-scratch, created if missing");
  cli.count("--numel", o.numel, "parameters", 0, UINT64_MAX,
            "256M: 3 GiB of state, 1 GiB of fp32 gradients");
  cli.count("--sub-group", o.sub_group,
            "elements per sub-group (0: records of 12 MiB, the library's default: 1M fp32, 1.5M "
            "bf16, 2054336 int8 elements)",
            0, UINT64_MAX, "0");
  cli.count("--depth", o.depth, "ring buffers of one sub-group each, >= 3");
  cli.count("--threads", o.threads,
            "CPU Adam threads including the caller (0 = one per hardware "
            "thread)",
            0, 1024);  // CpuAdam's limit
  cli.text("--tier", o.tier_text, "T", "nvme | cpu");
  cli.count("--steps", o.steps, "timed steps after one untimed warm-up");
  cli.text("--engine", o.engine_text, "KIND", "auto | uring | threads");
  cli.count("--queue-depth", o.queue_depth, "I/O requests in flight");
  cli.text("--grad-dtype", o.grad_text, "T", "fp32 | bf16 | fp16");
  cli.text("--copy-out", o.copy_text, "T",
           "none | bf16 | fp16: also write the low-precision "
           "parameters");
  cli.text("--state-precision", o.precision_text, "P",
           "fp32 | bf16 | int8: how the moments are stored (zinf.state_precision)");
  cli.text("--checksums", o.checksums_text, "on|off",
           "CRC32C per stripe of the swap files, computed on every write-back and verified "
           "on every read, as the library does by default; off measures the cost of that");
  cli.size("--budget", o.budget, "pinned-memory budget",
           "the ring or the state, whichever the tier "
           "needs");
  cli.count("--reference", o.reference_every,
            "every N timed steps, measure the references the "
            "steps are judged by (below); 0 = never");
  cli.count("--checkpoint-every", o.checkpoint_every,
            "checkpoint the optimizer after timed steps 1, 1+N, 1+2N, ... (0 = never); the "
            "mean iteration (step + checkpoint call, and the last save's wait) is reported");
  cli.text("--checkpoint-dir", o.checkpoint_dir, "DIR",
           "where --checkpoint-every writes (its last checkpoint stays there)");
  cli.text("--checkpoint-mode", o.checkpoint_mode, "M",
           "async | sync: save_async (written while the next steps run) or save");
  cli.count("--idle-ms", o.idle_ms,
            "host time between steps, standing for a trainer's forward and backward (the "
            "optimizer's drive is idle then; an asynchronous checkpoint can use it); counted "
            "in the iteration, not in the step",
            0, 3600000);
  cli.flag("--json", o.json, "one JSON object on stdout instead of the table");
  cli.text("--dist", o.dist_text, "M",
           "auto | none | mpi: under mpirun, weak scaling with --numel per rank, each rank's "
           "state in <dir>/rank<R> (auto: when a launcher set OMPI_COMM_WORLD_SIZE or "
           "PMI_SIZE > 1); rank 0 reports the one-rank step, the sharded step and their ratio",
           "auto");
  cli.refuse("--runtime", "--runtime: zinf bench step runs a number of steps; set --steps");
}

// Parses and checks the options (the scratch directory made where the tier needs one);
// nullopt when --help was given (and printed).
std::optional<StepOptions> parse_options(const std::vector<std::string>& tokens) {
  StepOptions o;
  Cli cli("bench step", kAbout, kFooter);
  declare_options(cli, o);
  if (!cli.parse(tokens)) return std::nullopt;
  o.tier = optim::parse_state_tier(o.tier_text, "--tier");
  o.engine_kind = swap::parse_io_engine_kind(o.engine_text);
  o.grad_dtype = parse_dtype(o.grad_text, "--grad-dtype");
  o.checksums = parse_on_off(o.checksums_text, "--checksums");
  o.precision = adam::parse_state_precision(o.precision_text, "--state-precision");

  check_numel(o.numel);
  if (o.depth < 3 || o.depth > 64) throw UsageError("--depth must be in [3, 64]");
  if (o.steps == 0) throw UsageError("--steps must be at least 1");
  if (o.reference_every > o.steps) {
    throw UsageError("--reference " + std::to_string(o.reference_every) + " exceeds --steps " +
                     std::to_string(o.steps) +
                     ": the references must bracket at least one block of steps");
  }
  if (o.checkpoint_mode != "async" && o.checkpoint_mode != "sync") {
    throw UsageError("--checkpoint-mode must be async or sync, got '" + o.checkpoint_mode + "'");
  }
  if (o.checkpoint_every > 0 && o.checkpoint_dir.empty()) {
    throw UsageError("--checkpoint-every needs --checkpoint-dir");
  }
  o.checkpoint_async = o.checkpoint_mode == "async";
  if (o.queue_depth == 0 || o.queue_depth > 4096)
    throw UsageError("--queue-depth must be in [1, 4096]");
  o.copy_dtype = parse_copy_out(o.copy_text);
  if (o.tier == StateTier::kNvme) default_scratch_dir(o.dirs);
  for (const auto& d : o.dirs) {
    if (!std::filesystem::is_directory(d)) throw UsageError("not a directory: " + d);
  }
  return o;
}

// The optimizer the options describe. Sets o.sub_group to the sub-group the records will use.
optim::OptimizerOptions optimizer_options(StepOptions& so) {
  optim::OptimizerOptions o;
  o.tier = so.tier;
  if (so.sub_group != 0 && so.sub_group < offload::kConfigMinSubGroupSize) {
    // The ds_config's limit on every door: a record per sub-group padded to 4 KiB.
    throw UsageError("invalid --sub-group '" + std::to_string(so.sub_group) + "': at least " +
                     std::to_string(offload::kConfigMinSubGroupSize) +
                     " elements (as zero_optimization.sub_group_size), or 0 for the default");
  }
  o.sub_group_elements = so.sub_group;
  o.pipeline_depth = static_cast<std::uint32_t>(so.depth);
  o.hyper.lr = 1e-3;
  o.hyper.weight_decay = 0.01;
  o.hyper.mode = adam::AdamMode::kAdamW;
  o.adam.threads = so.threads;
  o.directories = so.dirs;
  o.io.kind = so.engine_kind;
  o.io.queue_depth = static_cast<std::uint32_t>(so.queue_depth);
  o.swap_checksums = so.checksums;
  o.state_precision = so.precision;
  // What the records will use (0: the precision's default; a size that splits the group may be
  // cut to fill whole stripe units, e.g. int8's 1M), so that the budget below and the report
  // say what ran.
  o.sub_group_elements = optim::effective_sub_group_elements(o, {{"bench", so.numel}});
  so.sub_group = o.sub_group_elements;
  const std::uint64_t sub_group = so.sub_group, numel = so.numel;
  // Unless told, the budget is exactly what the tier needs (the optimizer checks it).
  const std::uint64_t record_elems = std::min(sub_group, numel);
  const std::uint64_t record =
      (record_elems * 4 + adam::moment_bytes(so.precision, record_elems) + 4095) / 4096 * 4096;
  o.pinned_budget_bytes = so.budget != 0 ? so.budget
                                         : (so.tier == StateTier::kNvme
                                                ? so.depth * record
                                                : ((numel + sub_group - 1) / sub_group) * record);
  if (so.budget == 0) o.pinned_budget_bytes += std::uint64_t{64} << 20;  // alignment > 4096
  return o;
}

// Under mpirun: the options that time what one process does around its step are refused, named,
// so that none is dropped silently (the sharded step takes fp32 gradients and returns fp32
// parameters).
void refuse_one_process_options(const StepOptions& o) {
  std::string given;
  auto refuse = [&given](bool set, const char* name) {
    if (set) given += std::string(given.empty() ? "" : ", ") + name;
  };
  refuse(o.reference_every > 0, "--reference");
  refuse(o.checkpoint_every > 0, "--checkpoint-every");
  refuse(!o.checkpoint_dir.empty(), "--checkpoint-dir");
  refuse(o.idle_ms > 0, "--idle-ms");
  refuse(o.grad_dtype != ElementType::kF32, "--grad-dtype");
  refuse(o.copy_dtype.has_value(), "--copy-out");
  if (!given.empty()) {
    throw UsageError(
        "under mpirun bench step measures weak scaling (the sharded optimizer: fp32 "
        "gradients, no copy-out); these options are for one process: " +
        given);
  }
}

// What the one-process run measured.
struct StepRun {
  std::vector<optim::StepStats> all;  // the timed steps'
  std::vector<StepReference::Figures> refs;
  std::vector<double> ideal_s, ratio;
  std::vector<double> iteration_s;  // step() plus the checkpoint call, per timed step
  std::uint64_t checkpoints = 0;
  std::uint64_t reflinked = 0;  // save_async calls that cloned (last_save_snapshot)
  double final_wait_s = 0;
};

// The timed steps: one untimed warm-up, then --steps steps with the checkpoints, the idle time
// and the references (--reference) between them.
StepRun run_steps(OffloadedOptimizer& opt, const optim::OptimizerOptions& o,
                  const StepOptions& so) {
  const std::size_t n = so.numel;
  const std::size_t grad_bytes = so.grad_dtype == ElementType::kF32 ? 4 : 2;
  // One array serves first as the initial fp32 parameters, then as the gradients.
  HostArray mem(n * 4, "bench step");
  {
    auto p = mem.as<float>(n);
    for (std::size_t i = 0; i < n; ++i) p[i] = bench_param(i);
    opt.set_params(0, p);
  }
  fill_bench_grads(mem.as<std::byte>(n * grad_bytes).data(), n, so.grad_dtype);
  const GradView grads{mem.as<std::byte>(n * grad_bytes).data(), n, so.grad_dtype};
  std::unique_ptr<HostArray> out_mem;
  adam::CopyOut out;
  if (so.copy_dtype) {
    out_mem = std::make_unique<HostArray>(n * 2, "bench step");
    out = adam::CopyOut{out_mem->as<std::uint16_t>(n).data(), n, *so.copy_dtype, true};
  }
  const optim::GroupGrads gg{0, grads, out};

  StepRun r;
  std::unique_ptr<StepReference> ref;
  Progress progress("zinf bench step", static_cast<double>(so.steps + 1), "steps", !so.json);
  for (std::uint64_t s = 0; s <= so.steps; ++s) {  // s == 0: untimed warm-up
    throw_if_interrupted();  // between steps: nothing in flight, the optimizer's files go with it
    progress.update(static_cast<double>(s));
    if (s == 1 && so.reference_every > 0) {
      // After the warm-up, which says how many bytes a step moves.
      ref = std::make_unique<StepReference>(
          so.tier == StateTier::kNvme ? so.dirs : std::vector<std::string>{},
          r.all.front().bytes_read, o.io, n, o.adam, grads, out, so.precision);
    }
    if (ref && (s - 1) % so.reference_every == 0) r.refs.push_back(ref->measure(o.hyper));
    const auto it0 = std::chrono::steady_clock::now();
    r.all.push_back(opt.step(std::span<const optim::GroupGrads>(&gg, 1)));
    // After timed steps 1, 1 + N, 1 + 2N, ...: each checkpoint has N - 1 steps of the run
    // after it to overlap (and the final wait_save is counted below).
    if (so.checkpoint_every > 0 && s > 0 && (s - 1) % so.checkpoint_every == 0) {
      if (so.checkpoint_async) {
        opt.save_async(so.checkpoint_dir);  // waits for the previous one first
        // Cloned from the swap files (XFS, btrfs) or streamed: the two cost the steps
        // differently, so a result says which it measured.
        if (opt.last_save_snapshot() == optim::SaveSnapshot::kReflink) ++r.reflinked;
      } else {
        opt.save(so.checkpoint_dir);
      }
      ++r.checkpoints;
    }
    if (so.idle_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(so.idle_ms));
    if (s > 0) r.iteration_s.push_back(seconds_since(it0));
  }
  {
    // The last save is part of the run: the iterations' total includes waiting for it.
    const auto w0 = std::chrono::steady_clock::now();
    opt.wait_save();
    r.final_wait_s = seconds_since(w0);
  }
  progress.finish();
  r.all.erase(r.all.begin());  // the warm-up
  if (ref) {
    // The closing reference, then each step against the mean of the ideals around its block.
    r.refs.push_back(ref->measure(o.hyper));
    for (std::size_t i = 0; i < r.all.size(); ++i) {
      const std::size_t b = i / so.reference_every;
      const auto& st = r.all[i];
      r.ideal_s.push_back((r.refs[b].ideal(st.bytes_read, st.bytes_written) +
                           r.refs[b + 1].ideal(st.bytes_read, st.bytes_written)) /
                          2);
      r.ratio.push_back(st.seconds / r.ideal_s.back());
    }
  }
  return r;
}

// The figures the report gives, from the run.
struct StepSummary {
  std::vector<double> step_s;
  std::uint64_t snapshot_copy = 0;
  double snapshot_wait = 0;
  double iteration_mean = 0;
  std::vector<double> rr, rw, ra;  // the references' read and write rates, Adam seconds
  explicit StepSummary(const StepRun& r) {
    double iterations_total = r.final_wait_s;
    for (double t : r.iteration_s) iterations_total += t;
    iteration_mean = iterations_total / static_cast<double>(r.iteration_s.size());
    for (const auto& st : r.all) {
      snapshot_copy += st.snapshot_copy_bytes;
      snapshot_wait += st.snapshot_wait_seconds;
      step_s.push_back(st.seconds);
    }
    for (const auto& f : r.refs) {
      rr.push_back(f.read_gbps);
      rw.push_back(f.write_gbps);
      ra.push_back(f.adam_seconds);
    }
  }
};

// --json: one object on stdout.
void report_json(const StepOptions& so, const optim::OptimizerOptions& o,
                 const OffloadedOptimizer& opt, const StepRun& r) {
  const StepSummary sum(r);
  const Stages stages(r.all);
  const double step_med = stages.step;
  Json j = setup_json(o, so.numel, opt.engine_name(), so.steps);
  j["sub_groups"] = r.all.front().sub_groups;
  j["grad_dtype"] = std::string(element_type_name(so.grad_dtype));
  j["copy_out"] = so.copy_text;
  j["step_seconds"] = step_med;
  j["step_seconds_min"] = *std::min_element(sum.step_s.begin(), sum.step_s.end());
  stages.put(j);
  j["pinned_bytes_peak"] = opt.pinned_bytes_peak();
  j["elements_per_s"] = static_cast<double>(so.numel) / step_med;
  j["step_seconds_all"] = sum.step_s;
  // Wall time per timed step including the checkpoint calls and the final wait_save: what a
  // trainer's loop sees (the mean, as one step in N carries the checkpoint).
  j["iteration_seconds_mean"] = sum.iteration_mean;
  j["iteration_seconds_all"] = r.iteration_s;
  j["checkpoint_every"] = so.checkpoint_every;
  j["idle_ms"] = so.idle_ms;
  if (so.checkpoint_every > 0) {
    j["checkpoint_mode"] = so.checkpoint_mode;
    j["checkpoints"] = r.checkpoints;
    j["snapshots_by_reflink"] = r.reflinked;
    j["snapshot_copy_bytes"] = sum.snapshot_copy;
    j["snapshot_wait_seconds"] = sum.snapshot_wait;
    j["final_wait_seconds"] = r.final_wait_s;
  }
  if (so.reference_every > 0) {
    j["reference_every"] = so.reference_every;
    j["references"] = std::uint64_t{r.refs.size()};
    j["ref_read_gbps"] = median(sum.rr);
    j["ref_write_gbps"] = median(sum.rw);
    j["ref_adam_seconds"] = median(sum.ra);
    j["ideal_seconds"] = median(r.ideal_s);
    j["ratio_to_ideal"] = median(r.ratio);
    j["ratio_to_ideal_all"] = r.ratio;
    j["ref_read_gbps_all"] = sum.rr;
    j["ref_write_gbps_all"] = sum.rw;
  }
  j["dirs"] = so.dirs;
  std::printf("%s\n", json_text(j).c_str());
}

// The table.
void report_text(const StepOptions& so, const OffloadedOptimizer& opt, const StepRun& r) {
  const StepSummary sum(r);
  const Stages stages(r.all);
  const double step_med = stages.step;
  std::printf(
      "zinf bench step: tier=%s engine=%.*s numel=%llu sub-group=%llu (%llu) depth=%llu "
      "grad=%s copy-out=%s checksums=%s state=%s steps=%llu (median)\n",
      std::string(optim::state_tier_name(so.tier)).c_str(),
      static_cast<int>(opt.engine_name().size()), opt.engine_name().data(),
      static_cast<unsigned long long>(so.numel), static_cast<unsigned long long>(so.sub_group),
      static_cast<unsigned long long>(r.all.front().sub_groups),
      static_cast<unsigned long long>(so.depth),
      std::string(element_type_name(so.grad_dtype)).c_str(), so.copy_text.c_str(),
      so.checksums ? "on" : "off", std::string(adam::state_precision_name(so.precision)).c_str(),
      static_cast<unsigned long long>(so.steps));
  std::printf("  %-22s %10.3f s   (%.3f G elements/s)\n", "step", step_med,
              static_cast<double>(so.numel) / step_med / 1e9);
  stages.print("  ");
  if (so.checkpoint_every > 0) {
    std::printf("  %-22s %10.3f s   (mean; %llu %s checkpoints, every %llu steps)\n", "iteration",
                sum.iteration_mean, static_cast<unsigned long long>(r.checkpoints),
                so.checkpoint_mode.c_str(), static_cast<unsigned long long>(so.checkpoint_every));
    std::printf("  %-22s %10.1f MiB copied, %.3f s waited (%llu of the saves by reflink)\n",
                "snapshot (steps)", static_cast<double>(sum.snapshot_copy) / (1 << 20),
                sum.snapshot_wait, static_cast<unsigned long long>(r.reflinked));
  } else {
    std::printf("  %-22s %10.3f s   (mean)\n", "iteration", sum.iteration_mean);
  }
  std::printf("  %-22s %10.3f s\n", "pipeline waiting", stages.wait);
  // %14s: the %10.1f column of the rows above, with " MiB" after it.
  std::printf("  %-22s %14s\n", "pinned peak", mib(opt.pinned_bytes_peak()).c_str());
  if (so.reference_every > 0) {
    std::printf(
        "references (median of %zu): drive read %.2f GB/s, write %.2f GB/s, "
        "Adam alone %.3f s\n",
        r.refs.size(), median(sum.rr), median(sum.rw), median(sum.ra));
    std::printf("  %-22s %10.3f s\n", "ideal", median(r.ideal_s));
    std::printf("  %-22s %10.3f   (median of the steps' own ratios)\n", "step / ideal",
                median(r.ratio));
  }
}

}  // namespace

int bench_step_main(const std::vector<std::string>& tokens) {
  std::optional<StepOptions> parsed = parse_options(tokens);
  if (!parsed) return 0;
  StepOptions& so = *parsed;
  const optim::OptimizerOptions o = optimizer_options(so);

  DistJob job(parse_dist_mode(so.dist_text), std::chrono::minutes(10));
  if (job.size() > 1) {
    refuse_one_process_options(so);
    return run_weak_scaling(o, so.numel, so.steps, so.json, job.comm());
  }
  OffloadedOptimizer opt(o, {{"params", so.numel}});
  const StepRun r = run_steps(opt, o, so);
  if (so.json) {
    report_json(so, o, opt, r);
  } else {
    report_text(so, opt, r);
  }
  return 0;
}

}  // namespace zinf::tools
