// SPDX-License-Identifier: Apache-2.0
// What `zinf plan` prints: its tables and JSON rows (plan_print.h).
#include "plan_print.h"

#include <cmath>
#include <cstdio>
#include <string>

namespace zinf::tools {

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
        std::string(tier_name(r.setup.params)).c_str(), gb(r.gpu_params), gb(r.gpu_grads),
        gb(r.gpu_optimizer), gb(r.gpu_model_states), gb(r.gpu_live_params), gb(r.gpu_activations),
        gb(r.gpu_total), gb(r.host_per_node), gb(r.nvme_per_node),
        gb(r.nvme_read_per_step + r.nvme_write_per_step), io,
        r.fits ? (in.gpu_mem ? "yes" : "-") : ("no: " + r.why_not).c_str());
  }
}

namespace {

// The narrow table's fits column: the first limit a setup breaks, in plan_model's order, with
// the limit (the row shows the need); "yes", or "-" when no limit was given to check.
std::string fits_short(const PlanRow& r, const PlanInput& in) {
  char buf[64];
  if (r.fits) return in.gpu_mem ? "yes" : "-";
  if (in.gpu_mem && r.gpu_total > *in.gpu_mem) {
    std::snprintf(buf, sizeof buf, "no: GPU > %.1f", gb(*in.gpu_mem));
  } else if (in.cpu_mem && r.host_per_node > *in.cpu_mem) {
    std::snprintf(buf, sizeof buf, "no: host > %.1f", gb(*in.cpu_mem));
  } else {
    std::snprintf(buf, sizeof buf, "no: NVMe > %.1f", gb(in.nvme_free.value_or(0)));
  }
  return buf;
}

}  // namespace

// The default table: the columns a choice is made on, within 100 columns, then what they mean.
void print_narrow_table(const Plan& plan, const PlanInput& in) {
  std::printf("\n%-5s %-5s %-5s %8s %10s %10s %10s %8s  %s\n", "stage", "opt", "par", "GPU",
              "host/node", "NVMe/node", "r+w/step", "I/O s", "fits");
  for (const auto& r : plan.rows) {
    char io[32] = "n/a";
    if (r.io_seconds) std::snprintf(io, sizeof io, "%.2f", *r.io_seconds);
    std::printf("%-5d %-5s %-5s %8.1f %10.1f %10.1f %10.1f %8s  %s\n", r.setup.stage,
                std::string(tier_name(r.setup.optimizer)).c_str(),
                std::string(tier_name(r.setup.params)).c_str(), gb(r.gpu_total),
                gb(r.host_per_node), gb(r.nvme_per_node),
                gb(r.nvme_read_per_step + r.nvme_write_per_step), io, fits_short(r, in).c_str());
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

namespace {

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

}  // namespace

// The largest model per placement (--largest): its size, the limit one size larger breaks, and
// the step time the drive and the link bound it to at that size.
void print_largest(const std::vector<LargestModel>& ms, const PlanInput& in) {
  std::printf("\nlargest model per placement (GPU %.1f GB", gb(*in.gpu_mem));
  if (in.cpu_mem)
    std::printf(", host %.1f GB - %.1f GB reserve", gb(*in.cpu_mem), gb(in.host_reserve));
  if (in.nvme_free) std::printf(", NVMe %.1f GB", gb(*in.nvme_free));
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
    std::printf(
        "%-5s %-5s %-5d %9s %8.1f %10.1f %10.1f %8s %8s  %s\n",
        std::string(tier_name(m.optimizer)).c_str(), std::string(tier_name(m.params)).c_str(),
        m.row.setup.stage, param_count_text(m.max_params).c_str(), gb(m.row.gpu_total),
        gb(m.row.host_per_node), gb(m.row.nvme_per_node), nv, pc, limit_short(m.limit).c_str());
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

}  // namespace zinf::tools
