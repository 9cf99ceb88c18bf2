// SPDX-License-Identifier: Apache-2.0
// `zinf plan`'s arithmetic: ZeRO model-state accounting, offload placement, activations and
// the recommendation. docs/plan.md states every formula used here and its source.
#include "plan_model.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "zinf/common/error.h"

namespace zinf::tools {
namespace {

std::string gb(double bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f GB", bytes / 1e9);
  return b;
}

}  // namespace

double parse_param_count(std::string_view text, std::string_view what) {
  std::string s(text);
  auto bad = [&]() {
    return UsageError("invalid " + std::string(what) + " '" + s +
                      "': expected a parameter count such as 13e9, 13B, 1.3M or 350K");
  };
  if (s.empty()) throw bad();
  double mult = 1;
  switch (std::toupper(static_cast<unsigned char>(s.back()))) {
    case 'K': mult = 1e3; break;
    case 'M': mult = 1e6; break;
    case 'B':
    case 'G': mult = 1e9; break;
    case 'T': mult = 1e12; break;
    default: break;
  }
  std::string num = s;
  if (mult != 1) num.pop_back();
  char* end = nullptr;
  double v = std::strtod(num.c_str(), &end);
  if (end == num.c_str() || *end != '\0' || !std::isfinite(v) || v <= 0) throw bad();
  return v * mult;
}

std::string_view tier_name(Tier tier) noexcept {
  switch (tier) {
    case Tier::kGpu: return "none";
    case Tier::kCpu: return "cpu";
    case Tier::kNvme: return "nvme";
  }
  return "?";
}

Tier parse_tier(std::string_view text, std::string_view what) {
  if (text == "none") return Tier::kGpu;
  if (text == "cpu") return Tier::kCpu;
  if (text == "nvme") return Tier::kNvme;
  throw UsageError("invalid " + std::string(what) + " '" + std::string(text) +
                   "': expected none, cpu or nvme");
}

BytesPerParam parse_bytes_per_param(std::string_view text) {
  std::string s(text);
  double v[3] = {0, 0, 0};
  const char* p = s.c_str();
  for (int i = 0; i < 3; ++i) {
    char* end = nullptr;
    v[i] = std::strtod(p, &end);
    bool sep_ok = i < 2 ? *end == ',' : *end == '\0';
    if (end == p || !sep_ok || !std::isfinite(v[i]) || v[i] < 0) {
      throw UsageError("invalid --bytes-per-param '" + s +
                       "': expected P,G,O bytes per parameter, e.g. 2,2,12 or 4,4,8");
    }
    p = end + 1;
  }
  return {v[0], v[1], v[2]};
}

double activation_bytes(const ActivationShape& shape, std::uint32_t tp) {
  const double s = static_cast<double>(shape.seq_len);
  const double b = static_cast<double>(shape.micro_batch);
  const double h = static_cast<double>(shape.hidden);
  const double a = static_cast<double>(shape.heads);
  const double l = static_cast<double>(shape.layers);
  const double t = tp;
  const double per_layer = s * b * h * (10.0 + 24.0 / t + 5.0 * a * s / (h * t));
  if (shape.checkpointing) return 2.0 * s * b * h * l + per_layer;
  return per_layer * l;
}

std::string setup_name(const PlanSetup& setup) {
  return "zero-" + std::to_string(setup.stage) +
         " optimizer=" + std::string(tier_name(setup.optimizer)) +
         " params=" + std::string(tier_name(setup.params));
}

std::vector<int> valid_stages(Tier optimizer, Tier params) {
  if (params != Tier::kGpu || optimizer == Tier::kNvme) return {3};
  if (optimizer == Tier::kCpu) return {2, 3};
  return {0, 1, 2, 3};
}

std::vector<PlanSetup> candidate_setups() {
  // The cost order of docs/plan.md: each level moves more state further from the GPU.
  const std::pair<Tier, Tier> levels[] = {
      {Tier::kGpu, Tier::kGpu}, {Tier::kCpu, Tier::kGpu},  {Tier::kNvme, Tier::kGpu},
      {Tier::kCpu, Tier::kCpu}, {Tier::kNvme, Tier::kCpu}, {Tier::kNvme, Tier::kNvme},
  };
  std::vector<PlanSetup> out;
  for (const auto& [opt, par] : levels) {
    for (int stage : valid_stages(opt, par)) out.push_back({stage, opt, par});
  }
  return out;
}

PlanRow evaluate_setup(const PlanInput& in, const PlanSetup& setup, std::uint32_t dp) {
  PlanRow r;
  r.setup = setup;
  const double slice = in.params / (static_cast<double>(in.tp) * in.pp);  // Ψ' per GPU
  const double part = slice / dp;                                         // Ψ' / Nd
  const auto& B = in.bytes;
  const int st = setup.stage;
  const std::uint32_t gpn = std::min(in.gpus_per_node, in.gpus);

  // Model states left on the GPU (ZeRO paper, sec. 5): stage 1 partitions the optimizer
  // state, 2 also the gradients, 3 also the parameters. Offloading the optimizer moves its
  // state and the gradient partition (reduced in buckets, then copied out) to the host.
  if (setup.params == Tier::kGpu) r.gpu_params = B.params * (st >= 3 ? part : slice);
  if (setup.optimizer == Tier::kGpu) {
    r.gpu_grads = B.grads * (st >= 2 ? part : slice);
    r.gpu_optimizer = B.optimizer * (st >= 1 ? part : slice);
  }
  r.gpu_model_states = r.gpu_params + r.gpu_grads + r.gpu_optimizer;
  if (st == 3) r.gpu_live_params = B.params * std::min(static_cast<double>(in.live_params), slice);
  if (in.activations) r.gpu_activations = activation_bytes(*in.activations, in.tp);
  r.gpu_total = r.gpu_model_states + r.gpu_live_params + r.gpu_activations;

  // Host (all pinned) and NVMe, per GPU; a node holds gpn of them.
  double host = 0, nvme = 0, rd = 0, wr = 0, opt_io = 0;
  if (setup.optimizer == Tier::kCpu) host += (B.optimizer + B.grads) * part;
  if (setup.optimizer == Tier::kNvme) {
    const double group = std::min(static_cast<double>(in.sub_group_size), part);
    host += B.grads * part + in.optimizer_buffers * group * B.optimizer;
    nvme += B.optimizer * part;
    opt_io = 2 * B.optimizer * part;  // every step reads and writes the whole state back
  }
  if (setup.params == Tier::kCpu) host += B.params * part;
  if (setup.params == Tier::kNvme) {
    host += static_cast<double>(in.param_buffers) * static_cast<double>(in.param_buffer_size) *
            B.params;
    nvme += B.params * part;
    rd += 2 * B.params * part;  // forward and backward each fetch the partition
    wr += B.params * part;      // the step writes the updated parameters back
  }
  r.host_per_node = host * gpn;
  r.nvme_per_node = nvme * gpn;
  r.nvme_read_per_step = (rd + opt_io / 2) * gpn;
  r.nvme_write_per_step = (wr + opt_io / 2) * gpn;
  if (rd + wr + opt_io == 0) {
    r.io_seconds = 0.0;
  } else if (in.drive && in.drive->mixed_gbps > 0 && in.drive->read_gbps > 0 &&
             in.drive->write_gbps > 0) {
    r.io_seconds = gpn * (opt_io / (in.drive->mixed_gbps * 1e9) + rd / (in.drive->read_gbps * 1e9) +
                          wr / (in.drive->write_gbps * 1e9));
    // Past a consumer drive's write cache the writes alone take longer than the short passes
    // say: at least the step's write bytes at the sustained rate.
    if (in.drive->sustained_write_gbps > 0) {
      r.io_seconds =
          std::max(*r.io_seconds, r.nvme_write_per_step / (in.drive->sustained_write_gbps * 1e9));
    }
  }

  // PCIe, per GPU (each GPU has its own link). Offloaded parameters cross to the GPU in the
  // forward and again in the backward pass; a host-side optimizer step takes the gradient
  // partition out and, while the parameters live on the GPU, sends the updated ones back.
  double h2d = 0, d2h = 0;
  if (setup.params != Tier::kGpu) h2d += 2 * B.params * part;
  if (setup.optimizer != Tier::kGpu) {
    d2h += B.grads * part;
    if (setup.params == Tier::kGpu) h2d += B.params * part;
  }
  r.h2d_per_step = h2d;
  r.d2h_per_step = d2h;
  if (in.h2d_gbps > 0) {
    const double d2h_gbps = in.d2h_gbps > 0 ? in.d2h_gbps : in.h2d_gbps;
    r.pcie_seconds = std::max(h2d / (in.h2d_gbps * 1e9), d2h / (d2h_gbps * 1e9));
  }

  // Collectives of data parallelism, per GPU: a ring moves (DP - 1) / DP of the buffer into
  // each rank. Gradients: an all-reduce (twice that: reduce-scatter then all-gather) up to
  // stage 1, a reduce-scatter from stage 2 on. Parameters: stages 1 and 2 all-gather the
  // updated slices once after the step (each rank updated only its own); stage 3 all-gathers
  // each layer in forward and again in backward (the partitioned parameters never stay
  // whole). zinf's ShardedEngine moves these bytes (StepStats' counts).
  const double ring = static_cast<double>(dp - 1) / dp;
  r.grad_reduce_per_step = (st >= 2 ? 1 : 2) * B.grads * slice * ring;
  r.allgather_per_step = (st == 3 ? 2 : st >= 1 ? 1 : 0) * B.params * slice * ring;
  r.collectives_per_node = (r.grad_reduce_per_step + r.allgather_per_step) * gpn;

  if (in.gpu_mem && r.gpu_total > *in.gpu_mem) {
    r.why_not = "GPU needs " + gb(r.gpu_total) + " > --gpu-mem " + gb(*in.gpu_mem);
  } else if (in.cpu_mem && r.host_per_node + in.host_reserve > *in.cpu_mem) {
    // Pinned pages stay put: the reserve for the OS, its page cache and the process must fit
    // beside them.
    r.why_not = "host needs " + gb(r.host_per_node) + " per node" +
                (in.host_reserve > 0 ? " pinned + " + gb(in.host_reserve) + " reserve" : "") +
                " > --cpu-mem " + gb(*in.cpu_mem);
  } else if (in.nvme_free && r.nvme_per_node > *in.nvme_free) {
    r.why_not =
        "NVMe needs " + gb(r.nvme_per_node) + " per node > --nvme-free " + gb(*in.nvme_free);
  }
  r.fits = r.why_not.empty();
  return r;
}

namespace {

// The checks make_plan and largest_models share; returns DP.
std::uint32_t check_parallelism(const PlanInput& in) {
  if (in.gpus == 0 || in.tp == 0 || in.pp == 0 || in.gpus_per_node == 0) {
    throw UsageError("--gpus, --tp, --pp and --gpus-per-node must be at least 1");
  }
  const std::uint64_t mp = std::uint64_t{in.tp} * in.pp;
  if (in.gpus % mp != 0) {
    throw UsageError("--gpus " + std::to_string(in.gpus) + " is not divisible by --tp " +
                     std::to_string(in.tp) + " x --pp " + std::to_string(in.pp) + " = " +
                     std::to_string(mp) + ": the data-parallel degree GPUs / (TP x PP) must be a " +
                     "whole number");
  }
  if (in.activations) {
    const auto& a = *in.activations;
    if (a.seq_len == 0 || a.hidden == 0 || a.layers == 0 || a.micro_batch == 0 || a.heads == 0) {
      throw UsageError(
          "activation memory needs all of --seq-len, --hidden, --layers, "
          "--micro-batch and --heads (each at least 1)");
    }
  }
  return static_cast<std::uint32_t>(in.gpus / mp);
}

}  // namespace

Plan make_plan(const PlanInput& in, std::optional<Tier> optimizer, std::optional<Tier> params) {
  if (in.params <= 0) throw UsageError("--params is required (e.g. --params 13B)");
  const std::uint32_t dp = check_parallelism(in);
  const std::uint64_t mp = std::uint64_t{in.tp} * in.pp;
  Plan plan;
  plan.dp = dp;
  plan.gpus_per_node = std::min(in.gpus_per_node, in.gpus);
  plan.nodes = (in.gpus + plan.gpus_per_node - 1) / plan.gpus_per_node;
  plan.params_per_model_slice = in.params / static_cast<double>(mp);

  std::vector<PlanSetup> setups;
  if (optimizer || params) {
    Tier o = optimizer.value_or(Tier::kGpu), p = params.value_or(Tier::kGpu);
    for (int s : valid_stages(o, p)) setups.push_back({s, o, p});
  } else {
    setups = candidate_setups();
  }
  for (const auto& s : setups) plan.rows.push_back(evaluate_setup(in, s, plan.dp));
  if (in.gpu_mem) {
    for (std::size_t i = 0; i < plan.rows.size(); ++i) {
      if (plan.rows[i].fits) {
        plan.recommended = i;
        break;
      }
    }
  }
  return plan;
}

std::vector<LargestModel> largest_models(const PlanInput& input) {
  if (!input.gpu_mem)
    throw UsageError("the largest model needs --gpu-mem (and --cpu-mem, --nvme-free)");
  const std::uint32_t dp = check_parallelism(input);
  // The best stage of a placement at a size: the first valid stage that fits, else the last
  // (the one that needs least of the GPU), whose reason is reported.
  auto best = [&](double params, Tier opt, Tier par) {
    PlanInput in = input;
    in.params = params;
    PlanRow last;
    for (int stage : valid_stages(opt, par)) {
      last = evaluate_setup(in, {stage, opt, par}, dp);
      if (last.fits) return last;
    }
    return last;
  };
  std::vector<LargestModel> out;
  const std::pair<Tier, Tier> placements[] = {
      {Tier::kGpu, Tier::kGpu}, {Tier::kCpu, Tier::kGpu},  {Tier::kNvme, Tier::kGpu},
      {Tier::kCpu, Tier::kCpu}, {Tier::kNvme, Tier::kCpu}, {Tier::kNvme, Tier::kNvme},
  };
  for (const auto& [opt, par] : placements) {
    LargestModel m;
    m.optimizer = opt;
    m.params = par;
    // Bisection on a log scale between 10^6 and 10^16 parameters (beyond any node), to 1 part
    // in 10^6: about 45 rounds. It relies on every need being non-decreasing in the count.
    double lo = 1e6, hi = 1e16;
    PlanRow at_lo = best(lo, opt, par);
    if (!at_lo.fits) {
      m.limit = at_lo.why_not;
      m.row = at_lo;
      out.push_back(m);
      continue;
    }
    PlanRow at_hi = best(hi, opt, par);
    if (at_hi.fits) {
      lo = hi;  // nothing given limits it
      at_lo = at_hi;
    } else {
      while (hi / lo > 1 + 1e-6) {
        const double mid = std::sqrt(lo * hi);
        PlanRow r = best(mid, opt, par);
        if (r.fits) {
          lo = mid;
          at_lo = r;
        } else {
          hi = mid;
          at_hi = r;
        }
      }
      m.limit = at_hi.why_not;
    }
    m.max_params = lo;
    m.row = at_lo;
    out.push_back(m);
  }
  return out;
}

PrefetchAdvice prefetch_advice(double layer_bytes, double nvme_read_gbps, double h2d_gbps,
                               double compute_seconds) {
  PrefetchAdvice a;
  a.layer_bytes = layer_bytes;
  a.nvme_seconds = nvme_read_gbps > 0 ? layer_bytes / (nvme_read_gbps * 1e9) : 0;
  a.h2d_seconds = h2d_gbps > 0 ? layer_bytes / (h2d_gbps * 1e9) : 0;
  // A layer is read into pinned memory, then copied to the GPU: one after the other for one
  // layer, but the drive reads the next layer while the link copies this one.
  a.latency_seconds = a.nvme_seconds + a.h2d_seconds;
  a.throughput_seconds = std::max(a.nvme_seconds, a.h2d_seconds);
  a.compute_seconds = compute_seconds;
  if (compute_seconds <= 0) return a;
  if (a.throughput_seconds > compute_seconds) {
    a.stall_seconds = a.throughput_seconds - compute_seconds;
    return a;
  }
  // With d layers in flight the fetch of a layer starts d layers of compute before it is
  // needed, so it hides when latency <= d x compute.
  a.depth = static_cast<std::uint32_t>(
      std::max(1.0, std::ceil(a.latency_seconds / compute_seconds - 1e-9)));
  return a;
}

}  // namespace zinf::tools
