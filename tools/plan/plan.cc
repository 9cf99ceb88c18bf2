// SPDX-License-Identifier: Apache-2.0
// `zinf plan`: what fits where. Reads the model size, parallelism, offload choice and
// hardware from the command line (and drive bandwidth from `zinf tune`'s report), prints the
// per-GPU / per-node needs of each ZeRO setup and the least costly one that fits.
#include <algorithm>
#include <chrono>
#include <cstdio>

#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "args.h"
#include "bench_common.h"
#include "commands.h"
#include "json_out.h"
#include "plan_model.h"
#include "wear.h"
#include "zinf/common/error.h"
#include "zinf/common/small_file.h"

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

DriveBandwidth read_tune_report(const std::string& path) {
  // A tune report is a few KiB; a FIFO or a device must not block or flood the planner.
  const std::string text = read_small_regular_file(path, std::uint64_t{1} << 20, "--tune file");
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw UsageError(path + ": " + e.what());
  }
  DriveBandwidth d;
  double* dst[] = {&d.read_gbps, &d.write_gbps, &d.mixed_gbps};
  const char* keys[] = {"read_gbps", "write_gbps", "mixed_gbps"};
  const auto chosen = doc.is_object() ? doc.find("chosen") : doc.end();
  for (int i = 0; i < 3; ++i) {
    const bool ok = chosen != doc.end() && chosen->is_object() && chosen->contains(keys[i]) &&
                    (*chosen)[keys[i]].is_number() && (*chosen)[keys[i]].get<double>() > 0;
    if (!ok) {
      throw UsageError(path +
                       ": not a zinf tune report (needs \"chosen\" with positive "
                       "read_gbps, write_gbps and mixed_gbps)");
    }
    *dst[i] = (*chosen)[keys[i]].get<double>();
  }
  // `zinf tune --sustained`'s steady write rate, where it ran.
  const auto sustained = doc.find("sustained");
  if (sustained != doc.end() && sustained->is_object()) {
    const auto steady = sustained->find("steady_write_gbps");
    if (steady != sustained->end() && steady->is_number() && steady->get<double>() > 0) {
      d.sustained_write_gbps = steady->get<double>();
    }
  }
  return d;
}

// `zinf bench h2d --json`'s pinned rates at its largest size (small copies pay the per-copy
// cost; a layer's fetch is large). Sets `simulated` when the figures are the host simulation's.
void read_h2d_report(const std::string& path, PlanInput& in, bool& simulated) {
  const std::string text = read_small_regular_file(path, std::uint64_t{1} << 20, "--h2d file");
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw UsageError(path + ": " + e.what());
  }
  const auto bad = [&]() {
    return UsageError(path +
                      ": not a zinf bench h2d --json report (needs \"sizes\" with bytes and a "
                      "positive h2d_pinned_gbps)");
  };
  if (!doc.is_object() || !doc.contains("sizes") || !doc["sizes"].is_array()) throw bad();
  const nlohmann::json* largest = nullptr;
  for (const auto& e : doc["sizes"]) {
    if (!e.is_object() || !e.contains("bytes") || !e["bytes"].is_number()) throw bad();
    if (!largest || e["bytes"].get<double>() > (*largest)["bytes"].get<double>()) largest = &e;
  }
  if (!largest || !largest->contains("h2d_pinned_gbps") ||
      !(*largest)["h2d_pinned_gbps"].is_number() ||
      (*largest)["h2d_pinned_gbps"].get<double>() <= 0) {
    throw bad();
  }
  in.h2d_gbps = (*largest)["h2d_pinned_gbps"].get<double>();
  if (largest->contains("d2h_pinned_gbps") && (*largest)["d2h_pinned_gbps"].is_number()) {
    in.d2h_gbps = std::max(0.0, (*largest)["d2h_pinned_gbps"].get<double>());
  }
  simulated = doc.value("simulated", false);
}

double g(double bytes) { return bytes / 1e9; }

std::string param_count_text(double params) {
  char count[32];
  if (params >= 1e9) {
    std::snprintf(count, sizeof count, "%.4gB", params / 1e9);
  } else if (params >= 1e6) {
    std::snprintf(count, sizeof count, "%.4gM", params / 1e6);
  } else {
    std::snprintf(count, sizeof count, "%.4g", params);
  }
  return count;
}

