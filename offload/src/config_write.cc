// SPDX-License-Identifier: Apache-2.0
// config_to_json (zinf/offload/config.h): an EngineConfig written back as the DeepSpeed-style
// JSON that parse_config reads, every key explicit, so that a run's settings can be saved and
// read again to the same config.
#include <string>
#include <utility>

#include "config_json.h"
#include "zinf/common/element_type.h"
#include "zinf/common/error.h"
#include "zinf/offload/config.h"

namespace zinf::offload {

using detail::Json;

std::string config_to_json(const EngineConfig& c) {
  if (c.param_dtype != ElementType::kBF16 && c.param_dtype != ElementType::kF16) {
    throw UsageError("config_to_json: param_dtype " +
                     std::string(element_type_name(c.param_dtype)) +
                     " has no DeepSpeed form (parameters are bf16 or fp16)");
  }
  const auto offload_common = [](OffloadDevice device, const std::string& nvme_path,
                                 bool pin_memory) {
    Json block = Json::object();
    block["device"] = std::string(offload_device_name(device));
    if (!nvme_path.empty()) block["nvme_path"] = nvme_path;
    block["pin_memory"] = pin_memory;
    return block;
  };
  Json param =
      offload_common(c.offload_param.device, c.offload_param.nvme_path, c.offload_param.pin_memory);
  param["buffer_count"] = c.offload_param.buffer_count;
  param["buffer_size"] = c.offload_param.buffer_size;
  param["max_in_cpu"] = c.offload_param.max_in_cpu;

  const OffloadOptimizerConfig& o = c.offload_optimizer;
  Json optimizer_offload = offload_common(o.device, o.nvme_path, o.pin_memory);
  optimizer_offload["buffer_count"] = o.buffer_count;
  optimizer_offload["pipeline_read"] = o.pipeline_read;
  optimizer_offload["pipeline_write"] = o.pipeline_write;
  optimizer_offload["fast_init"] = o.fast_init;
  optimizer_offload["ratio"] = o.ratio;

  Json root = Json::object();
  Json& zero = root["zero_optimization"];
  zero["stage"] = c.zero_stage;
  zero["offload_param"] = std::move(param);
  zero["offload_optimizer"] = std::move(optimizer_offload);
  zero["sub_group_size"] = c.sub_group_size;

  Json& aio = root["aio"];
  aio["block_size"] = c.aio.block_size;
  aio["queue_depth"] = c.aio.queue_depth;
  aio["intra_op_parallelism"] = c.aio.intra_op_parallelism;
  aio["single_submit"] = c.aio.single_submit;
  aio["overlap_events"] = c.aio.overlap_events;
  aio["use_gds"] = c.aio.use_gds;

  const adam::AdamParams& hp = c.optimizer.hyper;
  Json& optimizer = root["optimizer"];
  optimizer["type"] = hp.mode == adam::AdamMode::kAdamW ? "AdamW" : "Adam";
  Json& params = optimizer["params"];
  params["lr"] = hp.lr;
  params["betas"] = Json::array({hp.beta1, hp.beta2});
  params["eps"] = hp.eps;
  params["weight_decay"] = hp.weight_decay;
  params["bias_correction"] = hp.bias_correction;
  params["adam_w_mode"] = hp.mode == adam::AdamMode::kAdamW;

  if (c.loss_scaling.enabled != (c.param_dtype == ElementType::kF16)) {
    throw UsageError(
        "config_to_json: loss_scaling.enabled and param_dtype fp16 are both fp16.enabled in a "
        "config; they must agree");
  }
  root["gradient_clipping"] = c.gradient_clipping;
  root["bf16"]["enabled"] = c.param_dtype == ElementType::kBF16;
  Json& fp16 = root["fp16"];
  fp16["enabled"] = c.param_dtype == ElementType::kF16;
  if (c.loss_scaling.enabled) {
    const LossScaleConfig& ls = c.loss_scaling;
    fp16["loss_scale"] = ls.loss_scale;
    fp16["initial_scale_power"] = ls.initial_scale_power;
    fp16["loss_scale_window"] = ls.loss_scale_window;
    fp16["hysteresis"] = ls.hysteresis;
    fp16["consecutive_hysteresis"] = ls.consecutive_hysteresis;
    fp16["min_loss_scale"] = ls.min_loss_scale;
  }

  Json& z = root["zinf"];
  z["nvme_paths"] = c.zinf.nvme_paths;
  z["pinned_budget_bytes"] = c.zinf.pinned_budget_bytes;
  z["checksums"] = c.zinf.checksums;
  z["checkpoint_reflink"] = c.zinf.checkpoint_reflink;
  z["backend"] = std::string(swap::io_engine_kind_name(c.zinf.backend));
  z["direct_io"] = c.zinf.direct_io;
  z["precondition"] = c.zinf.precondition;
  z["prefetch_depth"] = c.zinf.prefetch_depth;
  z["adam_threads"] = c.zinf.adam_threads;
  z["grad_staging_buffers"] = c.zinf.grad_staging_buffers;
  z["step_mode"] = std::string(step_mode_name(c.zinf.step_mode));
  z["rate_notice_share"] = c.zinf.rate_notice_share;
  z["rate_notice_steps"] = c.zinf.rate_notice_steps;
  z["tuned_write_gbps"] = c.zinf.tuned_write_gbps;
  z["tuned_read_gbps"] = c.zinf.tuned_read_gbps;
  z["tbw_tb"] = c.zinf.tbw_tb;
  z["state_precision"] = std::string(adam::state_precision_name(c.zinf.state_precision));
  return root.dump(2) + "\n";
}

}  // namespace zinf::offload
