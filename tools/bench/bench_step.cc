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
#include "zinf/common/error.h"
#include "zinf/dist/collectives.h"
#include "zinf/dist/rank_directory.h"
#include "zinf/dist/sharded_optimizer.h"
#include "zinf/offload/config.h"
#include "zinf/offload/optimizer.h"

namespace zinf::tools {
namespace {

using adam::GradView;
using offload::OffloadedOptimizer;
using offload::StateTier;

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

// The ideal steps are judged by, measured around them (--reference K): the drive's own rates
// from one write and one read pass of the state's size, and the Adam kernel alone on arrays in
// memory. Interleaving them with the steps puts each step within a few seconds of its
// references, which matters on shared virtual disks whose rate moves 2-3x from one minute to
// the next; the mean of the references before and after a block stands for the block.
class StepReference {
 public:
  StepReference(const std::vector<std::string>& dirs, std::uint64_t state_bytes,
                const swap::IoOptions& io, std::size_t numel, const adam::CpuAdamOptions& adam,
                const GradView& grads, const adam::CopyOut& out, adam::StatePrecision precision)
      : n_(numel),
        grads_(grads),
        out_(out),
        adam_(adam),
        precision_(precision),
        mem_(numel * 4 + adam::moment_bytes(precision, numel), "bench step --reference") {
    if (!dirs.empty()) {
      IoBenchOptions bo;
      bo.dirs = dirs;
      // At least one request per file; the state's bytes rounded up to whole requests.
      const std::uint64_t per_file =
          (state_bytes / dirs.size() + io.block_size - 1) / io.block_size;
      bo.size = std::max<std::uint64_t>(per_file, 1) * io.block_size * dirs.size();
      bo.io = io;
      bo.file_stem = "zinf-bench-step-ref";
      io_.emplace(bo);
      io_->write();  // lays the files out: the timed writes are overwrites, as the step's are
    }
    auto p = mem_.as<float>(n_);
    for (std::size_t i = 0; i < n_; ++i) p[i] = bench_param(i);
    auto moments = mem_.as<std::byte>(n_ * 4 + adam::moment_bytes(precision_, n_)).subspan(n_ * 4);
    std::fill(moments.begin(), moments.end(), std::byte{0});  // zero moments in every precision
  }

  struct Figures {
    double read_gbps = 0;  // 0 without I/O (tier cpu)
    double write_gbps = 0;
    double adam_seconds = 0;
    double ideal(std::uint64_t bytes_read, std::uint64_t bytes_written) const {
      double io = 0;
      if (read_gbps > 0) io += static_cast<double>(bytes_read) / (read_gbps * 1e9);
      if (write_gbps > 0) io += static_cast<double>(bytes_written) / (write_gbps * 1e9);
      return std::max(io, adam_seconds);
    }
  };

  Figures measure(adam::AdamParams hp) {
    Figures f;
    if (io_) {
      f.write_gbps = io_->write().gbps();
      f.read_gbps = io_->read().gbps();
    }
    ++step_;
    hp.step = step_;
    const adam::CompactMoments moments = adam::compact_moments_at(
        precision_, n_,
        mem_.as<std::byte>(n_ * 4 + adam::moment_bytes(precision_, n_)).data() + n_ * 4);
    const auto t0 = std::chrono::steady_clock::now();
    adam_.step(hp, mem_.as<float>(n_), moments, grads_, out_);
    f.adam_seconds = seconds_since(t0);
    return f;
  }

 private:
  std::size_t n_;
  GradView grads_;
  adam::CopyOut out_;
  adam::CpuAdam adam_;
  adam::StatePrecision precision_;
  HostArray mem_;
  std::optional<IoBench> io_;
  std::uint64_t step_ = 0;
};

// The median of each stage's busy time over the timed steps, and the bytes one step moves:
// the breakdown both the one-process run and the weak-scaling run report.
struct Stages {
  double step = 0;
  double read = 0;
  double write = 0;
  double compute = 0;
  double wait = 0;
  std::uint64_t bytes_read = 0;
  std::uint64_t bytes_written = 0;

