// SPDX-License-Identifier: Apache-2.0
// The DeepSpeed-style config reader behind zinf/offload/config.h: the key tables, every key
// checked against the block it sits in, and the cross-key checks that must fail before any file
// is created. The config written back as JSON is config_write.cc's; the JSON itself (strict parsing, typed access
// with errors naming the key's path) is config_json.h's.
#include "zinf/offload/config.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <sstream>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "config_json.h"
#include "zinf/common/error.h"
#include "zinf/common/small_file.h"
#include "zinf/common/status.h"
#include "zinf/common/suggest.h"

namespace zinf::offload {
namespace {

using detail::Block;
using detail::Json;
using detail::parse_json;
using detail::shown;

// ---------------------------------------------------------------------------------------------
// Key tables. "with effect" keys are read below; "accepted" keys are DeepSpeed's (taken from
// deepspeed/runtime/zero/config.py, offload_config.py, precision_config.py and
// docs/_pages/config-json.md) that zinf accepts without effect, so an existing ds_config works.

constexpr std::string_view kTopKeys[] = {
    "zero_optimization", "aio",  "optimizer", "bf16",
    "bfloat16",          "fp16", "zinf",      "gradient_clipping"};
constexpr std::string_view kTopAccepted[] = {"train_batch_size",
                                             "train_micro_batch_size_per_gpu",
                                             "gradient_accumulation_steps",
                                             "managed_gradient_accumulation",
                                             "scheduler",
                                             "communication_data_type",
                                             "seq_parallel_communication_data_type",
                                             "gradient_allreduce_op",
                                             "prescale_gradients",
                                             "gradient_predivide_factor",
                                             "sparse_gradients",
                                             "amp",
                                             "torch_autocast",
                                             "zero_allow_untested_optimizer",
                                             "zero_force_ds_cpu_optimizer",
                                             "steps_per_print",
                                             "wall_clock_breakdown",
                                             "memory_breakdown",
                                             "dump_state",
                                             "autotuning",
                                             "flops_profiler",
                                             "activation_checkpointing",
                                             "sparse_attention",
                                             "data_efficiency",
                                             "curriculum_learning",
                                             "tensorboard",
                                             "wandb",
                                             "comet",
                                             "csv_monitor",
                                             "comms_logger",
                                             "elasticity",
                                             "compression_training",
                                             "checkpoint",
                                             "data_types",
                                             "tensor_parallel",
                                             "expert_parallel",
                                             "hybrid_engine",
                                             "pipeline",
                                             "eigenvalue",
                                             "progressive_layer_drop",
                                             "disable_allgather",
                                             "dataloader_drop_last",
                                             "compile",
                                             "nebula",
                                             "quantize_training",
                                             "weight_quantization",
                                             "check_overflow",
                                             "fp32_allreduce"};

constexpr std::string_view kZeroKeys[] = {"stage", "offload_param", "offload_optimizer",
                                          "sub_group_size"};
constexpr std::string_view kZeroAccepted[] = {"contiguous_gradients",
                                              "overlap_comm",
                                              "reduce_scatter",
                                              "reduce_bucket_size",
                                              "use_multi_rank_bucket_allreduce",
                                              "allgather_partitions",
                                              "allgather_bucket_size",
                                              "load_from_fp32_weights",
                                              "elastic_checkpoint",
                                              "grad_hooks",
                                              "stage3_prefetch_bucket_size",
                                              "prefetch_bucket_size",
                                              "stage3_param_persistence_threshold",
                                              "param_persistence_threshold",
                                              "stage3_model_persistence_threshold",
                                              "model_persistence_threshold",
                                              "stage3_max_live_parameters",
                                              "max_live_parameters",
                                              "stage3_max_reuse_distance",
                                              "max_reuse_distance",
                                              "stage3_gather_16bit_weights_on_model_save",
                                              "gather_16bit_weights_on_model_save",
                                              "stage3_gather_fp16_weights_on_model_save",
                                              "stage3_module_granularity_threshold",
                                              "module_granularity_threshold",
                                              "stage3_use_all_reduce_for_fetch_params",
                                              "use_all_reduce_for_fetch_params",
                                              "stage3_allgather_sequential",
                                              "allgather_sequential",
                                              "stage3_partition_stream_chunk_size",
                                              "partition_stream_chunk_size",
                                              "ignore_unused_parameters",
                                              "legacy_stage1",
                                              "round_robin_gradients",
                                              "zero_hpz_partition_size",
                                              "zero_quantized_weights",
                                              "zero_quantized_nontrainable_weights",
                                              "zero_quantized_gradients",
                                              "zeropp_loco_param",
                                              "mics_shard_size",
                                              "mics_hierarchical_params_gather",
                                              "memory_efficient_linear",
                                              "pipeline_loading_checkpoint",
                                              "override_module_apply",
                                              "log_trace_cache_warnings",
                                              "enable_sanity_checks",
                                              "save_muon_momentum_buffer_in_memory",
                                              "leaf_module",
                                              "zenflow",
                                              "cpu_offload",
                                              "cpu_offload_param",
                                              "cpu_offload_use_pin_memory"};
// The deprecated spellings of offload: accepted, but a notice says they do nothing here.
constexpr std::string_view kZeroDeprecatedOffload[] = {"cpu_offload", "cpu_offload_param",
                                                       "cpu_offload_use_pin_memory"};

constexpr std::string_view kParamKeys[] = {"device",       "nvme_path",   "pin_memory",
                                           "buffer_count", "buffer_size", "max_in_cpu"};
constexpr std::string_view kOptimizerOffloadKeys[] = {
    "device",        "nvme_path",      "pin_memory", "buffer_count",
    "pipeline_read", "pipeline_write", "fast_init",  "ratio"};
constexpr std::string_view kOptimizerOffloadAccepted[] = {"super_offload", "convert_grad_on_cpu",
                                                          "cpuadam_cores_perc"};
// swap::IoOptions::queue_depth's bound (io_uring's submission queue).
constexpr std::uint32_t kMaxQueueDepth = 4096;
constexpr std::string_view kAioKeys[] = {"block_size",   "queue_depth",   "intra_op_parallelism",
                                         "thread_count", "single_submit", "overlap_events",
                                         "use_gds"};
constexpr std::string_view kOptimizerKeys[] = {"type", "params"};
constexpr std::string_view kOptimizerAccepted[] = {"legacy_fusion"};
constexpr std::string_view kAdamKeys[] = {
    "lr", "betas", "eps", "weight_decay", "bias_correction", "adam_w_mode", "amsgrad"};
constexpr std::string_view kAdamAccepted[] = {"torch_adam", "fp32_optimizer_states"};
constexpr std::string_view kPrecisionKeys[] = {"enabled"};  // bf16 and bfloat16
constexpr std::string_view kBf16Accepted[] = {"immediate_grad_update", "check_grad_overflow",
                                              "bf16_master_weights_and_grads",
                                              "bf16_optimizer_states"};
// fp16's loss-scaling keys take effect (staged step mode); the rest are accepted.
constexpr std::string_view kFp16Keys[] = {
    "enabled",           "loss_scale", "initial_scale_power",
    "loss_scale_window", "hysteresis", "consecutive_hysteresis",
    "min_loss_scale"};
constexpr std::string_view kFp16Accepted[] = {"auto_cast", "fp16_master_weights_and_grads"};
constexpr std::string_view kZinfKeys[] = {
    "nvme_paths",       "pinned_budget_bytes", "checksums",
    "backend",          "direct_io",           "precondition",
    "prefetch_depth",   "adam_threads",        "grad_staging_buffers",
    "step_mode",        "rate_notice_share",   "rate_notice_steps",
    "tuned_write_gbps", "tuned_read_gbps",     "tbw_tb",
    "state_precision",  "checkpoint_reflink"};

OffloadDevice parse_device(const Block& block) {
  std::string text = "none";
  block.read_string("device", text);
  if (text == "none") return OffloadDevice::kNone;
  if (text == "cpu") return OffloadDevice::kCpu;
  if (text == "nvme") return OffloadDevice::kNvme;
  block.fail("device",
             "expected \"none\", \"cpu\" or \"nvme\", got " + shown(*block.find("device")));
}

void read_nvme_path(const Block& block, std::string& out) {
  block.read_string("nvme_path", out, /*allow_null=*/true);
  if (block.find("nvme_path") != nullptr && !block.find("nvme_path")->is_null() && out.empty()) {
    block.fail("nvme_path", "empty path (give a directory, or omit the key)");
  }
}

void parse_offload_param(const Block& block, OffloadParamConfig& out) {
  block.check_keys(kParamKeys);
  out.device = parse_device(block);
  read_nvme_path(block, out.nvme_path);
  block.read_bool("pin_memory", out.pin_memory);
  block.read_uint("buffer_count", out.buffer_count);
  block.read_uint("buffer_size", out.buffer_size);
  block.read_uint("max_in_cpu", out.max_in_cpu);
  if (block.find("max_in_cpu") != nullptr) {
    block.notice(block.key_path("max_in_cpu") +
                 ": accepted without effect in zinf (no CPU cache "
                 "of NVMe parameters)");
  }
  if (!out.pin_memory) {
    block.notice(block.key_path("pin_memory") +
                 ": false has no effect; zinf always stages "
                 "through page-locked memory");
  }
}

void parse_offload_optimizer(const Block& block, OffloadOptimizerConfig& out) {
  block.check_keys(kOptimizerOffloadKeys, kOptimizerOffloadAccepted);
  out.device = parse_device(block);
  read_nvme_path(block, out.nvme_path);
  block.read_bool("pin_memory", out.pin_memory);
  block.read_uint("buffer_count", out.buffer_count);
  block.read_bool("pipeline_read", out.pipeline_read);
  block.read_bool("pipeline_write", out.pipeline_write);
  block.read_bool("fast_init", out.fast_init);
  block.read_number("ratio", out.ratio);
  if (out.ratio != 1.0) {
    block.fail("ratio", "only 1.0 is supported (partial optimizer offload is not built), got " +
                            shown(*block.find("ratio")));
  }
  if (!out.pin_memory) {
    block.notice(block.key_path("pin_memory") +
                 ": false has no effect; zinf always stages "
                 "through page-locked memory");
  }
}

void parse_zero(const Json& value, std::string_view source, EngineConfig& config) {
  if (value.is_boolean()) {
    // DeepSpeed's oldest form: "zero_optimization": true means stage 1.
    config.zero_stage = value.get<bool>() ? 1 : 0;
    config.notices.push_back("zero_optimization: the boolean form is deprecated; read as stage " +
                             std::to_string(config.zero_stage));
    return;
  }
  if (value.is_null()) return;
  if (!value.is_object()) {
    throw UsageError(std::string(source) + ": zero_optimization: expected an object {...}, got " +
                     shown(value));
  }
  const Block zero(value, "zero_optimization", source, &config.notices);
  zero.check_keys(kZeroKeys, kZeroAccepted);
  if (const Json* stage = zero.find("stage")) {
    const std::uint32_t number = zero.to_uint<std::uint32_t>("stage", *stage, 0);
    if (number > 3) zero.fail("stage", "expected 0, 1, 2 or 3, got " + shown(*stage));
    config.zero_stage = static_cast<int>(number);
  }
  zero.read_uint("sub_group_size", config.sub_group_size);
  if (config.sub_group_size < kConfigMinSubGroupSize) {
    zero.fail("sub_group_size", shown(*zero.find("sub_group_size")) +
                                    " is too small: the smallest accepted is " +
                                    std::to_string(kConfigMinSubGroupSize) +
                                    " (each sub-group's 12-byte-per-element "
                                    "record is padded to the 4096-byte I/O alignment; from " +
                                    std::to_string(kConfigMinSubGroupSize) +
                                    " elements on the padding is at most "
                                    "~1% of the state)");
  }
  for (std::string_view key : kZeroDeprecatedOffload) {
    if (zero.find(key) != nullptr) {
      zero.notice(zero.key_path(key) +
                  ": deprecated DeepSpeed key with no effect in zinf; use "
                  "offload_param / offload_optimizer {\"device\": \"cpu\"}");
    }
  }
  if (const auto param = zero.child("offload_param")) {
    parse_offload_param(*param, config.offload_param);
  }
  if (const auto optimizer = zero.child("offload_optimizer")) {
    parse_offload_optimizer(*optimizer, config.offload_optimizer);
  }
}

void parse_aio(const Block& aio, AioConfig& out) {
  aio.check_keys(kAioKeys);
  aio.read_uint("block_size", out.block_size, 1u);
  if (out.block_size % 4096 != 0) {
    aio.fail("block_size", "must be a multiple of 4096 (O_DIRECT alignment), got " +
                               shown(*aio.find("block_size")));
  }
  aio.read_uint("queue_depth", out.queue_depth, 1u);
  if (out.queue_depth > kMaxQueueDepth) {  // the I/O engine's limit, named here with the key
    aio.fail("queue_depth", "at most " + std::to_string(kMaxQueueDepth) + " pieces in flight, got " +
                                shown(*aio.find("queue_depth")));
  }
  const Json* intra = aio.find("intra_op_parallelism");
  const Json* old = aio.find("thread_count");
  if (intra != nullptr && old != nullptr) {
    aio.fail("thread_count",
             "both intra_op_parallelism and its older name thread_count are "
             "given; keep intra_op_parallelism");
  }
  if (intra != nullptr) {
    out.intra_op_parallelism = aio.to_uint<std::uint32_t>("intra_op_parallelism", *intra, 0);
  } else if (old != nullptr) {
    out.intra_op_parallelism = aio.to_uint<std::uint32_t>("thread_count", *old, 0);
    aio.notice(aio.key_path("thread_count") +
               ": older name of aio.intra_op_parallelism; read as intra_op_parallelism " +
               std::to_string(out.intra_op_parallelism));
  }
  aio.read_bool("single_submit", out.single_submit);
  aio.read_bool("overlap_events", out.overlap_events);
  aio.read_bool("use_gds", out.use_gds);
  if (out.use_gds) {
    aio.fail("use_gds", "true is not supported: GPUDirect Storage is not built into zinf");
  }
  if (out.single_submit) {
    aio.notice(aio.key_path("single_submit") +
               ": true has no effect; zinf always submits in batches");
  }
  if (!out.overlap_events) {
    aio.notice(aio.key_path("overlap_events") +
               ": false has no effect; zinf always overlaps submission and completion");
  }
}

std::string lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

void parse_optimizer(const Block& block, OptimizerConfig& out) {
  block.check_keys(kOptimizerKeys, kOptimizerAccepted);
  std::string type = "Adam";
  block.read_string("type", type);
  const std::string name = lower(type);  // DeepSpeed compares its own optimizers lower-cased
  if (name != "adam" && name != "adamw") {
    block.fail("type", shown(*block.find("type")) +
                           " is not supported; zinf's CPU optimizer "
                           "implements \"Adam\" and \"AdamW\"");
  }
  adam::AdamParams& hp = out.hyper;
  // DeepSpeed: "Adam" means decoupled decay unless params.adam_w_mode is false; "AdamW" always.
  bool adam_w_mode = true;
  if (const auto params = block.child("params")) {
    params->check_keys(kAdamKeys, kAdamAccepted);
    params->read_number("lr", hp.lr);
    if (const Json* betas = params->find("betas")) {
      if (!betas->is_array() || betas->size() != 2) {
        params->fail("betas", "expected [beta1, beta2], got " + shown(*betas));
      }
      hp.beta1 = params->to_number("betas", (*betas)[0]);
      hp.beta2 = params->to_number("betas", (*betas)[1]);
      if (!(hp.beta1 >= 0 && hp.beta1 < 1) || !(hp.beta2 >= 0 && hp.beta2 < 1)) {
        params->fail("betas", "each beta must be in [0, 1), got " + shown(*betas));
      }
    }
    params->read_number("eps", hp.eps);
    params->read_number("weight_decay", hp.weight_decay);
    // The optimizer's own check (shared with set_hyper and the C API), so a config cannot
    // hold a value the first step would refuse; its field names are the config's keys.
    if (auto bad = adam::check_adam_params(hp)) params->fail(bad->field, bad->what);
    params->read_bool("bias_correction", hp.bias_correction);
    params->read_bool("adam_w_mode", adam_w_mode);
    bool amsgrad = false;
    params->read_bool("amsgrad", amsgrad);
    if (amsgrad) params->fail("amsgrad", "true is not supported by zinf's CPU Adam");
  }
  hp.mode = (name == "adamw" || adam_w_mode) ? adam::AdamMode::kAdamW : adam::AdamMode::kAdam;
}

// bf16 / bfloat16 / fp16: {"enabled": bool, ...}; returns whether enabled.
bool parse_precision(const Block& block, std::span<const std::string_view> accepted) {
  block.check_keys(kPrecisionKeys, accepted);
  bool enabled = false;
  block.read_bool("enabled", enabled);
  return enabled;
}

// fp16: {"enabled": bool, loss scaling keys}. The loss-scaling keys are read (and checked)
// either way, and say so in a notice when fp16 is not enabled.
bool parse_fp16(const Block& block, LossScaleConfig& out) {
  block.check_keys(kFp16Keys, kFp16Accepted);
  bool enabled = false;
  block.read_bool("enabled", enabled);
  block.read_number("loss_scale", out.loss_scale);
  block.read_uint("initial_scale_power", out.initial_scale_power);
  block.read_uint("loss_scale_window", out.loss_scale_window, 1u);
  block.read_uint("hysteresis", out.hysteresis, 1u);
  block.read_bool("consecutive_hysteresis", out.consecutive_hysteresis);
  block.read_number("min_loss_scale", out.min_loss_scale);
  out.enabled = enabled;
  if (!enabled) {
    std::string present;
    for (std::string_view key : std::span(kFp16Keys).subspan(1)) {
      if (block.find(key) != nullptr) present += (present.empty() ? "" : ", ") + std::string(key);
    }
    if (!present.empty()) {
      block.notice("fp16: without effect while fp16.enabled is false: " + present);
    }
  }
  return enabled;
}

void parse_zinf(const Block& block, ZinfSection& out) {
  block.check_keys(kZinfKeys);
  if (const Json* paths = block.find("nvme_paths")) {
    if (!paths->is_array()) {
      block.fail("nvme_paths", "expected an array of directories, got " + shown(*paths));
    }
    out.nvme_paths.clear();
    for (std::size_t i = 0; i < paths->size(); ++i) {
      const Json& p = (*paths)[i];
      const std::string key = "nvme_paths[" + std::to_string(i) + "]";
      if (!p.is_string()) block.fail(key, "expected a string, got " + shown(p));
      if (p.get<std::string>().empty()) block.fail(key, "empty path");
      if (p.get<std::string>().find('\0') != std::string::npos) {
        block.fail(key, "the string has a NUL byte (\\u0000)");
      }
      out.nvme_paths.push_back(p.get<std::string>());
    }
  }
  block.read_uint("pinned_budget_bytes", out.pinned_budget_bytes, std::uint64_t{1});
  block.read_bool("checksums", out.checksums);
  block.read_bool("checkpoint_reflink", out.checkpoint_reflink);
  if (const Json* backend = block.find("backend")) {
    if (!backend->is_string()) {
      block.fail("backend", "expected \"auto\", \"uring\" or \"threads\", got " + shown(*backend));
    }
    const std::string text = backend->get<std::string>();
    if (text == "auto") {
      out.backend = swap::IoEngineKind::kAuto;
    } else if (text == "uring") {
      out.backend = swap::IoEngineKind::kUring;
    } else if (text == "threads") {
      out.backend = swap::IoEngineKind::kThreads;
    } else {
      block.fail("backend", "expected \"auto\", \"uring\" or \"threads\", got " + shown(*backend));
    }
  }
  block.read_bool("direct_io", out.direct_io);
  block.read_bool("precondition", out.precondition);
  block.read_uint("prefetch_depth", out.prefetch_depth);
  block.read_uint("adam_threads", out.adam_threads);  // bounded by check_config
  block.read_uint("grad_staging_buffers", out.grad_staging_buffers);
  block.read_number("rate_notice_share", out.rate_notice_share);
  if (!(out.rate_notice_share >= 0 && out.rate_notice_share < 1)) {
    block.fail("rate_notice_share", "expected a share in [0, 1) (0: no notice), got " +
                                        shown(*block.find("rate_notice_share")));
  }
  block.read_uint("rate_notice_steps", out.rate_notice_steps, std::uint32_t{1});
  for (const char* key : {"tuned_write_gbps", "tuned_read_gbps"}) {
    double& rate =
        std::string_view(key) == "tuned_write_gbps" ? out.tuned_write_gbps : out.tuned_read_gbps;
    block.read_number(key, rate);
    if (!(rate >= 0) || !std::isfinite(rate)) {
      block.fail(key, "expected GB/s >= 0 (0: measured by the first steps), got " +
                          shown(*block.find(key)));
    }
  }
  block.read_number("tbw_tb", out.tbw_tb);
  if (!(out.tbw_tb >= 0) || !std::isfinite(out.tbw_tb)) {
    block.fail("tbw_tb", "expected the rated endurance in TB >= 0 (0: no wear notice), got " +
                             shown(*block.find("tbw_tb")));
  }
  if (const Json* prec = block.find("state_precision")) {
    const std::string text = prec->is_string() ? prec->get<std::string>() : std::string();
    if (text == "fp32" || text == "bf16" || text == "int8") {
      out.state_precision = adam::parse_state_precision(text, "zinf.state_precision");
    } else {
      block.fail("state_precision",
                 "expected \"fp32\", \"bf16\" or \"int8\", got " + shown(*prec));
    }
  }
  if (const Json* mode = block.find("step_mode")) {
    const std::string text = mode->is_string() ? mode->get<std::string>() : std::string();
    if (text == "auto") {
      out.step_mode = StepMode::kAuto;
    } else if (text == "on_arrival") {
      out.step_mode = StepMode::kOnArrival;
    } else if (text == "staged") {
      out.step_mode = StepMode::kStaged;
    } else {
      block.fail("step_mode",
                 "expected \"auto\", \"on_arrival\" or \"staged\", got " + shown(*mode));
    }
  }
}

// The largest loss scale: 1/2^126 is the smallest normal fp32, so the step's grad_scale stays
// one.
constexpr double kMaxLossScale = 8.507059173023462e+37;  // 2^126
constexpr std::uint32_t kMaxScalePower = 126;

std::string number_text(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

}  // namespace

// Settings that contradict each other; checked after every key has been read, before any engine
// or file exists.
void check_config(const EngineConfig& c, std::string_view source) {
  const auto fail = [source](const std::string& what) {
    throw UsageError(std::string(source) + ": " + what);
  };
  // The sizes and counts the planning multiplies and rounds up (buffer_count x buffer_size x
  // 2 bytes, aligned; depth x the largest record): bounded here, the one check that both the
  // reader and a config built in code pass, so that no product or rounding leaves 64 bits
  // (align_up would abort the process) and a count that could never be allocated is named.
  struct Bound {
    std::string_view key;
    std::uint64_t value;
    std::uint64_t max;
    std::string_view why;
  };
  const Bound bounds[] = {
      {"zero_optimization.offload_param.buffer_size", c.offload_param.buffer_size,
       kConfigMaxBufferSize, " (2^50 elements: the largest layer zinf takes)"},
      {"zero_optimization.offload_param.buffer_count", c.offload_param.buffer_count,
       kConfigMaxCount, ""},
      {"zero_optimization.offload_optimizer.buffer_count", c.offload_optimizer.buffer_count,
       kConfigMaxCount, ""},
      {"zinf.prefetch_depth", c.zinf.prefetch_depth, kConfigMaxCount, ""},
      {"zinf.adam_threads", c.zinf.adam_threads, kConfigMaxCount, ""},
      {"zinf.grad_staging_buffers", c.zinf.grad_staging_buffers, 64, ""},
  };
  for (const Bound& b : bounds) {
    if (b.value > b.max) {
      fail(std::string(b.key) + ": at most " + std::to_string(b.max) + std::string(b.why) +
           ", got " + std::to_string(b.value));
    }
  }
  const auto check_nvme = [&](OffloadDevice device, const std::string& path,
                              const std::string& block) {
    if (device == OffloadDevice::kNvme && path.empty() && c.zinf.nvme_paths.empty()) {
      fail(block + ".nvme_path: device is \"nvme\" but no NVMe directory is given (set " + block +
           ".nvme_path or zinf.nvme_paths)");
    }
  };
  check_nvme(c.offload_param.device, c.offload_param.nvme_path, "zero_optimization.offload_param");
  check_nvme(c.offload_optimizer.device, c.offload_optimizer.nvme_path,
             "zero_optimization.offload_optimizer");
  if (c.offload_param.device != OffloadDevice::kNone && c.zero_stage < 3) {
    fail("zero_optimization.offload_param.device: parameter offload (\"" +
         std::string(offload_device_name(c.offload_param.device)) +
         "\") needs zero_optimization.stage 3, but stage is " + std::to_string(c.zero_stage));
  }
  if (!(c.gradient_clipping >= 0 && std::isfinite(c.gradient_clipping))) {
    fail("gradient_clipping: must be a finite number >= 0 (0: no clipping), got " +
         number_text(c.gradient_clipping));
  }
  const LossScaleConfig& ls = c.loss_scaling;
  if (!(ls.loss_scale >= 0 && ls.loss_scale <= kMaxLossScale)) {
    fail("fp16.loss_scale: must be 0 (dynamic) or a static scale in (0, 2^126], got " +
         number_text(ls.loss_scale));
  }
  if (ls.initial_scale_power > kMaxScalePower) {
    fail("fp16.initial_scale_power: at most 126 (1/2^126 is the smallest normal fp32), got " +
         std::to_string(ls.initial_scale_power));
  }
  if (!(ls.min_loss_scale > 0 && ls.min_loss_scale <= kMaxLossScale)) {
    fail("fp16.min_loss_scale: must be in (0, 2^126], got " + number_text(ls.min_loss_scale));
  }
  if (ls.loss_scale_window == 0) fail("fp16.loss_scale_window: must be at least 1, got 0");
  if (ls.hysteresis == 0) fail("fp16.hysteresis: must be at least 1, got 0");
  if (c.zinf.step_mode == StepMode::kOnArrival &&
      (c.gradient_clipping > 0 || c.loss_scaling.enabled)) {
    const std::string what = c.gradient_clipping > 0
                                 ? "gradient_clipping " + number_text(c.gradient_clipping) +
                                       " (it needs the global norm of every gradient)"
                                 : std::string(
                                       "fp16 loss scaling (it needs every gradient "
                                       "checked for overflow)");
    fail(
        "zinf.step_mode: \"on_arrival\" updates each layer as its gradients arrive, so it "
        "cannot apply " +
        what + " before any update; set zinf.step_mode to \"staged\" or \"auto\"");
  }
  if (c.offload_optimizer.device == OffloadDevice::kNvme && c.offload_optimizer.buffer_count < 3) {
    fail(
        "zero_optimization.offload_optimizer.buffer_count: the NVMe optimizer pipeline needs at "
        "least 3 buffers (one being read ahead, one being updated, one being written back), "
        "got " +
        std::to_string(c.offload_optimizer.buffer_count));
  }
}

std::string_view offload_device_name(OffloadDevice device) noexcept {
  switch (device) {
    case OffloadDevice::kNone: return "none";
    case OffloadDevice::kCpu: return "cpu";
    case OffloadDevice::kNvme: return "nvme";
  }
  return "unknown";
}

std::string_view step_mode_name(StepMode mode) noexcept {
  switch (mode) {
    case StepMode::kAuto: return "auto";
    case StepMode::kOnArrival: return "on_arrival";
    case StepMode::kStaged: return "staged";
  }
  return "unknown";
}

StepMode EngineConfig::effective_step_mode() const noexcept {
  if (zinf.step_mode != StepMode::kAuto) return zinf.step_mode;
  return gradient_clipping > 0 || loss_scaling.enabled ? StepMode::kStaged : StepMode::kOnArrival;
}

swap::IoOptions EngineConfig::io_options() const {
  swap::IoOptions options;
  options.kind = zinf.backend;
  options.block_size = aio.block_size;
  options.queue_depth = aio.queue_depth;
  options.threads = aio.intra_op_parallelism;
  return options;
}

std::vector<std::string> EngineConfig::nvme_directories(const std::string& nvme_path) const {
  // Repeats are kept on purpose: naming a directory twice gives it two swap files, and with
  // them twice the share of the stripes (SwapStoreOptions::directories).
  std::vector<std::string> dirs;
  if (!nvme_path.empty()) dirs.push_back(nvme_path);
  dirs.insert(dirs.end(), zinf.nvme_paths.begin(), zinf.nvme_paths.end());
  return dirs;
}

EngineConfig parse_config(std::string_view json, std::string_view source) {
  const Json root = parse_json(json, source);
  if (!root.is_object()) {
    throw UsageError(std::string(source) + ": the config must be a JSON object {...}, got " +
                     shown(root));
  }
  EngineConfig config;
  const Block top(root, "", source, &config.notices);
  top.check_keys(kTopKeys, kTopAccepted);

  if (const Json* zero = top.find("zero_optimization")) parse_zero(*zero, source, config);
  if (const auto aio = top.child("aio")) parse_aio(*aio, config.aio);
  if (const auto optimizer = top.child("optimizer")) {
    parse_optimizer(*optimizer, config.optimizer);
  } else {
    config.optimizer.hyper.mode = adam::AdamMode::kAdam;  // no block: torch.optim.Adam's defaults
  }

  if (top.find("bf16") != nullptr && top.find("bfloat16") != nullptr) {
    top.fail("bfloat16", "both bf16 and its older name bfloat16 are given; keep bf16");
  }
  bool bf16 = false;
  if (const auto b = top.child("bf16")) bf16 = parse_precision(*b, kBf16Accepted);
  if (const auto b = top.child("bfloat16")) {
    bf16 = parse_precision(*b, kBf16Accepted);
    config.notices.push_back("bfloat16: older name of bf16; read as bf16");
  }
  bool fp16 = false;
  if (const auto f = top.child("fp16")) fp16 = parse_fp16(*f, config.loss_scaling);
  top.read_number("gradient_clipping", config.gradient_clipping);
  if (bf16 && fp16) {
    top.fail("fp16", "bf16.enabled and fp16.enabled are both true; enable one of them");
  }
  config.param_dtype = fp16 ? ElementType::kF16 : ElementType::kBF16;

  if (const auto z = top.child("zinf")) parse_zinf(*z, config.zinf);
  check_config(config, source);
  return config;
}

EngineConfig load_config(const std::string& path) {
  return parse_config(
      read_small_regular_file(path, kConfigMaxBytes, "config", "; give a JSON file"), path);
}

}  // namespace zinf::offload