Json row_json(const PlanRow& r) {
  Json j;
  j["stage"] = std::int64_t{r.setup.stage};
  j["offload_optimizer"] = std::string(tier_name(r.setup.optimizer));
  j["offload_params"] = std::string(tier_name(r.setup.params));
  j["gpu_params_bytes"] = r.gpu_params;
  j["gpu_grads_bytes"] = r.gpu_grads;
  j["gpu_optimizer_bytes"] = r.gpu_optimizer;
  j["gpu_model_states_bytes"] = r.gpu_model_states;
  j["gpu_live_params_bytes"] = r.gpu_live_params;
  j["gpu_activation_bytes"] = r.gpu_activations;
  j["gpu_total_bytes"] = r.gpu_total;
  j["host_pinned_bytes_per_node"] = r.host_per_node;
  j["nvme_bytes_per_node"] = r.nvme_per_node;
  j["nvme_read_bytes_per_step_per_node"] = r.nvme_read_per_step;
  j["nvme_write_bytes_per_step_per_node"] = r.nvme_write_per_step;
  if (r.io_seconds) {
    j["io_seconds_per_step"] = *r.io_seconds;
  } else {
    j["io_seconds_per_step"] = std::nan("");  // null: no drive bandwidth given
  }
  j["h2d_bytes_per_step_per_gpu"] = r.h2d_per_step;
  j["d2h_bytes_per_step_per_gpu"] = r.d2h_per_step;
  j["pcie_seconds_per_step"] = r.pcie_seconds ? *r.pcie_seconds : std::nan("");
  j["grad_reduce_bytes_per_step_per_gpu"] = r.grad_reduce_per_step;
  j["allgather_bytes_per_step_per_gpu"] = r.allgather_per_step;
  j["collective_bytes_per_step_per_node"] = r.collectives_per_node;
  j["fits"] = r.fits;
  j["why_not"] = r.why_not;
  return j;
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

// The recommendation as the "zero_optimization" block a DeepSpeed user pastes into ds_config.
std::string zero_optimization_json(const PlanSetup& s, std::uint64_t sub_group_size) {
  Json z;
  z["stage"] = s.stage;
  auto offload = [](Tier t) {
    Json o;
    o["device"] = std::string(tier_name(t));
    if (t == Tier::kNvme) o["nvme_path"] = "/local_nvme";
    if (t == Tier::kCpu) o["pin_memory"] = true;
    return o;
  };
  if (s.optimizer != Tier::kGpu) z["offload_optimizer"] = offload(s.optimizer);
  if (s.params != Tier::kGpu) z["offload_param"] = offload(s.params);
  if (s.stage == 3) z["sub_group_size"] = sub_group_size;
  Json doc;
  doc["zero_optimization"] = z;
  return doc.dump(2);
}

// The full table (--wide): every column plan_model computes, the reasons in full.
void print_wide_table(const Plan& plan, const PlanInput& in) {
  std::printf(
      "\nGB per GPU (model states, stage-3 live parameters, activations), per node "
      "(host pinned, NVMe) and NVMe traffic per step per node\n");
  std::printf("%-5s %-5s %-5s %8s %8s %8s %8s %7s %7s %9s %10s %10s %12s %9s  %s\n", "stage",
              "opt->", "par->", "params", "grads", "optim", "states", "live", "activ", "GPU total",
              "host/node", "NVMe/node", "NVMe r+w/st", "I/O s/st", "fits");
  for (const auto& r : plan.rows) {
    char io[32] = "n/a";
    if (r.io_seconds) std::snprintf(io, sizeof io, "%.2f", *r.io_seconds);
    std::printf(
        "%-5d %-5s %-5s %8.1f %8.1f %8.1f %8.1f %7.1f %7.1f %9.1f %10.1f %10.1f %12.1f %9s  %s\n",
        r.setup.stage, std::string(tier_name(r.setup.optimizer)).c_str(),
        std::string(tier_name(r.setup.params)).c_str(), g(r.gpu_params), g(r.gpu_grads),
        g(r.gpu_optimizer), g(r.gpu_model_states), g(r.gpu_live_params), g(r.gpu_activations),
        g(r.gpu_total), g(r.host_per_node), g(r.nvme_per_node),
        g(r.nvme_read_per_step + r.nvme_write_per_step), io,
        r.fits ? (in.gpu_mem ? "yes" : "-") : ("no: " + r.why_not).c_str());
  }
}

// The narrow table's fits column: the first limit a setup breaks, in plan_model's order, with
// the limit (the row shows the need); "yes", or "-" when no limit was given to check.
std::string fits_short(const PlanRow& r, const PlanInput& in) {
  char buf[64];
  if (r.fits) return in.gpu_mem ? "yes" : "-";
  if (in.gpu_mem && r.gpu_total > *in.gpu_mem) {
    std::snprintf(buf, sizeof buf, "no: GPU > %.1f", g(*in.gpu_mem));
  } else if (in.cpu_mem && r.host_per_node > *in.cpu_mem) {
    std::snprintf(buf, sizeof buf, "no: host > %.1f", g(*in.cpu_mem));
  } else {
    std::snprintf(buf, sizeof buf, "no: NVMe > %.1f", g(in.nvme_free.value_or(0)));
  }
  return buf;
}

// The default table: the columns a choice is made on, within 100 columns, then what they mean.
void print_narrow_table(const Plan& plan, const PlanInput& in) {
  std::printf("\n%-5s %-5s %-5s %8s %10s %10s %10s %8s  %s\n", "stage", "opt", "par", "GPU",
              "host/node", "NVMe/node", "r+w/step", "I/O s", "fits");
  for (const auto& r : plan.rows) {
    char io[32] = "n/a";
    if (r.io_seconds) std::snprintf(io, sizeof io, "%.2f", *r.io_seconds);
    std::printf("%-5d %-5s %-5s %8.1f %10.1f %10.1f %10.1f %8s  %s\n", r.setup.stage,
                std::string(tier_name(r.setup.optimizer)).c_str(),
                std::string(tier_name(r.setup.params)).c_str(), g(r.gpu_total), g(r.host_per_node),
                g(r.nvme_per_node), g(r.nvme_read_per_step + r.nvme_write_per_step), io,
                fits_short(r, in).c_str());
  }
  std::printf(
      "stage: ZeRO stage; opt, par: where the optimizer state and the parameters live (none: the "
      "GPU)\n"
      "GPU: GB per GPU (model states, stage-3 live parameters, activations); host/node: GB of "
      "pinned\n"
      "host memory per node; NVMe/node: GB stored per node; r+w/step: GB read + written per "
      "step per\n"
      "node; I/O s: NVMe seconds per step (with --tune); fits: within --gpu-mem, --cpu-mem and\n"
      "--nvme-free (no: the first limit exceeded). --wide shows every column.\n");
}

// The limit column of --largest: which of the three a larger model breaks (the JSON has the
// sentence with the figures).
std::string limit_short(const std::string& why) {
  if (why.empty()) return "nothing given";
  for (const char* what : {"GPU", "host", "NVMe"}) {
    if (why.rfind(what, 0) == 0) {
      return std::string(what) == "GPU"    ? "--gpu-mem"
             : std::string(what) == "host" ? "--cpu-mem"
                                           : "--nvme-free";
    }
  }
  return why;
}

// The largest model per placement (--largest): its size, the limit one size larger breaks, and
// the step time the drive and the link bound it to at that size.
void print_largest(const std::vector<LargestModel>& ms, const PlanInput& in) {
  std::printf("\nlargest model per placement (GPU %.1f GB", g(*in.gpu_mem));
  if (in.cpu_mem)
    std::printf(", host %.1f GB - %.1f GB reserve", g(*in.cpu_mem), g(in.host_reserve));
  if (in.nvme_free) std::printf(", NVMe %.1f GB", g(*in.nvme_free));
  std::printf(")\n%-5s %-5s %-5s %9s %8s %10s %10s %8s %8s  %s\n", "opt", "par", "stage", "params",
              "GPU", "host/node", "NVMe/node", "NVMe s", "PCIe s", "limited by");
  for (const auto& m : ms) {
    char nv[32] = "n/a", pc[32] = "n/a";
    if (m.row.io_seconds) std::snprintf(nv, sizeof nv, "%.2f", *m.row.io_seconds);
    if (m.row.pcie_seconds) std::snprintf(pc, sizeof pc, "%.2f", *m.row.pcie_seconds);
    if (m.max_params <= 0) {
      std::printf("%-5s %-5s %-5s %9s %8s %10s %10s %8s %8s  %s\n",
                  std::string(tier_name(m.optimizer)).c_str(),
                  std::string(tier_name(m.params)).c_str(), "-", "none", "", "", "", "", "",
                  m.limit.c_str());
      continue;
    }
    std::printf("%-5s %-5s %-5d %9s %8.1f %10.1f %10.1f %8s %8s  %s\n",
                std::string(tier_name(m.optimizer)).c_str(),
                std::string(tier_name(m.params)).c_str(), m.row.setup.stage,
                param_count_text(m.max_params).c_str(), g(m.row.gpu_total), g(m.row.host_per_node),
                g(m.row.nvme_per_node), nv, pc, limit_short(m.limit).c_str());
  }
  std::printf(
      "params: the largest model that fits at the placement's best stage; limited by: the limit\n"
      "a larger one exceeds (--cpu-mem: pinned + --host-reserve); NVMe s: drive seconds\n"
      "per step at that size (--tune or --nvme-gbps); PCIe s: link seconds per step per GPU\n"
      "(--h2d-gbps or --h2d); a step takes at least the larger of the two.\n");
}

Json largest_json(const std::vector<LargestModel>& ms) {
  Json list = Json::array();
  for (const auto& m : ms) {
    Json j;
    j["offload_optimizer"] = std::string(tier_name(m.optimizer));
    j["offload_params"] = std::string(tier_name(m.params));
    j["max_params"] = m.max_params;
    j["limit"] = m.limit;
    j["setup"] = m.max_params > 0 ? row_json(m.row) : Json();
    list.push_back(j);
  }
  return list;
}

// NVMe I/O more than this many times the compute per step: the GPU waits on the drive however
// the I/O overlaps (prefetching hides I/O behind compute only up to the compute's length), and a
// factor this size is beyond what a tune report's figures are off by on a shared machine.
constexpr double kIoBoundRatio = 3;

}  // namespace

