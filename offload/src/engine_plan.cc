// SPDX-License-Identifier: Apache-2.0
// plan_engine: OffloadEngine's checks and planning, from the config and the layers alone
// (engine_plan.h).
#include "engine_plan.h"

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <unordered_set>
#include <utility>

#include "zinf/adam/compact_state.h"
#include "zinf/common/align.h"
#include "zinf/common/error.h"

namespace zinf::offload::detail {
namespace {

std::string in_quotes(const std::string& s) { return "'" + s + "'"; }

// printf formatting into a string of whatever length it takes (the wear notices' %g figures).
[[gnu::format(printf, 1, 2)]] std::string printf_string(const char* format, ...) {
  va_list args;
  va_start(args, format);
  va_list again;
  va_copy(again, args);
  const int n = std::vsnprintf(nullptr, 0, format, args);
  va_end(args);
  std::string out(n > 0 ? static_cast<std::size_t>(n) : 0, '\0');
  if (n > 0) std::vsnprintf(out.data(), out.size() + 1, format, again);
  va_end(again);
  return out;
}

// Everything the config and the layers can contradict, before any file.
void check_layers(const EngineConfig& config, const std::vector<LayerSpec>& layers) {
  if (layers.empty()) throw UsageError("OffloadEngine: no layers");
  // Tiers other than resident bring a layer into one of offload_param.buffer_count device
  // buffers of offload_param.buffer_size elements.
  const bool buffered = tier_uses_param_buffers(config.offload_param.device);
  std::unordered_set<std::string> names;
  std::uint64_t total_elements = 0;
  for (const auto& layer : layers) {
    if (layer.name.empty() || layer.name.find_first_of(" \t\r\n#/") != std::string::npos) {
      throw UsageError(
          "OffloadEngine: layer names must be non-empty, without spaces, '#' or '/', got " +
          in_quotes(layer.name));
    }
    if (!names.insert(layer.name).second) {
      throw UsageError("OffloadEngine: duplicate layer name " + in_quotes(layer.name));
    }
    if (layer.numel == 0)
      throw UsageError("OffloadEngine: layer " + in_quotes(layer.name) + " has 0 elements");
    // Before any size arithmetic: the planning multiplies element counts by up to 16 bytes
    // and sums them over layers, which must not wrap.
    if (layer.numel > kMaxLayerElements) {
      throw UsageError("OffloadEngine: layer " + in_quotes(layer.name) + " has " +
                       std::to_string(layer.numel) + " elements, more than zinf's limit of " +
                       std::to_string(kMaxLayerElements) + " (2^50) per layer");
    }
    total_elements += layer.numel;
    if (total_elements > kMaxModelElements) {
      throw UsageError("OffloadEngine: the layers hold more than zinf's limit of " +
                       std::to_string(kMaxModelElements) + " (2^54) elements in all");
    }
    if (layer.param_dtype != ElementType::kBF16 && layer.param_dtype != ElementType::kF16) {
      throw UsageError("OffloadEngine: layer " + in_quotes(layer.name) +
                       " param_dtype must be bf16 or fp16");
    }
    if (auto bad = layer.hyper ? adam::check_adam_params(*layer.hyper) : std::nullopt) {
      throw UsageError("OffloadEngine: layer " + in_quotes(layer.name) +
                       " hyper: " + std::string(bad->field) + " " + bad->what);
    }
    if (buffered && layer.numel > config.offload_param.buffer_size) {
      throw UsageError(
          "OffloadEngine: layer " + in_quotes(layer.name) + " has " + std::to_string(layer.numel) +
          " elements, more than offload_param.buffer_size " +
          std::to_string(config.offload_param.buffer_size) +
          "; raise offload_param.buffer_size to at least " + std::to_string(layer.numel));
    }
  }
  if (buffered && config.offload_param.buffer_count == 0) {
    throw UsageError("OffloadEngine: offload_param.buffer_count must be at least 1");
  }
}

// The sub-group size: where the tier needs each sub-group's copy-out to be whole units of its
// store (a range write into the layer's key), config.sub_group_size rounded up so that
// 2 x sub_group is a multiple of that unit.
void plan_sub_group(const EngineConfig& config, EnginePlan& plan) {
  plan.sub_group = std::clamp<std::uint64_t>(config.sub_group_size, 1, kMaxLayerElements);
  const std::uint64_t unit = plan.params.copy_out_unit;
  if (unit == 0) return;
  const std::uint64_t rounded = align_up(plan.sub_group * 2, unit) / 2;
  if (rounded != plan.sub_group) {
    plan.sub_group_note = "OffloadEngine: sub_group_size " + std::to_string(plan.sub_group) +
                          " rounded up to " + std::to_string(rounded) +
                          " so that each sub-group's parameter copy-out is whole " +
                          std::to_string(unit) + "-byte units of the parameter store";
  }
  plan.sub_group = rounded;
}

optim::OptimizerOptions optimizer_options(const EngineConfig& config, const EnginePlan& plan) {
  const bool nvme = config.offload_optimizer.device == OffloadDevice::kNvme;
  optim::OptimizerOptions oo;
  oo.tier = nvme ? optim::StateTier::kNvme : optim::StateTier::kCpu;
  oo.sub_group_elements = plan.sub_group;
  oo.pipeline_depth = config.offload_optimizer.buffer_count;
  oo.hyper = config.optimizer.hyper;
  oo.adam.threads = config.zinf.adam_threads;
  oo.state_precision = config.zinf.state_precision;
  if (nvme) oo.directories = config.nvme_directories(config.offload_optimizer.nvme_path);
  oo.io = config.io_options();
  oo.swap_checksums = config.zinf.checksums;
  oo.checkpoint_reflink = config.zinf.checkpoint_reflink;
  oo.direct_io = config.zinf.direct_io;
  oo.precondition = config.zinf.precondition;
  oo.store_copy_out = plan.params.store_copy_out;
  return oo;
}

// The staged mode's gradient staging: the whole model's gradients in pinned memory if the
// budget holds them next to everything else, else on NVMe through a ring; `base` is the rest's
// pinned bytes. Returns the note the budget error adds when neither fits and no NVMe
// directory was given.
struct StagePlan {
  std::string what;  // the staging, as the budget error names it
  std::string note;  // after the smallest budget: what else would have worked
};
StagePlan plan_stage(const EngineConfig& config, const std::vector<LayerSpec>& layers,
                     EnginePlan& plan) {
  StagePlan out;
  GradStageOptions& stage = plan.stage.emplace();
  for (const auto& layer : layers) stage.layers.push_back({layer.name, layer.numel});
  // Staging on NVMe goes where the state already streams: the optimizer's directories, else
  // the parameters', else zinf.nvme_paths.
  std::vector<std::string> dirs;
  if (config.offload_optimizer.device == OffloadDevice::kNvme) {
    dirs = config.nvme_directories(config.offload_optimizer.nvme_path);
  } else if (config.offload_param.device == OffloadDevice::kNvme) {
    dirs = config.nvme_directories(config.offload_param.nvme_path);
  } else {
    dirs = config.zinf.nvme_paths;
  }
  const std::uint64_t base = plan.pinned.total();
  const std::uint64_t budget = config.zinf.pinned_budget_bytes;
  plan.pinned.stage = grad_stage_pinned_bytes(stage.layers);
  out.what = "the gradient staging (the whole model's gradients as fp32)";
  if (base + plan.pinned.stage > budget && !dirs.empty()) {
    plan.pinned.stage = grad_stage_ring_bytes(stage.layers, dirs);
    out.what = "the NVMe gradient staging's ring (" + std::to_string(kStageRingSlots) +
               " fp32 buffers of the largest layer)";
    stage.nvme = true;
    stage.directories = dirs;
    stage.io = config.io_options();
    stage.checksums = config.zinf.checksums;
    stage.direct_io = config.zinf.direct_io;
  }
  if (base + plan.pinned.stage > budget && dirs.empty()) {
    out.note =
        " (with an NVMe directory, offload_optimizer or offload_param nvme_path or "
        "zinf.nvme_paths, the gradients could be staged on NVMe instead through a ring of " +
        std::to_string(kStageRingSlots) + " buffers of the largest layer)";
  }
  return out;
}

std::string budget_error(const EngineConfig& config, const EnginePlan& plan,
                         const StagePlan& stage) {
  const PinnedBreakdown& p = plan.pinned;
  std::string what =
      "OffloadEngine: zinf.pinned_budget_bytes " + std::to_string(config.zinf.pinned_budget_bytes) +
      " cannot hold the optimizer's " + std::to_string(p.optimizer) + " bytes plus " +
      plan.params.pinned_what + "'s " + std::to_string(p.params) + " bytes";
  if (p.device_grads > 0) {
    what += " plus the device-gradient staging's " + std::to_string(p.device_grads) +
            " bytes (zinf.grad_staging_buffers " +
            std::to_string(config.zinf.grad_staging_buffers) +
            " x the largest layer's fp32 gradients; 0 if gradients always come from host "
            "memory)";
  }
  if (plan.stage) what += " plus " + stage.what + "'s " + std::to_string(p.stage) + " bytes";
  return what + "; the smallest budget that works is " + std::to_string(p.total()) + stage.note;
}

// Drive wear: every step rewrites the optimizer's whole state (12 bytes per element with fp32
// moments, fewer with zinf.state_precision) and, with nvme parameters, the updated parameters.
// Padding to the I/O alignment adds a little; the measured figure follows after the first
// steps.
WearEstimate plan_wear(const EngineConfig& config, const std::vector<LayerSpec>& layers) {
  WearEstimate wear;
  std::uint64_t numel = 0, param_bytes = 0;
  for (const auto& layer : layers) {
    numel += layer.numel;
    param_bytes += layer.numel * element_size(layer.param_dtype);
  }
  std::vector<std::string> dirs;
  if (config.offload_optimizer.device == OffloadDevice::kNvme) {
    wear.bytes_per_step +=
        static_cast<double>(4 * numel + adam::moment_bytes(config.zinf.state_precision, numel));
    dirs = config.nvme_directories(config.offload_optimizer.nvme_path);
  }
  if (config.offload_param.device == OffloadDevice::kNvme) {
    wear.bytes_per_step += static_cast<double>(param_bytes);
    for (auto& pdir : config.nvme_directories(config.offload_param.nvme_path)) {
      if (std::find(dirs.begin(), dirs.end(), pdir) == dirs.end()) dirs.push_back(std::move(pdir));
    }
  }
  for (const auto& dir : dirs) wear.where += (wear.where.empty() ? "" : ", ") + dir;
  return wear;
}

// The notices at construction, and the drive-slowdown watches over the optimizer's
// directories.
void plan_notices(const EngineConfig& config, EnginePlan& plan) {
  for (const auto& notice : config.notices) plan.notices.push_back("config: " + notice);
  // Nothing on NVMe (or no rating): nothing to tell.
  if (plan.wear && plan.wear->bytes_per_step > 0) {
    plan.notices.push_back(wear_notice(*plan.wear, config.zinf.tbw_tb));
  }
  const std::vector<std::string>& dirs = plan.optimizer.directories;
  if (dirs.empty() || !(config.zinf.rate_notice_share > 0)) return;
  std::string where;
  for (const auto& dir : dirs) where += (where.empty() ? "" : ", ") + dir;
  plan.write_notice = RateNoticePlan{"optimizer writes to " + where, config.zinf.rate_notice_share,
                                     config.zinf.rate_notice_steps, config.zinf.tuned_write_gbps};
  plan.read_notice = RateNoticePlan{"optimizer reads from " + where, config.zinf.rate_notice_share,
                                    config.zinf.rate_notice_steps, config.zinf.tuned_read_gbps};
}

}  // namespace

EnginePlan plan_engine(const EngineConfig& config, const std::vector<LayerSpec>& layers) {
  check_config(config, "OffloadEngine");
  check_layers(config, layers);
  EnginePlan plan;
  plan.params = plan_param_tier(config, layers);
  plan_sub_group(config, plan);
  plan.optimizer = optimizer_options(config, plan);
  for (const auto& layer : layers) plan.groups.push_back({layer.name, layer.numel, layer.hyper});

  // The pinned budget: the optimizer's ring (or state), the parameter tier's, the
  // device-gradient staging (the largest layer's gradients in fp32, the widest dtype) and in
  // the staged mode the gradient staging: the whole model's gradients if they fit, else the
  // NVMe staging's ring.
  std::uint64_t largest = 0;
  for (const auto& layer : layers) largest = std::max(largest, layer.numel);
  plan.grad_slot_bytes = align_up(largest * sizeof(float), kHostAlign);
  plan.pinned.optimizer = optim::optimizer_pinned_bytes_needed(plan.optimizer, plan.groups);
  plan.pinned.params = plan.params.pinned_bytes;
  plan.pinned.device_grads = plan.grad_slot_bytes * config.zinf.grad_staging_buffers;
  plan.mode = config.effective_step_mode();
  StagePlan stage;
  if (plan.mode == StepMode::kStaged) stage = plan_stage(config, layers, plan);
  if (plan.pinned.total() > config.zinf.pinned_budget_bytes) {
    plan.budget_error = budget_error(config, plan, stage);
  }
  plan.optimizer.pinned_budget_bytes = plan.pinned.optimizer;

  if (config.zinf.tbw_tb > 0) plan.wear = plan_wear(config, layers);
  plan_notices(config, plan);
  return plan;
}

std::string wear_notice(const WearEstimate& wear, double tbw_tb) {
  const double tbw = tbw_tb * 1e12;
  return printf_string(
      "OffloadEngine: drive wear: each step writes about %.3g GB to %s; the rated %g TB of "
      "endurance lasts %.0f steps (1%% every %.0f steps); days at the step rate follow after "
      "the first steps",
      wear.bytes_per_step / 1e9, wear.where.c_str(), tbw_tb, tbw / wear.bytes_per_step,
      tbw / wear.bytes_per_step / 100);
}

std::string measured_wear_notice(const WearEstimate& wear, double tbw_tb, double bytes_per_step,
                                 double seconds_per_step, std::uint64_t last_step) {
  const double per_day = bytes_per_step * 86400 / seconds_per_step;
  const double tbw = tbw_tb * 1e12;
  return printf_string(
      "OffloadEngine: drive wear: %.3g GB written per step to %s at %.3g s per step (steps "
      "2-%llu), %.3g TB a day: the rated %g TB lasts %.3g days of training (1%% every %.3g "
      "hours)",
      bytes_per_step / 1e9, wear.where.c_str(), seconds_per_step,
      static_cast<unsigned long long>(last_step), per_day / 1e12, tbw_tb, tbw / per_day,
      tbw / per_day / 100 * 24);
}

}  // namespace zinf::offload::detail