  explicit Stages(const std::vector<offload::StepStats>& all) {
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

  // The stage medians as --json names them (step_seconds is the caller's: its step differs).
  void put(Json& j) const {
    j["read_seconds"] = read;
    j["write_seconds"] = write;
    j["compute_seconds"] = compute;
    j["wait_seconds"] = wait;
    j["bytes_read"] = bytes_read;
    j["bytes_written"] = bytes_written;
  }

  // The table's read, write and compute rows, each label after `indent`.
  void print(const char* indent) const {
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
};

// The --json fields that say what was run, for both modes.
Json setup_json(const offload::OptimizerOptions& o, std::uint64_t numel, std::string_view engine,
                std::uint64_t steps) {
  Json j;
  j["bench"] = "step";
  j["tier"] = std::string(offload::state_tier_name(o.tier));
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

// Weak scaling under mpirun: one group of N x numel parameters, sharded over the N ranks (each
// updates numel of them in its own <dir>/rank<R>), against rank 0 stepping an optimizer of
// numel parameters alone. Rounds alternate the two: a barrier, rank 0's step alone (the
// others wait at the next barrier), then every rank's sharded step; round 0 warms both up and
// is not counted. A round's sharded time is its slowest rank's (all-gathered).
int run_weak_scaling(const offload::OptimizerOptions& o, std::uint64_t numel, std::uint64_t steps,
                     bool json, dist::Collectives& comm) {
  const int n = comm.size();
  const bool leader = comm.rank() == 0;
  const std::size_t per_rank = numel;
  const std::size_t global = per_rank * static_cast<std::size_t>(n);
  // The full parameters (the initial values, then every step's all-gathered result) and this
  // rank's gradients of all of them, a stretch of the generator of its own.
  HostArray param_mem(global * 4, "bench step"), grad_mem(global * 4, "bench step");
  const std::span<float> params = param_mem.as<float>(global);
  const std::span<float> grads = grad_mem.as<float>(global);
  for (std::size_t i = 0; i < global; ++i) params[i] = bench_param(i);
  fill_bench_grads(grads.data(), global, DType::kF32,
                   static_cast<std::size_t>(comm.rank()) * global);

  dist::ShardedOptimizer sharded(o, {{"params", global}}, comm);  // makes <dir>/rank<R>
  sharded.set_params(0, params);
  // Rank 0's one-rank step: bench step's own optimizer over its first numel parameters and
  // gradients, its files beside its shard's in <dir>/rank0 (unnamed: the two never meet).
  std::unique_ptr<OffloadedOptimizer> alone;
  if (leader) {
    offload::OptimizerOptions ao = o;
    if (ao.tier == StateTier::kNvme) {
      for (auto& d : ao.directories) d = dist::rank_directory(d, 0);
    }
    alone = std::make_unique<OffloadedOptimizer>(
        ao, std::vector<offload::ParamGroupSpec>{{"params", per_rank}});
    alone->set_params(0, params.first(per_rank));
  }
  const offload::GroupGrads alone_grads{0, GradView{grads.data(), per_rank, DType::kF32}, {}};
  const std::span<const float> grad_spans[1] = {grads};
  const std::span<float> param_spans[1] = {params};

  std::vector<offload::StepStats> alone_stats, sharded_stats;  // this rank's optimizer's
  std::vector<double> alone_s, mine_s, slowest_s, exchange_s;
  std::vector<double> round_s(static_cast<std::size_t>(n));
  Progress progress("zinf bench step", static_cast<double>(steps + 1), "rounds", leader && !json);
  for (std::uint64_t s = 0; s <= steps; ++s) {  // s == 0: untimed warm-up of both
    throw_if_interrupted();
    progress.update(static_cast<double>(s));
    comm.barrier();
    if (leader) {
      const auto t0 = std::chrono::steady_clock::now();
      const offload::StepStats st =
          alone->step(std::span<const offload::GroupGrads>(&alone_grads, 1));
      const double t = seconds_since(t0);
      if (s > 0) {
        alone_stats.push_back(st);
        alone_s.push_back(t);
      }
    }
    comm.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    const offload::StepStats st = sharded.step(grad_spans, param_spans);
    const double t = seconds_since(t0);
    dist::all_gather<double>(comm, std::span<const double>(&t, 1), round_s);
    if (s == 0) continue;
    sharded_stats.push_back(st);
    mine_s.push_back(t);
    // Outside this rank's optimizer: the gradients' reduce-scatter, the norm's all-reduce, the
    // parameters' all-gather, their copies, and waiting there for slower ranks.
    exchange_s.push_back(t - st.seconds);
    slowest_s.push_back(*std::max_element(round_s.begin(), round_s.end()));
  }
  progress.finish();

  // Every rank's medians: its whole sharded step and its optimizer's part of it.
  const Stages own_stages(sharded_stats);
  const double mine[2] = {median(mine_s), own_stages.step};
  std::vector<double> gathered(2 * static_cast<std::size_t>(n));
  dist::all_gather<double>(comm, std::span<const double>(mine, 2), gathered);
  if (!leader) return 0;
  std::vector<double> per_rank_step, per_rank_optimizer;
  for (int r = 0; r < n; ++r) {
    per_rank_step.push_back(gathered[2 * r]);
    per_rank_optimizer.push_back(gathered[2 * r + 1]);
  }
  const double alone_med = median(alone_s);
  const double sharded_med = median(slowest_s);
  const double ratio = sharded_med / alone_med;
  const Stages alone_stages(alone_stats);
  const Stages& rank0_stages = own_stages;  // this is rank 0
  if (json) {
    Json j = setup_json(o, per_rank, alone->engine_name(), steps);
    j["mode"] = "weak_scaling";
    j["ranks"] = n;
    j["collectives"] = std::string(comm.name());
    j["global_numel"] = std::uint64_t{global};
    j["alone_step_s"] = alone_med;
    j["sharded_step_s"] = sharded_med;
    j["weak_scaling_ratio"] = ratio;
    j["per_rank_step_s"] = per_rank_step;
    j["per_rank_optimizer_s"] = per_rank_optimizer;
    j["rank0_exchange_s"] = median(exchange_s);
    j["alone_step_s_all"] = alone_s;
    j["sharded_step_s_all"] = slowest_s;
    Json a, r0;
    alone_stages.put(a);
    rank0_stages.put(r0);
    j["alone"] = std::move(a);
    j["rank0_optimizer"] = std::move(r0);
    j["dirs"] = o.directories;
    std::printf("%s\n", json_text(j).c_str());
    return 0;
  }
  std::printf(
      "zinf bench step: %d ranks (%s), weak scaling: %llu parameters per rank (%llu in all, "
      "rank<R> folders), tier=%s engine=%.*s sub-group=%llu depth=%u state=%s steps=%llu "
      "(median)\n",
      n, std::string(comm.name()).c_str(), static_cast<unsigned long long>(per_rank),
      static_cast<unsigned long long>(global),
      std::string(offload::state_tier_name(o.tier)).c_str(),
      static_cast<int>(alone->engine_name().size()), alone->engine_name().data(),
      static_cast<unsigned long long>(o.sub_group_elements), o.pipeline_depth,
      std::string(adam::state_precision_name(o.state_precision)).c_str(),
      static_cast<unsigned long long>(steps));
  std::printf("  %-22s %10.3f s   (rank 0 alone, %llu parameters)\n", "one-rank step", alone_med,
              static_cast<unsigned long long>(per_rank));
  alone_stages.print("    ");
  std::string ranks;
  for (int r = 0; r < n; ++r) {
    char cell[32];
    std::snprintf(cell, sizeof cell, "%s%.3f", r == 0 ? "" : " ", per_rank_step[r]);
    ranks += cell;
  }
  std::printf("  %-22s %10.3f s   (the slowest rank's; per rank %s s)\n", "sharded step",
              sharded_med, ranks.c_str());
  std::printf("  %-22s %10.3f s\n", "  rank 0's optimizer", rank0_stages.step);
  rank0_stages.print("      ");
  std::printf("  %-22s %10.3f s   (reduce-scatter, all-reduce, all-gather, waits)\n",
              "  rank 0's exchange", median(exchange_s));
  std::printf("  %-22s %10.3f     (sharded / one-rank; the target is <= 1.10)\n",
              "weak scaling ratio", ratio);
  return 0;
}

}  // namespace

int bench_step_main(const std::vector<std::string>& tokens) {
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
  Cli cli("bench step", kAbout, kFooter);
  cli.texts("--dir", dirs, "DIR", "directory for the state (repeatable: striped over the files)",
            "./zinf-scratch, created if missing");
  cli.count("--numel", numel, "parameters", 0, UINT64_MAX,
            "256M: 3 GiB of state, 1 GiB of fp32 gradients");
  cli.count("--sub-group", sub_group,
            "elements per sub-group (0: records of 12 MiB, the library's default: 1M fp32, 1.5M "
            "bf16, 2054336 int8 elements)",
            0, UINT64_MAX, "0");
  cli.count("--depth", depth, "ring buffers of one sub-group each, >= 3");
  cli.count("--threads", threads,
            "CPU Adam threads including the caller (0 = one per hardware "
            "thread)",
            0, 1024);  // CpuAdam's limit
  cli.text("--tier", tier_text, "T", "nvme | cpu");
  cli.count("--steps", steps, "timed steps after one untimed warm-up");
  cli.text("--engine", engine_text, "KIND", "auto | uring | threads");
  cli.count("--queue-depth", queue_depth, "I/O requests in flight");
  cli.text("--grad-dtype", grad_text, "T", "fp32 | bf16 | fp16");
  cli.text("--copy-out", copy_text, "T",
           "none | bf16 | fp16: also write the low-precision "
           "parameters");
  cli.text("--state-precision", precision_text, "P",
           "fp32 | bf16 | int8: how the moments are stored (zinf.state_precision)");
  cli.text("--checksums", checksums_text, "on|off",
           "CRC32C per stripe of the swap files, computed on every write-back and verified "
           "on every read, as the library does by default; off measures the cost of that");
  cli.size("--budget", budget, "pinned-memory budget",
           "the ring or the state, whichever the tier "
           "needs");
  cli.count("--reference", reference_every,
            "every N timed steps, measure the references the "
            "steps are judged by (below); 0 = never");
  cli.count("--checkpoint-every", checkpoint_every,
            "checkpoint the optimizer after timed steps 1, 1+N, 1+2N, ... (0 = never); the "
            "mean iteration (step + checkpoint call, and the last save's wait) is reported");
  cli.text("--checkpoint-dir", checkpoint_dir, "DIR",
           "where --checkpoint-every writes (its last checkpoint stays there)");
  cli.text("--checkpoint-mode", checkpoint_mode, "M",
           "async | sync: save_async (written while the next steps run) or save");
  cli.count("--idle-ms", idle_ms,
            "host time between steps, standing for a trainer's forward and backward (the "
            "optimizer's drive is idle then; an asynchronous checkpoint can use it); counted "
            "in the iteration, not in the step",
            0, 3600000);
  cli.flag("--json", json, "one JSON object on stdout instead of the table");
  cli.text("--dist", dist_text, "M",
           "auto | none | mpi: under mpirun, weak scaling with --numel per rank, each rank's "
           "state in <dir>/rank<R> (auto: when a launcher set OMPI_COMM_WORLD_SIZE or "
           "PMI_SIZE > 1); rank 0 reports the one-rank step, the sharded step and their ratio",
           "auto");
  cli.refuse("--runtime", "--runtime: zinf bench step runs a number of steps; set --steps");
  if (!cli.parse(tokens)) return 0;
  const StateTier tier = offload::parse_state_tier(tier_text, "--tier");
  const auto engine_kind = swap::parse_io_engine_kind(engine_text);
  const DType grad_dtype = parse_dtype(grad_text, "--grad-dtype");
  const bool checksums = parse_on_off(checksums_text, "--checksums");
  const adam::StatePrecision precision =
      adam::parse_state_precision(precision_text, "--state-precision");

  check_numel(numel);
  if (depth < 3 || depth > 64) throw UsageError("--depth must be in [3, 64]");
  if (steps == 0) throw UsageError("--steps must be at least 1");
  if (reference_every > steps) {
    throw UsageError("--reference " + std::to_string(reference_every) + " exceeds --steps " +
                     std::to_string(steps) +
                     ": the references must bracket at least one block of steps");
  }
  if (checkpoint_mode != "async" && checkpoint_mode != "sync") {
    throw UsageError("--checkpoint-mode must be async or sync, got '" + checkpoint_mode + "'");
  }
  if (checkpoint_every > 0 && checkpoint_dir.empty()) {
    throw UsageError("--checkpoint-every needs --checkpoint-dir");
  }
  const bool checkpoint_async = checkpoint_mode == "async";
  if (queue_depth == 0 || queue_depth > 4096)
    throw UsageError("--queue-depth must be in [1, 4096]");
  const std::optional<DType> copy_dtype = parse_copy_out(copy_text);
  if (tier == StateTier::kNvme) default_scratch_dir(dirs);
  for (const auto& d : dirs) {
    if (!std::filesystem::is_directory(d)) throw UsageError("not a directory: " + d);
  }

  offload::OptimizerOptions o;
  o.tier = tier;
  if (sub_group != 0 && sub_group < offload::kConfigMinSubGroupSize) {
    // The ds_config's limit on every door: a record per sub-group padded to 4 KiB.
    throw UsageError("invalid --sub-group '" + std::to_string(sub_group) + "': at least " +
                     std::to_string(offload::kConfigMinSubGroupSize) +
                     " elements (as zero_optimization.sub_group_size), or 0 for the default");
  }
  o.sub_group_elements = sub_group;
  o.pipeline_depth = static_cast<std::uint32_t>(depth);
  o.hyper.lr = 1e-3;
  o.hyper.weight_decay = 0.01;
  o.hyper.mode = adam::AdamMode::kAdamW;
  o.adam.threads = threads;
  o.directories = dirs;
  o.io.kind = engine_kind;
  o.io.queue_depth = static_cast<std::uint32_t>(queue_depth);
  o.swap_checksums = checksums;
  o.state_precision = precision;
  // What the records will use (0: the precision's default; a size that splits the group may be
  // cut to fill whole stripe units, e.g. int8's 1M), so that the budget below and the report
  // say what ran.
  o.sub_group_elements = offload::effective_sub_group_elements(o, {{"bench", numel}});
  sub_group = o.sub_group_elements;
  // Unless told, the budget is exactly what the tier needs (the optimizer checks it).
  const std::uint64_t record_elems = std::min(sub_group, numel);
  const std::uint64_t record =
      (record_elems * 4 + adam::moment_bytes(precision, record_elems) + 4095) / 4096 * 4096;
  o.pinned_budget_bytes =
      budget != 0 ? budget
                  : (tier == StateTier::kNvme ? depth * record
                                              : ((numel + sub_group - 1) / sub_group) * record);
  if (budget == 0) o.pinned_budget_bytes += std::uint64_t{64} << 20;  // room for alignment > 4096

  DistJob job(parse_dist_mode(dist_text), std::chrono::minutes(10));
  if (job.size() > 1) {
    // The sharded step takes fp32 gradients and returns fp32 parameters, and the options
    // below time what one process does around its step; named, so that none is dropped
    // silently.
    std::string given;
    auto refuse = [&given](bool set, const char* name) {
      if (set) given += std::string(given.empty() ? "" : ", ") + name;
    };
    refuse(reference_every > 0, "--reference");
    refuse(checkpoint_every > 0, "--checkpoint-every");
    refuse(!checkpoint_dir.empty(), "--checkpoint-dir");
    refuse(idle_ms > 0, "--idle-ms");
    refuse(grad_dtype != DType::kF32, "--grad-dtype");
    refuse(copy_dtype.has_value(), "--copy-out");
    if (!given.empty()) {
      throw UsageError(
          "under mpirun bench step measures weak scaling (the sharded optimizer: fp32 "
          "gradients, no copy-out); these options are for one process: " +
          given);
    }
    return run_weak_scaling(o, numel, steps, json, job.comm());
  }
  OffloadedOptimizer opt(o, {{"params", numel}});

  const std::size_t n = numel;
  const std::size_t grad_bytes = grad_dtype == DType::kF32 ? 4 : 2;
  // One array serves first as the initial fp32 parameters, then as the gradients.
  HostArray mem(n * 4, "bench step");
  {
    auto p = mem.as<float>(n);
    for (std::size_t i = 0; i < n; ++i) p[i] = bench_param(i);
    opt.set_params(0, p);
  }
  fill_bench_grads(mem.as<std::byte>(n * grad_bytes).data(), n, grad_dtype);
  const GradView grads{mem.as<std::byte>(n * grad_bytes).data(), n, grad_dtype};
  std::unique_ptr<HostArray> out_mem;
  adam::CopyOut out;
  if (copy_dtype) {
    out_mem = std::make_unique<HostArray>(n * 2, "bench step");
    out = adam::CopyOut{out_mem->as<std::uint16_t>(n).data(), n, *copy_dtype, true};
  }
  const offload::GroupGrads gg{0, grads, out};

  std::vector<offload::StepStats> all;
  std::unique_ptr<StepReference> ref;
  std::vector<StepReference::Figures> refs;
  std::vector<double> ideal_s, ratio;
  std::vector<double> iteration_s;  // step() plus the checkpoint call, per timed step
  std::uint64_t checkpoints = 0;
  std::uint64_t reflinked = 0;  // save_async calls that cloned (last_save_snapshot)
  double final_wait_s = 0;
  Progress progress("zinf bench step", static_cast<double>(steps + 1), "steps", !json);
  for (std::uint64_t s = 0; s <= steps; ++s) {  // s == 0: untimed warm-up
    throw_if_interrupted();  // between steps: nothing in flight, the optimizer's files go with it
    progress.update(static_cast<double>(s));
    if (s == 1 && reference_every > 0) {
      // After the warm-up, which says how many bytes a step moves.
      ref = std::make_unique<StepReference>(
          tier == StateTier::kNvme ? dirs : std::vector<std::string>{}, all.front().bytes_read,
          o.io, n, o.adam, grads, out, precision);
    }
    if (ref && (s - 1) % reference_every == 0) refs.push_back(ref->measure(o.hyper));
    const auto it0 = std::chrono::steady_clock::now();
    all.push_back(opt.step(std::span<const offload::GroupGrads>(&gg, 1)));
    // After timed steps 1, 1 + N, 1 + 2N, ...: each checkpoint has N - 1 steps of the run
    // after it to overlap (and the final wait_save is counted below).
    if (checkpoint_every > 0 && s > 0 && (s - 1) % checkpoint_every == 0) {
      if (checkpoint_async) {
        opt.save_async(checkpoint_dir);  // waits for the previous one first
        // Cloned from the swap files (XFS, btrfs) or streamed: the two cost the steps
        // differently, so a result says which it measured.
        if (opt.last_save_snapshot() == offload::SaveSnapshot::kReflink) ++reflinked;
      } else {
        opt.save(checkpoint_dir);
      }
      ++checkpoints;
    }
    if (idle_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(idle_ms));
    if (s > 0) iteration_s.push_back(seconds_since(it0));
  }
  {
    // The last save is part of the run: the iterations' total includes waiting for it.
    const auto w0 = std::chrono::steady_clock::now();
    opt.wait_save();
    final_wait_s = seconds_since(w0);
  }
  progress.finish();
  all.erase(all.begin());  // the warm-up
  if (ref) {
    // The closing reference, then each step against the mean of the ideals around its block.
    refs.push_back(ref->measure(o.hyper));
    for (std::size_t i = 0; i < all.size(); ++i) {
      const std::size_t b = i / reference_every;
      const auto& st = all[i];
      ideal_s.push_back((refs[b].ideal(st.bytes_read, st.bytes_written) +
                         refs[b + 1].ideal(st.bytes_read, st.bytes_written)) /
                        2);
      ratio.push_back(st.seconds / ideal_s.back());
    }
  }
  std::vector<double> step_s;
  std::uint64_t snapshot_copy = 0;
  double snapshot_wait = 0;
  double iterations_total = final_wait_s;
  for (double t : iteration_s) iterations_total += t;
  const double iteration_mean = iterations_total / static_cast<double>(iteration_s.size());
  for (const auto& st : all) {
    snapshot_copy += st.snapshot_copy_bytes;
    snapshot_wait += st.snapshot_wait_seconds;
    step_s.push_back(st.seconds);
  }
  const Stages stages(all);
  const double step_med = stages.step;
  std::vector<double> rr, rw, ra;  // the references' read and write rates, Adam seconds
  for (const auto& f : refs) {
    rr.push_back(f.read_gbps);
    rw.push_back(f.write_gbps);
    ra.push_back(f.adam_seconds);
  }
  const std::uint64_t sub_groups = all.front().sub_groups;
  if (json) {
    Json j = setup_json(o, numel, opt.engine_name(), steps);
    j["sub_groups"] = sub_groups;
    j["grad_dtype"] = std::string(dtype_name(grad_dtype));
    j["copy_out"] = copy_text;
    j["step_seconds"] = step_med;
    j["step_seconds_min"] = *std::min_element(step_s.begin(), step_s.end());
    stages.put(j);
    j["pinned_bytes_peak"] = opt.pinned_bytes_peak();
    j["elements_per_s"] = static_cast<double>(numel) / step_med;
    j["step_seconds_all"] = step_s;
    // Wall time per timed step including the checkpoint calls and the final wait_save: what a
    // trainer's loop sees (the mean, as one step in N carries the checkpoint).
    j["iteration_seconds_mean"] = iteration_mean;
    j["iteration_seconds_all"] = iteration_s;
    j["checkpoint_every"] = checkpoint_every;
    j["idle_ms"] = idle_ms;
    if (checkpoint_every > 0) {
      j["checkpoint_mode"] = checkpoint_mode;
      j["checkpoints"] = checkpoints;
      j["snapshots_by_reflink"] = reflinked;
      j["snapshot_copy_bytes"] = snapshot_copy;
      j["snapshot_wait_seconds"] = snapshot_wait;
      j["final_wait_seconds"] = final_wait_s;
    }
    if (ref) {
      j["reference_every"] = reference_every;
      j["references"] = std::uint64_t{refs.size()};
      j["ref_read_gbps"] = median(rr);
      j["ref_write_gbps"] = median(rw);
      j["ref_adam_seconds"] = median(ra);
      j["ideal_seconds"] = median(ideal_s);
      j["ratio_to_ideal"] = median(ratio);
      j["ratio_to_ideal_all"] = ratio;
      j["ref_read_gbps_all"] = rr;
      j["ref_write_gbps_all"] = rw;
    }
    j["dirs"] = dirs;
    std::printf("%s\n", json_text(j).c_str());
  } else {
    std::printf(
        "zinf bench step: tier=%s engine=%.*s numel=%llu sub-group=%llu (%llu) depth=%llu "
        "grad=%s copy-out=%s checksums=%s state=%s steps=%llu (median)\n",
        std::string(offload::state_tier_name(tier)).c_str(),
        static_cast<int>(opt.engine_name().size()), opt.engine_name().data(),
        static_cast<unsigned long long>(numel), static_cast<unsigned long long>(sub_group),
        static_cast<unsigned long long>(sub_groups), static_cast<unsigned long long>(depth),
        std::string(dtype_name(grad_dtype)).c_str(), copy_text.c_str(), checksums ? "on" : "off",
        std::string(adam::state_precision_name(precision)).c_str(),
        static_cast<unsigned long long>(steps));
    std::printf("  %-22s %10.3f s   (%.3f G elements/s)\n", "step", step_med,
                static_cast<double>(numel) / step_med / 1e9);
    stages.print("  ");
    if (checkpoint_every > 0) {
      std::printf("  %-22s %10.3f s   (mean; %llu %s checkpoints, every %llu steps)\n",
                  "iteration", iteration_mean, static_cast<unsigned long long>(checkpoints),
                  checkpoint_mode.c_str(), static_cast<unsigned long long>(checkpoint_every));
      std::printf("  %-22s %10.1f MiB copied, %.3f s waited (%llu of the saves by reflink)\n",
                  "snapshot (steps)", static_cast<double>(snapshot_copy) / (1 << 20), snapshot_wait,
                  static_cast<unsigned long long>(reflinked));
    } else {
      std::printf("  %-22s %10.3f s   (mean)\n", "iteration", iteration_mean);
    }
    std::printf("  %-22s %10.3f s\n", "pipeline waiting", stages.wait);
    // %14s: the %10.1f column of the rows above, with " MiB" after it.
    std::printf("  %-22s %14s\n", "pinned peak", mib(opt.pinned_bytes_peak()).c_str());
    if (ref) {
      std::printf(
          "references (median of %zu): drive read %.2f GB/s, write %.2f GB/s, "
          "Adam alone %.3f s\n",
          refs.size(), median(rr), median(rw), median(ra));
      std::printf("  %-22s %10.3f s\n", "ideal", median(ideal_s));
      std::printf("  %-22s %10.3f   (median of the steps' own ratios)\n", "step / ideal",
                  median(ratio));
    }
  }
  return 0;
}

}  // namespace zinf::tools
