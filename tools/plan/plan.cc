// SPDX-License-Identifier: Apache-2.0
// `zinf plan`: what fits where. Reads the model size, parallelism, offload choice and
// hardware from the command line (and drive bandwidth from `zinf tune`'s report), prints the
// per-GPU / per-node needs of each ZeRO setup and the least costly one that fits.
#include <algorithm>
#include <chrono>
#include <cstdio>

#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "args.h"
#include "bench_common.h"
#include "commands.h"
#include "json_out.h"
#include "plan_model.h"
#include "plan_print.h"
#include "plan_reports.h"
#include "wear.h"
#include "zinf/common/error.h"

namespace zinf::tools {
namespace {

constexpr const char* kAbout = R"(
Per-GPU memory of the model states for ZeRO stages 0-3 (the ZeRO paper's accounting), what
offloading the optimizer state and parameters to cpu or nvme moves where, and, given the
hardware, the least costly setup that fits. GB in the output means 10^9 bytes.)";

std::optional<double> as_double(const std::optional<std::uint64_t>& v) {
  if (!v) return std::nullopt;
  return static_cast<double>(*v);
}

// A memory limit with its unit: "40" as 40 bytes is never what a user of plan means (every GPU
// has gigabytes), so a bare number is refused with the reading they meant.
std::optional<std::uint64_t> memory_limit(const std::string& text, const char* what,
                                          const char* unit = "G") {
  if (text.empty()) return std::nullopt;
  if (text.find_first_not_of("0123456789.") == std::string::npos) {
    throw UsageError(std::string("invalid ") + what + " '" + text +
                     "': a memory size needs a unit; did you mean " + text + unit + "?");
  }
  return parse_size(text, what);
}

// NVMe I/O more than this many times the compute per step: the GPU waits on the drive however
// the I/O overlaps (prefetching hides I/O behind compute only up to the compute's length), and a
// factor this size is beyond what a tune report's figures are off by on a shared machine.
constexpr double kIoBoundRatio = 3;

// The command line, parsed and checked: the plan's input, and what the report needs besides.
struct PlanOptions {
  PlanInput in;
  ActivationShape shape;
  std::string params, bpp, opt, par, tune, tbw_text, drive, h2d_report, reserve_text;
  std::string layer_params_text;
  double step_seconds = 0, nvme_gbps = 0;
  bool largest = false;
  std::uint64_t gpus = 0, tp = 1, pp = 1, gpus_per_node = 8, nodes = 0;
  std::string gpu_mem_text, cpu_mem_text, nvme_free_text;
  bool json = false, wide = false;
  std::chrono::milliseconds compute{0};
  // Parsed from the texts above.
  std::optional<Tier> opt_tier, par_tier;
  bool h2d_simulated = false;
  double compute_s() const { return std::chrono::duration<double>(compute).count(); }
};

void declare_options(Cli& cli, PlanOptions& o) {
  cli.group("model");
  cli.text("--params", o.params, "N",
           "parameters of the whole model: 13e9, 13B, 1.3M, 350K (K/M/B = 10^3/10^6/10^9, "
           "as model sizes are counted)",
           "required");
  cli.text("--bytes-per-param", o.bpp, "P,G,O",
           "bytes per parameter of parameters, gradients, optimizer state "
           "(fp16 mixed precision with Adam; plain fp32: 4,4,8)",
           "2,2,12");
  cli.group("parallelism");
  cli.count("--gpus", o.gpus, "GPUs in the job", 0, UINT32_MAX, "1, or --nodes x --gpus-per-node");
  cli.count("--tp", o.tp, "tensor parallel degree; DP = GPUs / (TP x PP)");
  cli.count("--pp", o.pp, "pipeline parallel degree");
  cli.count("--gpus-per-node", o.gpus_per_node, "GPUs per node");
  cli.count("--nodes", o.nodes,
            "nodes in the job: --gpus is --nodes x --gpus-per-node (ranks per node) when not "
            "given",
            0, UINT32_MAX, "--gpus / --gpus-per-node");
  cli.group("offload (show only this placement; default: every candidate)");
  cli.text("--offload-optimizer", o.opt, "T", "none | cpu | nvme", "every candidate");
  cli.text("--offload-params", o.par, "T", "none | cpu | nvme (needs stage 3)", "every candidate");
  cli.count("--sub-group-size", o.in.sub_group_size,
            "optimizer sub-group elements, 4 of them pinned for nvme", 0, UINT64_MAX, "1e9");
  cli.group("activations (all five, or none)");
  cli.count("--seq-len", o.shape.seq_len, "sequence length", 0, UINT64_MAX, "none");
  cli.count("--hidden", o.shape.hidden, "hidden size", 0, UINT64_MAX, "none");
  cli.count("--layers", o.shape.layers, "transformer layers", 0, UINT64_MAX, "none");
  cli.count("--micro-batch", o.shape.micro_batch, "micro-batch per GPU", 0, UINT64_MAX, "none");
  cli.count("--heads", o.shape.heads, "attention heads", 0, UINT64_MAX, "none");
  cli.flag("--activation-checkpointing", o.shape.checkpointing,
           "full recomputation: keep only each layer's input");
  cli.group("hardware (limits not given are not checked; a recommendation needs --gpu-mem)");
  cli.text("--gpu-mem", o.gpu_mem_text, "SIZE",
           "memory per GPU with its unit, e.g. 80G (GiB) or 80GB (10^9 bytes)", "none");
  cli.text("--cpu-mem", o.cpu_mem_text, "SIZE", "host memory per node usable for pinned buffers",
           "none");
  cli.text("--nvme-free", o.nvme_free_text, "SIZE", "free NVMe space per node", "none");
  cli.text("--host-reserve", o.reserve_text, "SIZE",
           "host memory per node the pinned buffers must leave to the OS, its page cache and "
           "the training process (counted against --cpu-mem)",
           "0");
  cli.text("--tune", o.tune, "FILE",
           "`zinf tune --report FILE` output: drive bandwidth for I/O time");
  cli.number("--nvme-gbps", o.nvme_gbps,
             "the drives' read and write rate per node in GB/s, instead of --tune (use the "
             "sustained rate of a consumer drive)",
             "none");
  cli.number("--h2d-gbps", o.in.h2d_gbps,
             "pinned host <-> GPU copy rate per GPU in GB/s, for the PCIe time per step", "none");
  cli.text("--h2d", o.h2d_report, "FILE",
           "`zinf bench h2d --json` output: the pinned rates at its largest size, instead of "
           "--h2d-gbps",
           "none");
  cli.text("--layer-params", o.layer_params_text, "N",
           "parameters per layer, for the prefetch depth advice (default: --params / --layers)",
           "none");
  cli.duration("--compute-time", o.compute,
               "GPU compute (forward + backward) per step: a warning when a setup's NVMe I/O per "
               "step (from --tune) is more than 3x it",
               "none");
  cli.group("drive wear (of the recommended setup's NVMe writes)");
  cli.text("--tbw", o.tbw_text, "SIZE",
           "the drives' rated endurance per node, e.g. 600TB (10^12 bytes per TB, as rated)",
           "none");
  cli.number("--step-seconds", o.step_seconds,
             "expected seconds per training step (default: the NVMe I/O time per step from "
             "--tune, a lower bound, so the wear shown is the fastest it can be)",
             "from --tune");
  cli.text("--drive", o.drive, "DEV",
           "an NVMe device (/dev/nvme0) whose SMART log gives the data written so far and the "
           "life used; without --tbw, the endurance it implies",
           "none");
  cli.group("output");
  cli.flag("--largest", o.largest,
           "also the largest model each placement fits on this hardware (needs --gpu-mem; "
           "--params may be left out)");
  cli.flag("--wide", o.wide,
           "the full table (model states by kind, live parameters, activations; 140 columns) "
           "instead of the narrow one");
  cli.flag("--json", o.json, "one JSON object instead of the table");
}

// Parses and checks the options and reads the reports they name into o.in; nullopt when
// --help was given (and printed).
std::optional<PlanOptions> parse_options(const std::vector<std::string>& tokens) {
  PlanOptions o;
  PlanInput& in = o.in;
  Cli cli("plan", kAbout);
  declare_options(cli, o);
  if (!cli.parse(tokens)) return std::nullopt;
  if (o.nodes > 0) {
    if (o.gpus != 0 && o.gpus != o.nodes * o.gpus_per_node) {
      throw UsageError("--gpus " + std::to_string(o.gpus) + " is not --nodes " +
                       std::to_string(o.nodes) + " x --gpus-per-node " +
                       std::to_string(o.gpus_per_node) + " = " +
                       std::to_string(o.nodes * o.gpus_per_node) + ": give one of them");
    }
    o.gpus = o.nodes * o.gpus_per_node;
  }
  if (o.gpus == 0) o.gpus = 1;
  in.gpus = to_u32(o.gpus, "--gpus");
  in.tp = to_u32(o.tp, "--tp");
  in.pp = to_u32(o.pp, "--pp");
  in.gpus_per_node = to_u32(o.gpus_per_node, "--gpus-per-node");
  in.gpu_mem = as_double(memory_limit(o.gpu_mem_text, "--gpu-mem"));
  in.cpu_mem = as_double(memory_limit(o.cpu_mem_text, "--cpu-mem"));
  in.nvme_free = as_double(memory_limit(o.nvme_free_text, "--nvme-free"));
  if (o.params.empty() && !o.largest) {
    throw UsageError("--params is required (e.g. --params 13B)");
  }
  if (!o.params.empty()) in.params = parse_param_count(o.params, "--params");
  if (!o.reserve_text.empty()) {
    in.host_reserve = static_cast<double>(*memory_limit(o.reserve_text, "--host-reserve"));
  }
  if (!(o.nvme_gbps >= 0) || !(in.h2d_gbps >= 0)) {
    throw UsageError("invalid --nvme-gbps or --h2d-gbps: must be > 0");
  }
  if (o.nvme_gbps > 0 && !o.tune.empty()) {
    throw UsageError("give --tune or --nvme-gbps, not both: each sets the drive rates");
  }
  if (!o.h2d_report.empty()) {
    if (in.h2d_gbps > 0) throw UsageError("give --h2d or --h2d-gbps, not both");
    read_h2d_report(o.h2d_report, in, o.h2d_simulated);
  }
  if (o.nvme_gbps > 0) in.drive = DriveBandwidth{o.nvme_gbps, o.nvme_gbps, o.nvme_gbps};
  if (!o.bpp.empty()) in.bytes = parse_bytes_per_param(o.bpp);
  if (in.sub_group_size == 0) throw UsageError("invalid --sub-group-size: must be at least 1");
  const ActivationShape& shape = o.shape;
  if (shape.seq_len || shape.hidden || shape.layers || shape.micro_batch || shape.heads ||
      shape.checkpointing) {
    in.activations = shape;
  }
  if (!o.opt.empty()) o.opt_tier = parse_tier(o.opt, "--offload-optimizer");
  if (!o.par.empty()) o.par_tier = parse_tier(o.par, "--offload-params");
  if (!o.tune.empty()) in.drive = read_tune_report(o.tune);
  return o;
}

// --largest alone: only the hardware was described, so only the largest models are reported.
void report_hardware_only(const PlanOptions& o, const std::vector<LargestModel>& biggest) {
  const PlanInput& in = o.in;
  if (o.json) {
    Json head;
    head["gpus"] = std::uint64_t{in.gpus};
    head["host_reserve_bytes"] = in.host_reserve;
    head["largest"] = largest_json(biggest);
    std::printf("%s\n", json_text(head).c_str());
    return;
  }
  std::printf(
      "zinf plan: %u GPU%s (TP %u x PP %u), %u per node; bytes per parameter "
      "P,G,O = %g,%g,%g\n",
      in.gpus, in.gpus == 1 ? "" : "s", in.tp, in.pp, std::min(in.gpus_per_node, in.gpus),
      in.bytes.params, in.bytes.grads, in.bytes.optimizer);
  print_largest(biggest, in);
}

// What the plan advises besides the table: the prefetch depth, the drive wear and the
// I/O-bound warnings.
struct Advice {
  std::optional<PrefetchAdvice> prefetch;
  std::optional<WearEstimate> wear;
  std::optional<NvmeSmartLog> smart;
  std::string wear_note;
  double tbw = 0;
  std::vector<std::string> io_warnings;
};

// Prefetch depth for the recommended setup when its parameters live off the GPU: a layer's
// bytes from --layer-params or Ψ' / --layers, and the forward pass's compute per layer (a
// third of --compute-time: backward is about twice forward, so forward is the tight side).
std::optional<PrefetchAdvice> advise_prefetch(const Plan& plan, const PlanOptions& o) {
  const PlanInput& in = o.in;
  if (!plan.recommended || !(in.h2d_gbps > 0) ||
      plan.rows[*plan.recommended].setup.params == Tier::kGpu) {
    return std::nullopt;
  }
  const PlanRow& r = plan.rows[*plan.recommended];
  double layer_params = 0;
  if (!o.layer_params_text.empty()) {
    layer_params = parse_param_count(o.layer_params_text, "--layer-params");
  } else if (o.shape.layers > 0) {
    layer_params = plan.params_per_model_slice / static_cast<double>(o.shape.layers);
  }
  if (!(layer_params > 0)) return std::nullopt;
  const double layers = plan.params_per_model_slice / layer_params;
  const double compute_per_layer = o.compute_s() / (3.0 * layers);
  const double read_gbps = r.setup.params == Tier::kNvme && in.drive ? in.drive->read_gbps : 0.0;
  return prefetch_advice(layer_params * in.bytes.params, read_gbps, in.h2d_gbps, compute_per_layer);
}

Advice advise(const Plan& plan, const PlanOptions& o) {
  Advice a;
  a.prefetch = advise_prefetch(plan, o);

  // Wear of the recommended setup's drives, when asked for with --tbw or --drive.
  if (!o.tbw_text.empty()) a.tbw = static_cast<double>(*memory_limit(o.tbw_text, "--tbw", "TB"));
  if (!o.drive.empty()) {
    std::string why;
    a.smart = read_nvme_smart_log(o.drive, &why);
    if (!a.smart) a.wear_note = "SMART log not read: " + why;
    if (a.smart && a.tbw == 0 && a.smart->percentage_used > 0) {
      // The drive's own estimate: what it has written is percentage_used of its life.
      a.tbw = a.smart->bytes_written * 100.0 / a.smart->percentage_used;
    }
  }
  if (a.tbw > 0 && plan.recommended) {
    const PlanRow& r = plan.rows[*plan.recommended];
    const double secs = o.step_seconds > 0 ? o.step_seconds : r.io_seconds.value_or(0);
    if (r.nvme_write_per_step <= 0) {
      a.wear_note = "the recommended setup writes nothing to NVMe";
    } else if (secs <= 0) {
      a.wear_note = "give --step-seconds (or --tune for the I/O time) to estimate drive wear";
    } else {
      a.wear = estimate_wear(r.nvme_write_per_step, secs, a.tbw);
    }
  }

  // I/O-bound setups: the recommended one, or without a recommendation every one.
  const double compute_s = o.compute_s();
  for (std::size_t i = 0; compute_s > 0 && i < plan.rows.size(); ++i) {
    const PlanRow& r = plan.rows[i];
    if (plan.recommended && i != *plan.recommended) continue;
    if (!r.io_seconds || *r.io_seconds <= kIoBoundRatio * compute_s) continue;
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "%s: NVMe I/O of %.2f s per step is %.1fx the %.2f s of compute (more than "
                  "%.0fx): the GPU waits on the drive",
                  setup_name(r.setup).c_str(), *r.io_seconds, *r.io_seconds / compute_s, compute_s,
                  kIoBoundRatio);
    a.io_warnings.push_back(buf);
  }
  return a;
}

// --json: the plan, the advice and the largest models as one object.
void report_json(const PlanOptions& o, const Plan& plan, const Advice& a,
                 const std::vector<LargestModel>& biggest) {
  const PlanInput& in = o.in;
  Json head;
  head["params"] = in.params;
  head["bytes_per_param"] =
      std::vector<double>{in.bytes.params, in.bytes.grads, in.bytes.optimizer};
  head["gpus"] = std::uint64_t{in.gpus};
  head["tp"] = std::uint64_t{in.tp};
  head["pp"] = std::uint64_t{in.pp};
  head["dp"] = std::uint64_t{plan.dp};
  head["gpus_per_node"] = std::uint64_t{plan.gpus_per_node};
  head["nodes"] = std::uint64_t{plan.nodes};
  head["params_per_model_slice"] = plan.params_per_model_slice;
  head["activation_bytes"] = in.activations ? activation_bytes(*in.activations, in.tp) : 0.0;
  Json& setups = head["setups"] = Json::array();
  for (const PlanRow& row : plan.rows) setups.push_back(row_json(row));
  head["recommended"] = plan.recommended ? row_json(plan.rows[*plan.recommended]) : Json();
  if (o.compute_s() > 0) head["compute_seconds_per_step"] = o.compute_s();
  head["warnings"] = a.io_warnings;
  head["host_reserve_bytes"] = in.host_reserve;
  if (in.h2d_gbps > 0) {
    head["h2d_gbps"] = in.h2d_gbps;
    head["d2h_gbps"] = in.d2h_gbps > 0 ? in.d2h_gbps : in.h2d_gbps;
    head["h2d_simulated"] = o.h2d_simulated;
  }
  if (o.largest) head["largest"] = largest_json(biggest);
  if (a.prefetch) {
    Json pf;
    pf["layer_bytes"] = a.prefetch->layer_bytes;
    pf["nvme_seconds"] = a.prefetch->nvme_seconds;
    pf["h2d_seconds"] = a.prefetch->h2d_seconds;
    pf["latency_seconds"] = a.prefetch->latency_seconds;
    pf["compute_seconds"] = a.prefetch->compute_seconds;
    pf["depth"] = a.prefetch->depth ? Json(std::uint64_t{*a.prefetch->depth}) : Json();
    pf["stall_seconds"] = a.prefetch->stall_seconds;
    head["prefetch"] = pf;
  }
  if (a.wear || a.smart || !a.wear_note.empty()) {
    Json w;
    if (a.wear) {
      w["tbw_bytes"] = a.tbw;
      w["bytes_per_day"] = a.wear->bytes_per_day;
      w["days_to_rated"] = a.wear->days_to_rated;
      w["days_per_percent"] = a.wear->days_per_percent;
    }
    if (a.smart) {
      w["smart_percentage_used"] = std::uint64_t{a.smart->percentage_used};
      w["smart_bytes_written"] = a.smart->bytes_written;
    }
    if (!a.wear_note.empty()) w["note"] = a.wear_note;
    head["wear"] = w;
  }
  const std::string out = json_text(head);
  std::printf("%s\n", out.c_str());
}

// The text's first lines: the job, the activations, the drive and link rates.
void print_inputs(const PlanOptions& o, const Plan& plan) {
  const PlanInput& in = o.in;
  const std::string count = param_count_text(in.params);
  std::printf(
      "zinf plan: %s parameters, %u GPUs (TP %u x PP %u x DP %u), %u GPUs per node, "
      "%u node%s; bytes per parameter P,G,O = %g,%g,%g\n",
      count.c_str(), in.gpus, in.tp, in.pp, plan.dp, plan.gpus_per_node, plan.nodes,
      plan.nodes == 1 ? "" : "s", in.bytes.params, in.bytes.grads, in.bytes.optimizer);
  if (in.activations) {
    const auto& s = *in.activations;
    std::printf(
        "activations: %.2f GB per GPU (s=%llu b=%llu h=%llu a=%llu L=%llu, %s; "
        "Korthikanti et al. 2022)\n",
        gb(activation_bytes(s, in.tp)), static_cast<unsigned long long>(s.seq_len),
        static_cast<unsigned long long>(s.micro_batch), static_cast<unsigned long long>(s.hidden),
        static_cast<unsigned long long>(s.heads), static_cast<unsigned long long>(s.layers),
        s.checkpointing ? "full checkpointing" : "no checkpointing");
  }
  if (in.drive) {
    std::printf(
        "drives (from %s): read %.2f GB/s, write %.2f GB/s, optimizer read+write mix "
        "%.2f GB/s per node\n",
        o.tune.empty() ? "--nvme-gbps" : o.tune.c_str(), in.drive->read_gbps, in.drive->write_gbps,
        in.drive->mixed_gbps);
    if (in.drive->sustained_write_gbps > 0) {
      std::printf("  sustained writes: %.2f GB/s (the I/O time is at least the writes at it)\n",
                  in.drive->sustained_write_gbps);
    }
  }
  if (in.h2d_gbps > 0) {
    std::printf("PCIe: %.2f GB/s host->device, %.2f GB/s device->host per GPU%s\n", in.h2d_gbps,
                in.d2h_gbps > 0 ? in.d2h_gbps : in.h2d_gbps,
                o.h2d_simulated ? " (from the host simulation's copy path, not a PCIe link)" : "");
  }
}

// The collectives depend on the stage only: one line for the stages the table shows.
void print_collectives(const Plan& plan) {
  std::string line;
  for (int st = 0; st <= 3; ++st) {
    const auto it = std::find_if(plan.rows.begin(), plan.rows.end(),
                                 [st](const PlanRow& r) { return r.setup.stage == st; });
    if (it == plan.rows.end()) continue;
    char cell[160];
    std::snprintf(cell, sizeof cell, "%sstage %d %.2f GB", line.empty() ? "" : "; ", st,
                  gb(it->grad_reduce_per_step + it->allgather_per_step));
    line += cell;
    if (it->allgather_per_step > 0) {
      std::snprintf(cell, sizeof cell, " (%.2f GB of it parameter all-gathers)",
                    gb(it->allgather_per_step));
      line += cell;
    }
  }
  std::printf("collectives per step, received per GPU (x%u per node): %s\n", plan.gpus_per_node,
              line.c_str());
}

// The recommended setup: its needs, the prefetch depth, the DeepSpeed block and the wear.
void print_recommended(const PlanOptions& o, const Plan& plan, const Advice& a) {
  const PlanInput& in = o.in;
  const PlanRow& r = plan.rows[*plan.recommended];
  std::printf("\nrecommended: %s (GPU %.1f GB of %.1f, host %.1f GB/node, NVMe %.1f GB/node",
              setup_name(r.setup).c_str(), gb(r.gpu_total), gb(*in.gpu_mem), gb(r.host_per_node),
              gb(r.nvme_per_node));
  if (r.io_seconds) std::printf(", NVMe I/O %.2f s/step", *r.io_seconds);
  if (r.pcie_seconds) std::printf(", PCIe %.2f s/step", *r.pcie_seconds);
  std::printf(")\n");
  if (a.prefetch) {
    const PrefetchAdvice& p = *a.prefetch;
    std::printf("prefetch: a layer of %.2f GB takes %.3f s from NVMe + %.3f s over PCIe",
                gb(p.layer_bytes), p.nvme_seconds, p.h2d_seconds);
    if (p.compute_seconds <= 0) {
      std::printf("; give --compute-time for the depth that hides it\n");
    } else if (p.depth) {
      std::printf(
          "; behind %.3f s of forward compute per layer, prefetch_depth %u hides it "
          "(zinf's default: 2)\n",
          p.compute_seconds, *p.depth);
    } else {
      std::printf(
          "; longer than the %.3f s of forward compute per layer: no prefetch_depth "
          "hides it, each layer waits %.3f s\n",
          p.compute_seconds, p.stall_seconds);
    }
  }
  std::printf("as a DeepSpeed config (set nvme_path to a directory on the drive):\n%s\n",
              zero_optimization_json(r.setup, in.sub_group_size).c_str());
  if (a.smart) {
    std::printf("drive %s: %u%% of its life used, %.1f TB written so far (SMART)\n",
                o.drive.c_str(), static_cast<unsigned>(a.smart->percentage_used),
                a.smart->bytes_written / 1e12);
  }
  if (a.wear) {
    std::printf(
        "drive wear: %.1f GB written per step per node, %.1f TB per day at %.2f s/step; "
        "%.0f TB of endurance lasts %.1f days of training (1%% every %.1f hours)\n",
        gb(r.nvme_write_per_step), a.wear->bytes_per_day / 1e12,
        o.step_seconds > 0 ? o.step_seconds : r.io_seconds.value_or(0), a.tbw / 1e12,
        a.wear->days_to_rated, a.wear->days_per_percent * 24);
  }
  if (!a.wear_note.empty()) std::printf("drive wear: %s\n", a.wear_note.c_str());
}

// The text: the inputs, the table, the collectives, the warnings and the recommendation.
void report_text(const PlanOptions& o, const Plan& plan, const Advice& a,
                 const std::vector<LargestModel>& biggest) {
  const PlanInput& in = o.in;
  print_inputs(o, plan);
  if (o.wide) {
    print_wide_table(plan, in);
  } else {
    print_narrow_table(plan, in);
  }
  if (plan.dp > 1) print_collectives(plan);
  for (const auto& w : a.io_warnings) std::printf("warning: %s\n", w.c_str());
  if (!in.gpu_mem) {
    std::printf("\nno recommendation: give --gpu-mem (and --cpu-mem, --nvme-free) to choose\n");
  } else if (plan.recommended) {
    print_recommended(o, plan, a);
  }
  if (o.largest) print_largest(biggest, in);
  if (in.gpu_mem && !plan.recommended) {
    // The setup that needs least of the GPU is the last candidate: its reason is the limit that
    // no setup gets past.
    const PlanRow& last = plan.rows.back();
    std::printf("\nnothing fits: even %s does not (%s); add GPUs, raise --tp/--pp, or use "
                "activation checkpointing\n",
                setup_name(last.setup).c_str(), last.why_not.c_str());
  }
}

}  // namespace

int plan_main(const std::vector<std::string>& tokens) {
  const std::optional<PlanOptions> parsed = parse_options(tokens);
  if (!parsed) return 0;
  const PlanOptions& o = *parsed;
  std::vector<LargestModel> biggest;
  if (o.largest) biggest = largest_models(o.in);
  if (o.in.params <= 0) {
    report_hardware_only(o, biggest);
    return 0;
  }
  const Plan plan = make_plan(o.in, o.opt_tier, o.par_tier);
  const Advice advice = advise(plan, o);
  if (o.json) {
    report_json(o, plan, advice, biggest);
  } else {
    report_text(o, plan, advice, biggest);
  }
  return 0;
}

}  // namespace zinf::tools