int plan_main(const std::vector<std::string>& tokens) {
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
  Cli cli("plan", kAbout);
  cli.group("model");
  cli.text("--params", params, "N",
           "parameters of the whole model: 13e9, 13B, 1.3M, 350K (K/M/B = 10^3/10^6/10^9, "
           "as model sizes are counted)",
           "required");
  cli.text("--bytes-per-param", bpp, "P,G,O",
           "bytes per parameter of parameters, gradients, optimizer state "
           "(fp16 mixed precision with Adam; plain fp32: 4,4,8)",
           "2,2,12");
  cli.group("parallelism");
  cli.count("--gpus", gpus, "GPUs in the job", 0, UINT32_MAX, "1, or --nodes x --gpus-per-node");
  cli.count("--tp", tp, "tensor parallel degree; DP = GPUs / (TP x PP)");
  cli.count("--pp", pp, "pipeline parallel degree");
  cli.count("--gpus-per-node", gpus_per_node, "GPUs per node");
  cli.count("--nodes", nodes,
            "nodes in the job: --gpus is --nodes x --gpus-per-node (ranks per node) when not "
            "given",
            0, UINT32_MAX, "--gpus / --gpus-per-node");
  cli.group("offload (show only this placement; default: every candidate)");
  cli.text("--offload-optimizer", opt, "T", "none | cpu | nvme", "every candidate");
  cli.text("--offload-params", par, "T", "none | cpu | nvme (needs stage 3)", "every candidate");
  cli.count("--sub-group-size", in.sub_group_size,
            "optimizer sub-group elements, 4 of them pinned for nvme", 0, UINT64_MAX, "1e9");
  cli.group("activations (all five, or none)");
  cli.count("--seq-len", shape.seq_len, "sequence length", 0, UINT64_MAX, "none");
  cli.count("--hidden", shape.hidden, "hidden size", 0, UINT64_MAX, "none");
  cli.count("--layers", shape.layers, "transformer layers", 0, UINT64_MAX, "none");
  cli.count("--micro-batch", shape.micro_batch, "micro-batch per GPU", 0, UINT64_MAX, "none");
  cli.count("--heads", shape.heads, "attention heads", 0, UINT64_MAX, "none");
  cli.flag("--activation-checkpointing", shape.checkpointing,
           "full recomputation: keep only each layer's input");
  cli.group("hardware (limits not given are not checked; a recommendation needs --gpu-mem)");
  cli.text("--gpu-mem", gpu_mem_text, "SIZE",
           "memory per GPU with its unit, e.g. 80G (GiB) or 80GB (10^9 bytes)", "none");
  cli.text("--cpu-mem", cpu_mem_text, "SIZE", "host memory per node usable for pinned buffers",
           "none");
  cli.text("--nvme-free", nvme_free_text, "SIZE", "free NVMe space per node", "none");
  cli.text("--host-reserve", reserve_text, "SIZE",
           "host memory per node the pinned buffers must leave to the OS, its page cache and "
           "the training process (counted against --cpu-mem)",
           "0");
  cli.text("--tune", tune, "FILE",
           "`zinf tune --report FILE` output: drive bandwidth for I/O time");
  cli.number("--nvme-gbps", nvme_gbps,
             "the drives' read and write rate per node in GB/s, instead of --tune (use the "
             "sustained rate of a consumer drive)",
             "none");
  cli.number("--h2d-gbps", in.h2d_gbps,
             "pinned host <-> GPU copy rate per GPU in GB/s, for the PCIe time per step", "none");
  cli.text("--h2d", h2d_report, "FILE",
           "`zinf bench h2d --json` output: the pinned rates at its largest size, instead of "
           "--h2d-gbps",
           "none");
  cli.text("--layer-params", layer_params_text, "N",
           "parameters per layer, for the prefetch depth advice (default: --params / --layers)",
           "none");
  cli.duration("--compute-time", compute,
               "GPU compute (forward + backward) per step: a warning when a setup's NVMe I/O per "
               "step (from --tune) is more than 3x it",
               "none");
  cli.group("drive wear (of the recommended setup's NVMe writes)");
  cli.text("--tbw", tbw_text, "SIZE",
           "the drives' rated endurance per node, e.g. 600TB (10^12 bytes per TB, as rated)",
           "none");
  cli.number("--step-seconds", step_seconds,
             "expected seconds per training step (default: the NVMe I/O time per step from "
             "--tune, a lower bound, so the wear shown is the fastest it can be)",
             "from --tune");
  cli.text("--drive", drive, "DEV",
           "an NVMe device (/dev/nvme0) whose SMART log gives the data written so far and the "
           "life used; without --tbw, the endurance it implies",
           "none");
  cli.group("output");
  cli.flag("--largest", largest,
           "also the largest model each placement fits on this hardware (needs --gpu-mem; "
           "--params may be left out)");
  cli.flag("--wide", wide,
           "the full table (model states by kind, live parameters, activations; 140 columns) "
           "instead of the narrow one");
  cli.flag("--json", json, "one JSON object instead of the table");
  if (!cli.parse(tokens)) return 0;
  if (nodes > 0) {
    if (gpus != 0 && gpus != nodes * gpus_per_node) {
      throw UsageError("--gpus " + std::to_string(gpus) + " is not --nodes " +
                       std::to_string(nodes) + " x --gpus-per-node " +
                       std::to_string(gpus_per_node) + " = " +
                       std::to_string(nodes * gpus_per_node) + ": give one of them");
    }
    gpus = nodes * gpus_per_node;
  }
  if (gpus == 0) gpus = 1;
  in.gpus = to_u32(gpus, "--gpus");
  in.tp = to_u32(tp, "--tp");
  in.pp = to_u32(pp, "--pp");
  in.gpus_per_node = to_u32(gpus_per_node, "--gpus-per-node");
  in.gpu_mem = as_double(memory_limit(gpu_mem_text, "--gpu-mem"));
  in.cpu_mem = as_double(memory_limit(cpu_mem_text, "--cpu-mem"));
  in.nvme_free = as_double(memory_limit(nvme_free_text, "--nvme-free"));
  if (params.empty() && !largest) {
    throw UsageError("--params is required (e.g. --params 13B)");
  }
  if (!params.empty()) in.params = parse_param_count(params, "--params");
  if (!reserve_text.empty()) {
    in.host_reserve = static_cast<double>(*memory_limit(reserve_text, "--host-reserve"));
  }
  if (!(nvme_gbps >= 0) || !(in.h2d_gbps >= 0)) {
    throw UsageError("invalid --nvme-gbps or --h2d-gbps: must be > 0");
  }
  if (nvme_gbps > 0 && !tune.empty()) {
    throw UsageError("give --tune or --nvme-gbps, not both: each sets the drive rates");
  }
  bool h2d_simulated = false;
  if (!h2d_report.empty()) {
    if (in.h2d_gbps > 0) throw UsageError("give --h2d or --h2d-gbps, not both");
    read_h2d_report(h2d_report, in, h2d_simulated);
  }
  if (nvme_gbps > 0) in.drive = DriveBandwidth{nvme_gbps, nvme_gbps, nvme_gbps};
  if (!bpp.empty()) in.bytes = parse_bytes_per_param(bpp);
  if (in.sub_group_size == 0) throw UsageError("invalid --sub-group-size: must be at least 1");
  if (shape.seq_len || shape.hidden || shape.layers || shape.micro_batch || shape.heads ||
      shape.checkpointing) {
    in.activations = shape;
  }
  std::optional<Tier> opt_tier, par_tier;
  if (!opt.empty()) opt_tier = parse_tier(opt, "--offload-optimizer");
  if (!par.empty()) par_tier = parse_tier(par, "--offload-params");
  if (!tune.empty()) in.drive = read_tune_report(tune);

  std::vector<LargestModel> biggest;
  if (largest) biggest = largest_models(in);
  if (in.params <= 0) {
    // --largest alone: only the hardware was described.
    if (json) {
      Json head;
      head["gpus"] = std::uint64_t{in.gpus};
      head["host_reserve_bytes"] = in.host_reserve;
      head["largest"] = largest_json(biggest);
      std::printf("%s\n", json_text(head).c_str());
      return 0;
    }
    std::printf(
        "zinf plan: %u GPU%s (TP %u x PP %u), %u per node; bytes per parameter "
        "P,G,O = %g,%g,%g\n",
        in.gpus, in.gpus == 1 ? "" : "s", in.tp, in.pp, std::min(in.gpus_per_node, in.gpus),
        in.bytes.params, in.bytes.grads, in.bytes.optimizer);
    print_largest(biggest, in);
    return 0;
  }

  const Plan plan = make_plan(in, opt_tier, par_tier);

  // Prefetch depth for the recommended setup when its parameters live off the GPU: a layer's
  // bytes from --layer-params or Ψ' / --layers, and the forward pass's compute per layer (a
  // third of --compute-time: backward is about twice forward, so forward is the tight side).
  std::optional<PrefetchAdvice> prefetch;
  if (plan.recommended && in.h2d_gbps > 0 &&
      plan.rows[*plan.recommended].setup.params != Tier::kGpu) {
    const PlanRow& r = plan.rows[*plan.recommended];
    double layer_params = 0;
    if (!layer_params_text.empty()) {
      layer_params = parse_param_count(layer_params_text, "--layer-params");
    } else if (shape.layers > 0) {
      layer_params = plan.params_per_model_slice / static_cast<double>(shape.layers);
    }
    if (layer_params > 0) {
      const double layers = plan.params_per_model_slice / layer_params;
      const double compute_per_layer =
          std::chrono::duration<double>(compute).count() / (3.0 * layers);
      const double read_gbps =
          r.setup.params == Tier::kNvme && in.drive ? in.drive->read_gbps : 0.0;
      prefetch = prefetch_advice(layer_params * in.bytes.params, read_gbps, in.h2d_gbps,
                                 compute_per_layer);
    }
  }

  // Wear of the recommended setup's drives, when asked for with --tbw or --drive.
  std::optional<WearEstimate> wear;
  std::optional<NvmeSmartLog> smart;
  std::string wear_note;
  double tbw = 0;
  if (!tbw_text.empty()) tbw = static_cast<double>(*memory_limit(tbw_text, "--tbw", "TB"));
  if (!drive.empty()) {
    std::string why;
    smart = read_nvme_smart_log(drive, &why);
    if (!smart) wear_note = "SMART log not read: " + why;
    if (smart && tbw == 0 && smart->percentage_used > 0) {
      // The drive's own estimate: what it has written is percentage_used of its life.
      tbw = smart->bytes_written * 100.0 / smart->percentage_used;
    }
  }
  if (tbw > 0 && plan.recommended) {
    const PlanRow& r = plan.rows[*plan.recommended];
    const double secs = step_seconds > 0 ? step_seconds : r.io_seconds.value_or(0);
    if (r.nvme_write_per_step <= 0) {
      wear_note = "the recommended setup writes nothing to NVMe";
    } else if (secs <= 0) {
      wear_note = "give --step-seconds (or --tune for the I/O time) to estimate drive wear";
    } else {
      wear = estimate_wear(r.nvme_write_per_step, secs, tbw);
    }
  }

  // I/O-bound setups: the recommended one, or without a recommendation every one.
  std::vector<std::string> io_warnings;
  const double compute_s = std::chrono::duration<double>(compute).count();
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
    io_warnings.push_back(buf);
  }

  if (json) {
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
    if (compute_s > 0) head["compute_seconds_per_step"] = compute_s;
    head["warnings"] = io_warnings;
    head["host_reserve_bytes"] = in.host_reserve;
    if (in.h2d_gbps > 0) {
      head["h2d_gbps"] = in.h2d_gbps;
      head["d2h_gbps"] = in.d2h_gbps > 0 ? in.d2h_gbps : in.h2d_gbps;
      head["h2d_simulated"] = h2d_simulated;
    }
    if (largest) head["largest"] = largest_json(biggest);
    if (prefetch) {
      Json pf;
      pf["layer_bytes"] = prefetch->layer_bytes;
      pf["nvme_seconds"] = prefetch->nvme_seconds;
      pf["h2d_seconds"] = prefetch->h2d_seconds;
      pf["latency_seconds"] = prefetch->latency_seconds;
      pf["compute_seconds"] = prefetch->compute_seconds;
      pf["depth"] = prefetch->depth ? Json(std::uint64_t{*prefetch->depth}) : Json();
      pf["stall_seconds"] = prefetch->stall_seconds;
      head["prefetch"] = pf;
    }
    if (wear || smart || !wear_note.empty()) {
      Json w;
      if (wear) {
        w["tbw_bytes"] = tbw;
        w["bytes_per_day"] = wear->bytes_per_day;
        w["days_to_rated"] = wear->days_to_rated;
        w["days_per_percent"] = wear->days_per_percent;
      }
      if (smart) {
        w["smart_percentage_used"] = std::uint64_t{smart->percentage_used};
        w["smart_bytes_written"] = smart->bytes_written;
      }
      if (!wear_note.empty()) w["note"] = wear_note;
      head["wear"] = w;
    }
    const std::string out = json_text(head);
    std::printf("%s\n", out.c_str());
    return 0;
  }

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
        g(activation_bytes(s, in.tp)), static_cast<unsigned long long>(s.seq_len),
        static_cast<unsigned long long>(s.micro_batch), static_cast<unsigned long long>(s.hidden),
        static_cast<unsigned long long>(s.heads), static_cast<unsigned long long>(s.layers),
        s.checkpointing ? "full checkpointing" : "no checkpointing");
  }
  if (in.drive) {
    std::printf(
        "drives (from %s): read %.2f GB/s, write %.2f GB/s, optimizer read+write mix "
        "%.2f GB/s per node\n",
        tune.empty() ? "--nvme-gbps" : tune.c_str(), in.drive->read_gbps, in.drive->write_gbps,
        in.drive->mixed_gbps);
    if (in.drive->sustained_write_gbps > 0) {
      std::printf("  sustained writes: %.2f GB/s (the I/O time is at least the writes at it)\n",
                  in.drive->sustained_write_gbps);
    }
  }
  if (in.h2d_gbps > 0) {
    std::printf("PCIe: %.2f GB/s host->device, %.2f GB/s device->host per GPU%s\n", in.h2d_gbps,
                in.d2h_gbps > 0 ? in.d2h_gbps : in.h2d_gbps,
                h2d_simulated ? " (from the host simulation's copy path, not a PCIe link)" : "");
  }
  if (wide) {
    print_wide_table(plan, in);
  } else {
    print_narrow_table(plan, in);
  }
  if (plan.dp > 1) {
    // The collectives depend on the stage only: one line for the stages the table shows.
    std::string line;
    for (int st = 0; st <= 3; ++st) {
      const auto it = std::find_if(plan.rows.begin(), plan.rows.end(),
                                   [st](const PlanRow& r) { return r.setup.stage == st; });
      if (it == plan.rows.end()) continue;
      char cell[160];
      std::snprintf(cell, sizeof cell, "%sstage %d %.2f GB", line.empty() ? "" : "; ", st,
                    g(it->grad_reduce_per_step + it->allgather_per_step));
      line += cell;
      if (st == 3) {
        std::snprintf(cell, sizeof cell, " (%.2f GB of it parameter all-gathers)",
                      g(it->allgather_per_step));
        line += cell;
      }
    }
    std::printf("collectives per step, received per GPU (x%u per node): %s\n", plan.gpus_per_node,
                line.c_str());
  }
  for (const auto& w : io_warnings) std::printf("warning: %s\n", w.c_str());
  if (!in.gpu_mem) {
    std::printf("\nno recommendation: give --gpu-mem (and --cpu-mem, --nvme-free) to choose\n");
  } else if (plan.recommended) {
    const PlanRow& r = plan.rows[*plan.recommended];
    std::printf("\nrecommended: %s (GPU %.1f GB of %.1f, host %.1f GB/node, NVMe %.1f GB/node",
                setup_name(r.setup).c_str(), g(r.gpu_total), g(*in.gpu_mem), g(r.host_per_node),
                g(r.nvme_per_node));
    if (r.io_seconds) std::printf(", NVMe I/O %.2f s/step", *r.io_seconds);
    if (r.pcie_seconds) std::printf(", PCIe %.2f s/step", *r.pcie_seconds);
    std::printf(")\n");
    if (prefetch) {
      const PrefetchAdvice& a = *prefetch;
      std::printf("prefetch: a layer of %.2f GB takes %.3f s from NVMe + %.3f s over PCIe",
                  g(a.layer_bytes), a.nvme_seconds, a.h2d_seconds);
      if (a.compute_seconds <= 0) {
        std::printf("; give --compute-time for the depth that hides it\n");
      } else if (a.depth) {
        std::printf(
            "; behind %.3f s of forward compute per layer, prefetch_depth %u hides it "
            "(zinf's default: 2)\n",
            a.compute_seconds, *a.depth);
      } else {
        std::printf(
            "; longer than the %.3f s of forward compute per layer: no prefetch_depth "
            "hides it, each layer waits %.3f s\n",
            a.compute_seconds, a.stall_seconds);
      }
    }
    std::printf("as a DeepSpeed config (set nvme_path to a directory on the drive):\n%s\n",
                zero_optimization_json(r.setup, in.sub_group_size).c_str());
    if (smart) {
      std::printf("drive %s: %u%% of its life used, %.1f TB written so far (SMART)\n",
                  drive.c_str(), static_cast<unsigned>(smart->percentage_used),
                  smart->bytes_written / 1e12);
    }
    if (wear) {
      std::printf(
          "drive wear: %.1f GB written per step per node, %.1f TB per day at %.2f s/step; "
          "%.0f TB of endurance lasts %.1f days of training (1%% every %.1f hours)\n",
          g(r.nvme_write_per_step), wear->bytes_per_day / 1e12,
          step_seconds > 0 ? step_seconds : r.io_seconds.value_or(0), tbw / 1e12,
          wear->days_to_rated, wear->days_per_percent * 24);
    }
    if (!wear_note.empty()) std::printf("drive wear: %s\n", wear_note.c_str());
  }
  if (largest) print_largest(biggest, in);
  if (in.gpu_mem && !plan.recommended) {
    // The setup that needs least of the GPU is the last candidate: its reason is the limit that
    // no setup gets past.
    const PlanRow& last = plan.rows.back();
    std::printf("\nnothing fits: even %s does not (%s); add GPUs, raise --tp/--pp, or use "
                "activation checkpointing\n",
                setup_name(last.setup).c_str(), last.why_not.c_str());
  }
  return 0;
}

}  // namespace zinf::tools
