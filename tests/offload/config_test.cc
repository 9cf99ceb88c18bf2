// SPDX-License-Identifier: Apache-2.0
// EngineConfig parsing: every key and alias, the exact text of every error a user can see,
// integers written as 1e8, a real ZeRO-Infinity ds_config, load_config's file errors, hostile
// input (deep nesting, huge or special files, overflowing numbers, absurd values), and the
// config_to_json round trip.
#include "zinf/offload/config.h"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <future>
#include <string>
#include <vector>

#include "support/test_dir.h"
#include "zinf/common/error.h"

namespace zinf::offload {
namespace {

// The exact one-line message parse_config throws for `json` (source "cfg.json").
std::string error_of(const std::string& json) {
  try {
    (void)parse_config(json, "cfg.json");
  } catch (const UsageError& e) {
    return e.what();
  }
  return "(no error)";
}

// The exact one-line message check_config throws for `c` (its default source).
std::string what_of_check(const EngineConfig& c) {
  try {
    check_config(c);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "(no error)";
}

bool has_notice(const EngineConfig& c, const std::string& part) {
  for (const std::string& n : c.notices) {
    if (n.find(part) != std::string::npos) return true;
  }
  return false;
}

// Field-by-field equality (EngineConfig has no operator==; notices are not compared).
void expect_same(const EngineConfig& a, const EngineConfig& b) {
  EXPECT_EQ(a.zero_stage, b.zero_stage);
  EXPECT_EQ(a.offload_param.device, b.offload_param.device);
  EXPECT_EQ(a.offload_param.nvme_path, b.offload_param.nvme_path);
  EXPECT_EQ(a.offload_param.pin_memory, b.offload_param.pin_memory);
  EXPECT_EQ(a.offload_param.buffer_count, b.offload_param.buffer_count);
  EXPECT_EQ(a.offload_param.buffer_size, b.offload_param.buffer_size);
  EXPECT_EQ(a.offload_param.max_in_cpu, b.offload_param.max_in_cpu);
  EXPECT_EQ(a.offload_optimizer.device, b.offload_optimizer.device);
  EXPECT_EQ(a.offload_optimizer.nvme_path, b.offload_optimizer.nvme_path);
  EXPECT_EQ(a.offload_optimizer.pin_memory, b.offload_optimizer.pin_memory);
  EXPECT_EQ(a.offload_optimizer.buffer_count, b.offload_optimizer.buffer_count);
  EXPECT_EQ(a.offload_optimizer.pipeline_read, b.offload_optimizer.pipeline_read);
  EXPECT_EQ(a.offload_optimizer.pipeline_write, b.offload_optimizer.pipeline_write);
  EXPECT_EQ(a.offload_optimizer.fast_init, b.offload_optimizer.fast_init);
  EXPECT_EQ(a.offload_optimizer.ratio, b.offload_optimizer.ratio);
  EXPECT_EQ(a.sub_group_size, b.sub_group_size);
  EXPECT_EQ(a.aio.block_size, b.aio.block_size);
  EXPECT_EQ(a.aio.queue_depth, b.aio.queue_depth);
  EXPECT_EQ(a.aio.intra_op_parallelism, b.aio.intra_op_parallelism);
  EXPECT_EQ(a.aio.single_submit, b.aio.single_submit);
  EXPECT_EQ(a.aio.overlap_events, b.aio.overlap_events);
  EXPECT_EQ(a.aio.use_gds, b.aio.use_gds);
  const adam::AdamParams& x = a.optimizer.hyper;
  const adam::AdamParams& y = b.optimizer.hyper;
  EXPECT_EQ(x.lr, y.lr);
  EXPECT_EQ(x.beta1, y.beta1);
  EXPECT_EQ(x.beta2, y.beta2);
  EXPECT_EQ(x.eps, y.eps);
  EXPECT_EQ(x.weight_decay, y.weight_decay);
  EXPECT_EQ(x.bias_correction, y.bias_correction);
  EXPECT_EQ(x.mode, y.mode);
  EXPECT_EQ(a.gradient_clipping, b.gradient_clipping);
  EXPECT_EQ(a.loss_scaling.enabled, b.loss_scaling.enabled);
  EXPECT_EQ(a.loss_scaling.loss_scale, b.loss_scaling.loss_scale);
  EXPECT_EQ(a.loss_scaling.initial_scale_power, b.loss_scaling.initial_scale_power);
  EXPECT_EQ(a.loss_scaling.loss_scale_window, b.loss_scaling.loss_scale_window);
  EXPECT_EQ(a.loss_scaling.hysteresis, b.loss_scaling.hysteresis);
  EXPECT_EQ(a.loss_scaling.consecutive_hysteresis, b.loss_scaling.consecutive_hysteresis);
  EXPECT_EQ(a.loss_scaling.min_loss_scale, b.loss_scaling.min_loss_scale);
  EXPECT_EQ(a.zinf.step_mode, b.zinf.step_mode);
  EXPECT_EQ(a.zinf.state_precision, b.zinf.state_precision);
  EXPECT_EQ(a.zinf.nvme_paths, b.zinf.nvme_paths);
  EXPECT_EQ(a.zinf.pinned_budget_bytes, b.zinf.pinned_budget_bytes);
  EXPECT_EQ(a.zinf.checksums, b.zinf.checksums);
  EXPECT_EQ(a.zinf.checkpoint_reflink, b.zinf.checkpoint_reflink);
  EXPECT_EQ(a.zinf.backend, b.zinf.backend);
  EXPECT_EQ(a.zinf.direct_io, b.zinf.direct_io);
  EXPECT_EQ(a.zinf.precondition, b.zinf.precondition);
  EXPECT_EQ(a.zinf.prefetch_depth, b.zinf.prefetch_depth);
  EXPECT_EQ(a.zinf.adam_threads, b.zinf.adam_threads);
  EXPECT_EQ(a.param_dtype, b.param_dtype);
}

TEST(Config, EmptyObjectGivesDefaults) {
  const EngineConfig c = parse_config("{}");
  expect_same(c, EngineConfig{});
  EXPECT_TRUE(c.notices.empty());
  EXPECT_TRUE(c.zinf.checksums);  // integrity unless the config opts out
  EXPECT_TRUE(c.zinf.checkpoint_reflink);
  EXPECT_EQ(c.optimizer.hyper.mode, adam::AdamMode::kAdam);
  EXPECT_EQ(c.param_dtype, ElementType::kBF16);
}

TEST(Config, ReadsEveryZeroOptimizationKey) {
  const EngineConfig c = parse_config(R"({"zero_optimization": {
      "stage": 3, "sub_group_size": 123457,
      "offload_param": {"device": "nvme", "nvme_path": "/p", "pin_memory": false,
                        "buffer_count": 7, "buffer_size": 2000000, "max_in_cpu": 99},
      "offload_optimizer": {"device": "cpu", "nvme_path": "/o", "pin_memory": false,
                            "buffer_count": 6, "pipeline_read": true, "pipeline_write": true,
                            "fast_init": true, "ratio": 1.0}}})");
  EXPECT_EQ(c.zero_stage, 3);
  EXPECT_EQ(c.sub_group_size, 123457u);
  EXPECT_EQ(c.offload_param.device, OffloadDevice::kNvme);
  EXPECT_EQ(c.offload_param.nvme_path, "/p");
  EXPECT_FALSE(c.offload_param.pin_memory);
  EXPECT_EQ(c.offload_param.buffer_count, 7u);
  EXPECT_EQ(c.offload_param.buffer_size, 2000000u);
  EXPECT_EQ(c.offload_param.max_in_cpu, 99u);
  EXPECT_EQ(c.offload_optimizer.device, OffloadDevice::kCpu);
  EXPECT_EQ(c.offload_optimizer.nvme_path, "/o");
  EXPECT_FALSE(c.offload_optimizer.pin_memory);
  EXPECT_EQ(c.offload_optimizer.buffer_count, 6u);
  EXPECT_TRUE(c.offload_optimizer.pipeline_read);
  EXPECT_TRUE(c.offload_optimizer.pipeline_write);
  EXPECT_TRUE(c.offload_optimizer.fast_init);
  EXPECT_EQ(c.offload_optimizer.ratio, 1.0);
  EXPECT_TRUE(has_notice(c, "zero_optimization.offload_param.pin_memory: false has no effect"));
  EXPECT_TRUE(has_notice(c, "zero_optimization.offload_param.max_in_cpu: accepted without effect"));
}

TEST(Config, ReadsEveryAioKey) {
  const EngineConfig c = parse_config(R"({"aio": {"block_size": 262144, "queue_depth": 32,
      "intra_op_parallelism": 4, "single_submit": true, "overlap_events": false,
      "use_gds": false}})");
  EXPECT_EQ(c.aio.block_size, 262144u);
  EXPECT_EQ(c.aio.queue_depth, 32u);
  EXPECT_EQ(c.aio.intra_op_parallelism, 4u);
  EXPECT_TRUE(c.aio.single_submit);
  EXPECT_FALSE(c.aio.overlap_events);
  EXPECT_FALSE(c.aio.use_gds);
  EXPECT_TRUE(has_notice(c, "aio.single_submit: true has no effect"));
  EXPECT_TRUE(has_notice(c, "aio.overlap_events: false has no effect"));
}

TEST(Config, ThreadCountIsTheOlderNameOfIntraOpParallelism) {
  const EngineConfig c = parse_config(R"({"aio": {"thread_count": 3}})");
  EXPECT_EQ(c.aio.intra_op_parallelism, 3u);
  ASSERT_EQ(c.notices.size(), 1u);
  EXPECT_EQ(c.notices[0],
            "aio.thread_count: older name of aio.intra_op_parallelism; read as "
            "intra_op_parallelism 3");
  EXPECT_EQ(error_of(R"({"aio": {"thread_count": 1, "intra_op_parallelism": 2}})"),
            "cfg.json: aio.thread_count: both intra_op_parallelism and its older name "
            "thread_count are given; keep intra_op_parallelism");
}

TEST(Config, IoOptionsComeFromAioAndBackend) {
  const EngineConfig c = parse_config(R"({"aio": {"block_size": 524288, "queue_depth": 4,
      "intra_op_parallelism": 2}, "zinf": {"backend": "threads"}})");
  const swap::IoOptions o = c.io_options();
  EXPECT_EQ(o.kind, swap::IoEngineKind::kThreads);
  EXPECT_EQ(o.block_size, 524288u);
  EXPECT_EQ(o.queue_depth, 4u);
  EXPECT_EQ(o.threads, 2u);
  const swap::IoOptions d = EngineConfig{}.io_options();
  EXPECT_EQ(d.kind, swap::IoEngineKind::kAuto);
  EXPECT_EQ(d.block_size, swap::IoOptions{}.block_size);
  EXPECT_EQ(d.queue_depth, swap::IoOptions{}.queue_depth);
  EXPECT_EQ(d.threads, 0u);
}

TEST(Config, ReadsTheOptimizerBlock) {
  const EngineConfig c = parse_config(R"({"optimizer": {"type": "AdamW", "params": {
      "lr": 0.01, "betas": [0.8, 0.95], "eps": 1e-6, "weight_decay": 0.1,
      "bias_correction": false}}})");
  const adam::AdamParams& hp = c.optimizer.hyper;
  EXPECT_EQ(hp.lr, 0.01);
  EXPECT_EQ(hp.beta1, 0.8);
  EXPECT_EQ(hp.beta2, 0.95);
  EXPECT_EQ(hp.eps, 1e-6);
  EXPECT_EQ(hp.weight_decay, 0.1);
  EXPECT_FALSE(hp.bias_correction);
  EXPECT_EQ(hp.mode, adam::AdamMode::kAdamW);
}

TEST(Config, AdamMeansAdamWUnlessAdamWModeIsFalseAsInDeepSpeed) {
  EXPECT_EQ(parse_config(R"({"optimizer": {"type": "Adam"}})").optimizer.hyper.mode,
            adam::AdamMode::kAdamW);
  EXPECT_EQ(parse_config(R"({"optimizer": {"type": "adam", "params": {"adam_w_mode": false}}})")
                .optimizer.hyper.mode,
            adam::AdamMode::kAdam);
  EXPECT_EQ(parse_config(R"({"optimizer": {"type": "ADAMW", "params": {"adam_w_mode": false}}})")
                .optimizer.hyper.mode,
            adam::AdamMode::kAdamW);
  EXPECT_EQ(error_of(R"({"optimizer": {"type": "Lamb"}})"),
            "cfg.json: optimizer.type: \"Lamb\" is not supported; zinf's CPU optimizer "
            "implements \"Adam\" and \"AdamW\"");
  EXPECT_EQ(error_of(R"({"optimizer": {"params": {"amsgrad": true}}})"),
            "cfg.json: optimizer.params.amsgrad: true is not supported by zinf's CPU Adam");
  EXPECT_EQ(error_of(R"({"optimizer": {"params": {"betas": [0.9]}}})"),
            "cfg.json: optimizer.params.betas: expected [beta1, beta2], got [0.9]");
  EXPECT_EQ(error_of(R"({"optimizer": {"params": {"betas": [0.9, 1.0]}}})"),
            "cfg.json: optimizer.params.betas: each beta must be in [0, 1), got [0.9,1.0]");
  EXPECT_EQ(error_of(R"({"optimizer": {"params": {"lr": -1}}})"),
            "cfg.json: optimizer.params.lr: must be in [0, 3.4028235e+38], got -1");
  EXPECT_EQ(error_of(R"({"optimizer": {"params": {"eps": "1e-8"}}})"),
            "cfg.json: optimizer.params.eps: expected a number, got \"1e-8\"");
  EXPECT_EQ(error_of(R"({"optimizer": {"params": {"weight_decay": -0.5}}})"),
            "cfg.json: optimizer.params.weight_decay: must be in [0, 3.4028235e+38], got -0.5");
}

TEST(Config, PrecisionBlocksSetTheParameterDtype) {
  EXPECT_EQ(parse_config(R"({"bf16": {"enabled": true}})").param_dtype, ElementType::kBF16);
  EXPECT_EQ(parse_config(R"({"fp16": {"enabled": true, "loss_scale": 0,
                                      "initial_scale_power": 16}})")
                .param_dtype,
            ElementType::kF16);
  EXPECT_EQ(parse_config(R"({"fp16": {"enabled": false}})").param_dtype, ElementType::kBF16);
  const EngineConfig old = parse_config(R"({"bfloat16": {"enabled": true}})");
  EXPECT_EQ(old.param_dtype, ElementType::kBF16);
  EXPECT_TRUE(has_notice(old, "bfloat16: older name of bf16"));
  EXPECT_EQ(error_of(R"({"bf16": {"enabled": true}, "fp16": {"enabled": true}})"),
            "cfg.json: fp16: bf16.enabled and fp16.enabled are both true; enable one of them");
  EXPECT_EQ(error_of(R"({"bf16": {}, "bfloat16": {}})"),
            "cfg.json: bfloat16: both bf16 and its older name bfloat16 are given; keep bf16");
  EXPECT_EQ(error_of(R"({"bf16": {"enabled": "auto"}})"),
            "cfg.json: bf16.enabled: expected true or false, got \"auto\"");
  EXPECT_EQ(error_of(R"({"fp16": {"enable": true}})"),
            "cfg.json: fp16.enable: unknown key; did you mean 'enabled'?");
}

TEST(Config, ReadsEveryZinfKey) {
  const EngineConfig c = parse_config(R"({"zinf": {"nvme_paths": ["/a", "/b", "/a"],
      "pinned_budget_bytes": 1e9, "checksums": false, "backend": "uring", "direct_io": false,
      "precondition": true, "prefetch_depth": 4, "adam_threads": 8,
      "checkpoint_reflink": false}})");
  EXPECT_EQ(c.zinf.nvme_paths, (std::vector<std::string>{"/a", "/b", "/a"}));
  EXPECT_EQ(c.zinf.pinned_budget_bytes, 1'000'000'000u);
  EXPECT_FALSE(c.zinf.checksums);  // the opt-out; the default is on
  EXPECT_FALSE(c.zinf.checkpoint_reflink);
  EXPECT_EQ(c.zinf.backend, swap::IoEngineKind::kUring);
  EXPECT_FALSE(c.zinf.direct_io);
  EXPECT_TRUE(c.zinf.precondition);
  EXPECT_EQ(c.zinf.prefetch_depth, 4u);
  EXPECT_EQ(c.zinf.adam_threads, 8u);
  EXPECT_EQ(parse_config(R"({"zinf": {"backend": "auto"}})").zinf.backend,
            swap::IoEngineKind::kAuto);
  EXPECT_EQ(error_of(R"({"zinf": {"backend": "aio"}})"),
            "cfg.json: zinf.backend: expected \"auto\", \"uring\" or \"threads\", got \"aio\"");
  EXPECT_EQ(error_of(R"({"zinf": {"nvme_paths": "/a"}})"),
            "cfg.json: zinf.nvme_paths: expected an array of directories, got \"/a\"");
  EXPECT_EQ(error_of(R"({"zinf": {"nvme_paths": ["/a", 3]}})"),
            "cfg.json: zinf.nvme_paths[1]: expected a string, got 3");
  EXPECT_EQ(error_of(R"({"zinf": {"nvme_paths": [""]}})"),
            "cfg.json: zinf.nvme_paths[0]: empty path");
  EXPECT_EQ(error_of(R"({"zinf": {"adam_threads": 2000}})"),
            "cfg.json: zinf.adam_threads: at most 1024, got 2000");
  EXPECT_EQ(error_of(R"({"zinf": {"pinned_budget_bytes": 0}})"),
            "cfg.json: zinf.pinned_budget_bytes: 0 is too small (at least 1)");
}

// The drive-slowdown notice's keys (docs/config.md): defaults, values, and what is refused.
TEST(Config, ReadsTheRateNoticeKeys) {
  const EngineConfig d = parse_config("{}");
  EXPECT_EQ(d.zinf.rate_notice_share, 0.5);
  EXPECT_EQ(d.zinf.rate_notice_steps, 3u);
  EXPECT_EQ(d.zinf.tuned_write_gbps, 0);
  EXPECT_EQ(d.zinf.tuned_read_gbps, 0);
  const EngineConfig c = parse_config(R"({"zinf": {"rate_notice_share": 0.3,
      "rate_notice_steps": 5, "tuned_write_gbps": 2.5, "tuned_read_gbps": 3}})");
  EXPECT_EQ(c.zinf.rate_notice_share, 0.3);
  EXPECT_EQ(c.zinf.rate_notice_steps, 5u);
  EXPECT_EQ(c.zinf.tuned_write_gbps, 2.5);
  EXPECT_EQ(c.zinf.tuned_read_gbps, 3);
  EXPECT_EQ(parse_config(R"({"zinf": {"rate_notice_share": 0}})").zinf.rate_notice_share, 0);
  EXPECT_EQ(error_of(R"({"zinf": {"rate_notice_share": 1.5}})"),
            "cfg.json: zinf.rate_notice_share: expected a share in [0, 1) (0: no notice), got "
            "1.5");
  EXPECT_EQ(error_of(R"({"zinf": {"rate_notice_steps": 0}})"),
            "cfg.json: zinf.rate_notice_steps: 0 is too small (at least 1)");
  EXPECT_EQ(error_of(R"({"zinf": {"tuned_write_gbps": -1}})"),
            "cfg.json: zinf.tuned_write_gbps: expected GB/s >= 0 (0: measured by the first "
            "steps), got -1");
  EXPECT_EQ(d.zinf.tbw_tb, 0);
  EXPECT_EQ(parse_config(R"({"zinf": {"tbw_tb": 600}})").zinf.tbw_tb, 600);
  EXPECT_EQ(error_of(R"({"zinf": {"tbw_tb": -600}})"),
            "cfg.json: zinf.tbw_tb: expected the rated endurance in TB >= 0 (0: no wear notice), "
            "got -600");
  EXPECT_EQ(error_of(R"({"zinf": {"tuned_read_gbps": "fast"}})"),
            "cfg.json: zinf.tuned_read_gbps: expected a number, got \"fast\"");
}

TEST(Config, StatePrecisionIsFp32Bf16OrInt8) {
  EXPECT_EQ(parse_config("{}").zinf.state_precision, adam::StatePrecision::kF32);
  EXPECT_EQ(parse_config(R"({"zinf": {"state_precision": "bf16"}})").zinf.state_precision,
            adam::StatePrecision::kBF16);
  EXPECT_EQ(parse_config(R"({"zinf": {"state_precision": "int8"}})").zinf.state_precision,
            adam::StatePrecision::kInt8);
  EXPECT_EQ(parse_config(R"({"zinf": {"state_precision": "fp32"}})").zinf.state_precision,
            adam::StatePrecision::kF32);
  EXPECT_EQ(error_of(R"({"zinf": {"state_precision": "fp16"}})"),
            "cfg.json: zinf.state_precision: expected \"fp32\", \"bf16\" or \"int8\", got "
            "\"fp16\"");
  EXPECT_EQ(error_of(R"({"zinf": {"state_precision": 8}})"),
            "cfg.json: zinf.state_precision: expected \"fp32\", \"bf16\" or \"int8\", got 8");
}

TEST(Config, NvmeDirectoriesArePathThenZinfPathsWithRepeatsKept) {
  const EngineConfig c = parse_config(R"({"zinf": {"nvme_paths": ["/b", "/a", "/b"]}})");
  EXPECT_EQ(c.nvme_directories("/a"), (std::vector<std::string>{"/a", "/b", "/a", "/b"}));
  EXPECT_EQ(c.nvme_directories(""), (std::vector<std::string>{"/b", "/a", "/b"}));
  EXPECT_TRUE(EngineConfig{}.nvme_directories("").empty());
}

TEST(Config, AcceptsDeepSpeedKeysWithoutEffectAndSaysSo) {
  const EngineConfig c = parse_config(R"({"train_batch_size": 8, "gradient_clipping": 1.0,
      "scheduler": {"type": "WarmupLR", "anything": [1, 2]}, "flops_profiler": {},
      "zero_optimization": {"overlap_comm": true, "reduce_bucket_size": "auto",
                            "stage3_max_live_parameters": 1e9, "cpu_offload": true},
      "zero_allow_untested_optimizer": true})");
  EXPECT_EQ(c.notices.size(), 3u);
  EXPECT_TRUE(has_notice(c,
                         "top level: accepted without effect in zinf: train_batch_size, "
                         "scheduler, flops_profiler, zero_allow_untested_optimizer"));
  EXPECT_TRUE(has_notice(c,
                         "zero_optimization: accepted without effect in zinf: overlap_comm, "
                         "reduce_bucket_size, stage3_max_live_parameters, cpu_offload"));
  EXPECT_TRUE(has_notice(c, "zero_optimization.cpu_offload: deprecated DeepSpeed key"));
  // The oldest boolean form of zero_optimization.
  EXPECT_EQ(parse_config(R"({"zero_optimization": true})").zero_stage, 1);
}

TEST(Config, IntegersMayBeWrittenAsIntegralFloats) {
  const EngineConfig c = parse_config(R"({"zero_optimization": {"sub_group_size": 1e8,
      "offload_param": {"buffer_size": 5e8, "max_in_cpu": 1.5e3}},
      "aio": {"block_size": 1.048576e6}})");
  EXPECT_EQ(c.sub_group_size, 100'000'000u);
  EXPECT_EQ(c.offload_param.buffer_size, 500'000'000u);
  EXPECT_EQ(c.offload_param.max_in_cpu, 1500u);  // 1.5e3 is the integer 1500
  EXPECT_EQ(c.aio.block_size, 1u << 20);
  EXPECT_EQ(parse_config(R"({"zinf": {"pinned_budget_bytes": 1.8446744073709550e19}})")
                .zinf.pinned_budget_bytes,
            18446744073709549568u);  // the largest double below 2^64
}

TEST(Config, RejectsNonIntegralNegativeStringAndOutOfRangeIntegers) {
  EXPECT_EQ(error_of(R"({"zero_optimization": {"offload_param": {"buffer_size": 1.5}}})"),
            "cfg.json: zero_optimization.offload_param.buffer_size: expected an integer, got 1.5");
  EXPECT_EQ(error_of(R"({"zero_optimization": {"offload_param": {"buffer_count": 2.5e-1}}})"),
            "cfg.json: zero_optimization.offload_param.buffer_count: expected an integer, got "
            "0.25");
  EXPECT_EQ(error_of(R"({"zero_optimization": {"offload_param": {"buffer_size": -100}}})"),
            "cfg.json: zero_optimization.offload_param.buffer_size: expected a non-negative "
            "integer, got -100");
  EXPECT_EQ(error_of(R"({"zero_optimization": {"sub_group_size": -1e8}})"),
            "cfg.json: zero_optimization.sub_group_size: expected a non-negative integer, got "
            "-100000000.0");
  EXPECT_EQ(error_of(R"({"zero_optimization": {"offload_param": {"buffer_size": "100"}}})"),
            "cfg.json: zero_optimization.offload_param.buffer_size: expected an integer, got "
            "\"100\"");
  EXPECT_EQ(error_of(R"({"aio": {"queue_depth": 4294967296}})"),
            "cfg.json: aio.queue_depth: 4294967296 is out of range (at most 4294967295)");
  EXPECT_EQ(error_of(R"({"aio": {"queue_depth": 1e10}})"),
            "cfg.json: aio.queue_depth: 10000000000.0 is out of range (at most 4294967295)");
  EXPECT_EQ(error_of(R"({"zinf": {"pinned_budget_bytes": 2e19}})"),
            "cfg.json: zinf.pinned_budget_bytes: 2e+19 is out of range (at most "
            "18446744073709551615)");
  EXPECT_EQ(error_of(R"({"zero_optimization": {"stage": 4}})"),
            "cfg.json: zero_optimization.stage: expected 0, 1, 2 or 3, got 4");
  EXPECT_EQ(error_of(R"({"zero_optimization": {"stage": 4294967295}})"),
            "cfg.json: zero_optimization.stage: expected 0, 1, 2 or 3, got 4294967295");
  EXPECT_EQ(error_of(R"({"zero_optimization": {"stage": "3"}})"),
            "cfg.json: zero_optimization.stage: expected an integer, got \"3\"");
  EXPECT_EQ(error_of(R"({"zero_optimization": {"sub_group_size": 0}})"),
            "cfg.json: zero_optimization.sub_group_size: 0 is too small: the smallest accepted "
            "is 32768 (each sub-group's 12-byte-per-element record is padded to the 4096-byte "
            "I/O alignment; from 32768 elements on the padding is at most ~1% of the state)");
}

// Sizes and counts the planning multiplies and rounds up are bounded by check_config, naming
// the key, for a config read and one built in code: a buffer_size near 2^64 once aborted the
// process in align_up (its bytes, 2 x buffer_size, wrapped) instead of being refused.
TEST(Config, SizesAndCountsAboveTheirBoundsAreRefusedNamingTheKey) {
  for (const char* size : {"18446744073709551615", "9223372036854771713", "1125899906842625"}) {
    EXPECT_EQ(error_of(std::string(R"({"zero_optimization": {"offload_param": {"buffer_size": )") +
                       size + "}}}"),
              std::string("cfg.json: zero_optimization.offload_param.buffer_size: at most "
                          "1125899906842624 (2^50 elements: the largest layer zinf takes), got ") +
                  size);
  }
  EXPECT_EQ(
      parse_config(R"({"zero_optimization": {"offload_param": {"buffer_size": 1125899906842624}}})")
          .offload_param.buffer_size,
      kConfigMaxBufferSize);
  EXPECT_EQ(error_of(R"({"zero_optimization": {"offload_param": {"buffer_count": 4294967295}}})"),
            "cfg.json: zero_optimization.offload_param.buffer_count: at most 1024, got 4294967295");
  EXPECT_EQ(error_of(R"({"zero_optimization": {"offload_optimizer": {"buffer_count": 1025}}})"),
            "cfg.json: zero_optimization.offload_optimizer.buffer_count: at most 1024, got 1025");
  EXPECT_EQ(error_of(R"({"zinf": {"prefetch_depth": 4294967295}})"),
            "cfg.json: zinf.prefetch_depth: at most 1024, got 4294967295");
  EXPECT_EQ(error_of(R"({"zinf": {"grad_staging_buffers": 65}})"),
            "cfg.json: zinf.grad_staging_buffers: at most 64, got 65");
  const EngineConfig top = parse_config(
      R"({"zero_optimization": {"offload_param": {"buffer_count": 1024},
          "offload_optimizer": {"buffer_count": 1024}},
          "zinf": {"prefetch_depth": 1024, "adam_threads": 1024, "grad_staging_buffers": 64}})");
  EXPECT_EQ(top.offload_param.buffer_count, kConfigMaxCount);
  EXPECT_EQ(top.zinf.prefetch_depth, kConfigMaxCount);
  // The same check for a config built in code.
  EngineConfig c;
  c.offload_param.buffer_size = ~std::uint64_t{0};
  EXPECT_EQ(what_of_check(c),
            "EngineConfig: zero_optimization.offload_param.buffer_size: at most 1125899906842624 "
            "(2^50 elements: the largest layer zinf takes), got 18446744073709551615");
  c.offload_param.buffer_size = kConfigMaxBufferSize;
  c.zinf.adam_threads = 1025;
  EXPECT_EQ(what_of_check(c), "EngineConfig: zinf.adam_threads: at most 1024, got 1025");
  c.zinf.adam_threads = 1024;
  EXPECT_NO_THROW(check_config(c));
}

TEST(Config, BooleansMustBeJsonBooleans) {
  EXPECT_EQ(error_of(R"({"zero_optimization": {"offload_param": {"pin_memory": "true"}}})"),
            "cfg.json: zero_optimization.offload_param.pin_memory: expected true or false, got "
            "\"true\"");
  EXPECT_EQ(error_of(R"({"aio": {"single_submit": 0}})"),
            "cfg.json: aio.single_submit: expected true or false, got 0");
  EXPECT_EQ(error_of(R"({"zinf": {"checksums": null}})"),
            "cfg.json: zinf.checksums: expected true or false, got null");
}

TEST(Config, UnknownKeysAreErrorsThatSuggestTheClosestKey) {
  EXPECT_EQ(error_of(R"({"zero_optimization": {"offload_param": {"nvme_pth": "/x"}}})"),
            "cfg.json: zero_optimization.offload_param.nvme_pth: unknown key; did you mean "
            "'nvme_path'?");
  EXPECT_EQ(error_of(R"({"aio": {"thread_cnt": 1}})"),
            "cfg.json: aio.thread_cnt: unknown key; did you mean 'thread_count'?");
  EXPECT_EQ(error_of(R"({"aio": {"intra_op_parallel": 1}})"),
            "cfg.json: aio.intra_op_parallel: unknown key; did you mean 'intra_op_parallelism'?");
  EXPECT_EQ(error_of(R"({"trian_batch_size": 1})"),
            "cfg.json: trian_batch_size: unknown key; did you mean 'train_batch_size'?");
  EXPECT_EQ(error_of(R"({"zero_optimization": {"Stage": 3}})"),
            "cfg.json: zero_optimization.Stage: unknown key; did you mean 'stage'?");
  EXPECT_EQ(error_of(R"({"zero_optimization": {"stage3_max_live_parameter": 1}})"),
            "cfg.json: zero_optimization.stage3_max_live_parameter: unknown key; did you mean "
            "'stage3_max_live_parameters'?");
  EXPECT_EQ(error_of(R"({"zinf": {"nvme_path": ["/a"]}})"),
            "cfg.json: zinf.nvme_path: unknown key; did you mean 'nvme_paths'?");
  EXPECT_EQ(error_of(R"({"optimizer": {"params": {"betass": [0.9, 0.9]}}})"),
            "cfg.json: optimizer.params.betass: unknown key; did you mean 'betas'?");
  // Nothing close: no suggestion.
  EXPECT_EQ(error_of(R"({"aio": {"xyz": 1}})"), "cfg.json: aio.xyz: unknown key");
  EXPECT_EQ(error_of(R"({"completely_different_thing": 1})"),
            "cfg.json: completely_different_thing: unknown key");
}

TEST(Config, ValueErrorsOfTheOffloadAndAioBlocks) {
  EXPECT_EQ(error_of(R"({"zero_optimization": {"offload_param": {"device": "gpu"}}})"),
            "cfg.json: zero_optimization.offload_param.device: expected \"none\", \"cpu\" or "
            "\"nvme\", got \"gpu\"");
  EXPECT_EQ(error_of(R"({"zero_optimization": {"offload_optimizer": {"ratio": 0.5}}})"),
            "cfg.json: zero_optimization.offload_optimizer.ratio: only 1.0 is supported "
            "(partial optimizer offload is not built), got 0.5");
  EXPECT_EQ(error_of(R"({"zero_optimization": {"offload_param": {"nvme_path": ""}}})"),
            "cfg.json: zero_optimization.offload_param.nvme_path: empty path (give a directory, "
            "or omit the key)");
  EXPECT_EQ(error_of(R"({"zero_optimization": {"offload_param": 5}})"),
            "cfg.json: zero_optimization.offload_param: expected an object {...}, got 5");
  EXPECT_EQ(error_of(R"({"aio": {"block_size": 1000}})"),
            "cfg.json: aio.block_size: must be a multiple of 4096 (O_DIRECT alignment), got 1000");
  EXPECT_EQ(error_of(R"({"aio": {"block_size": 0}})"),
            "cfg.json: aio.block_size: 0 is too small (at least 1)");
  EXPECT_EQ(error_of(R"({"aio": {"queue_depth": 0}})"),
            "cfg.json: aio.queue_depth: 0 is too small (at least 1)");
  EXPECT_EQ(error_of(R"({"aio": {"queue_depth": 4097}})"),
            "cfg.json: aio.queue_depth: at most 4096 pieces in flight, got 4097");
  EXPECT_EQ(error_of(R"({"zero_optimization": {"offload_param": {"nvme_path": "/tmp\u0000x"}}})"),
            "cfg.json: zero_optimization.offload_param.nvme_path: the string has a NUL byte "
            "(\\u0000)");
  EXPECT_EQ(error_of(R"({"zinf": {"nvme_paths": ["/a", "/tmp\u0000x"]}})"),
            "cfg.json: zinf.nvme_paths[1]: the string has a NUL byte (\\u0000)");
  EXPECT_EQ(error_of(R"({"aio": {"use_gds": true}})"),
            "cfg.json: aio.use_gds: true is not supported: GPUDirect Storage is not built into "
            "zinf");
  // DeepSpeed's Optional blocks and paths may be null.
  const EngineConfig c = parse_config(R"({"aio": null, "zero_optimization": {
      "offload_param": null, "offload_optimizer": {"device": "cpu", "nvme_path": null}}})");
  EXPECT_EQ(c.offload_optimizer.device, OffloadDevice::kCpu);
  EXPECT_TRUE(c.offload_optimizer.nvme_path.empty());
}

TEST(Config, ContradictionsAreErrors) {
  EXPECT_EQ(error_of(R"({"zero_optimization": {"stage": 3,
      "offload_param": {"device": "nvme"}}})"),
            "cfg.json: zero_optimization.offload_param.nvme_path: device is \"nvme\" but no NVMe "
            "directory is given (set zero_optimization.offload_param.nvme_path or "
            "zinf.nvme_paths)");
  EXPECT_EQ(error_of(R"({"zero_optimization": {"offload_optimizer": {"device": "nvme"}}})"),
            "cfg.json: zero_optimization.offload_optimizer.nvme_path: device is \"nvme\" but no "
            "NVMe directory is given (set zero_optimization.offload_optimizer.nvme_path or "
            "zinf.nvme_paths)");
  // zinf.nvme_paths alone is enough.
  EXPECT_EQ(parse_config(R"({"zero_optimization": {"stage": 3, "offload_param": {"device":
      "nvme"}, "offload_optimizer": {"device": "nvme"}}, "zinf": {"nvme_paths": ["/n"]}})")
                .offload_param.device,
            OffloadDevice::kNvme);
  EXPECT_EQ(error_of(R"({"zero_optimization": {"stage": 2,
      "offload_param": {"device": "cpu"}}})"),
            "cfg.json: zero_optimization.offload_param.device: parameter offload (\"cpu\") needs "
            "zero_optimization.stage 3, but stage is 2");
  EXPECT_EQ(error_of(R"({"zero_optimization": {"offload_param": {"device": "nvme",
      "nvme_path": "/x"}}})"),
            "cfg.json: zero_optimization.offload_param.device: parameter offload (\"nvme\") "
            "needs zero_optimization.stage 3, but stage is 0");
  EXPECT_EQ(error_of(R"({"zero_optimization": {"offload_optimizer": {"device": "nvme",
      "nvme_path": "/x", "buffer_count": 2}}})"),
            "cfg.json: zero_optimization.offload_optimizer.buffer_count: the NVMe optimizer "
            "pipeline needs at least 3 buffers (one being read ahead, one being updated, one "
            "being written back), got 2");
  // The ring exists only for NVMe: fewer buffers are fine with the state in host memory.
  EXPECT_EQ(parse_config(R"({"zero_optimization": {"offload_optimizer": {"device": "cpu",
      "buffer_count": 1}}})")
                .offload_optimizer.buffer_count,
            1u);
}

TEST(Config, MalformedJsonNamesLineAndColumn) {
  EXPECT_EQ(error_of("{\n  \"aio\": {\n    \"block_size\": 4096,\n  }\n}"),
            "cfg.json: line 4, column 3: syntax error while parsing object key - unexpected "
            "'}'; expected string literal");
  EXPECT_EQ(error_of("{\"aio\": {\"block_size\": 40x96}}"),
            "cfg.json: line 1, column 26: syntax error while parsing object - invalid literal; "
            "last read: '40x'; expected '}'");
  EXPECT_EQ(error_of(""),
            "cfg.json: line 1, column 1: syntax error while parsing value - unexpected end of "
            "input; expected '[', '{', or a literal");
  EXPECT_EQ(error_of("{\"a\": 1} // comment"),
            "cfg.json: line 1, column 10: syntax error while parsing value - invalid literal; "
            "last read: '1} /'; expected end of input");
  EXPECT_EQ(error_of("[1, 2]"), "cfg.json: the config must be a JSON object {...}, got [1,2]");
}

TEST(Config, DuplicateKeysAreErrors) {
  // The position is that of the repeated key's closing quote.
  EXPECT_EQ(error_of("{\n  \"zero_optimization\": {\"stage\": 3,\n    \"stage\": 2}\n}"),
            "cfg.json: line 3, column 11: zero_optimization.stage: duplicate key (DeepSpeed "
            "would silently keep the last value)");
  EXPECT_EQ(error_of(R"({"aio": {}, "aio": {}})"),
            "cfg.json: line 1, column 17: aio: duplicate key (DeepSpeed would silently keep the "
            "last value)");
  // The path of a key inside an array element, and the same key in sibling objects is fine.
  EXPECT_EQ(error_of(R"({"scheduler": {"params": [{"a": 1}, {"a": 1, "a": 2}]}})"),
            "cfg.json: line 1, column 48: scheduler.params[1].a: duplicate key (DeepSpeed would "
            "silently keep the last value)");
}

TEST(Config, ParsesARealZeroInfinityConfig) {
  const EngineConfig c = load_config(ZINF_CONFIG_TEST_DATA "/zero_infinity_ds_config.json");
  EXPECT_EQ(c.zero_stage, 3);
  EXPECT_EQ(c.offload_param.device, OffloadDevice::kNvme);
  EXPECT_EQ(c.offload_param.nvme_path, "/local_nvme");
  EXPECT_EQ(c.offload_param.buffer_count, 5u);
  EXPECT_EQ(c.offload_param.buffer_size, 100'000'000u);
  EXPECT_EQ(c.offload_param.max_in_cpu, 1'000'000'000u);
  EXPECT_EQ(c.offload_optimizer.device, OffloadDevice::kNvme);
  EXPECT_EQ(c.offload_optimizer.nvme_path, "/local_nvme");
  EXPECT_EQ(c.offload_optimizer.buffer_count, 4u);
  EXPECT_EQ(c.sub_group_size, 100'000'000u);
  EXPECT_EQ(c.aio.block_size, 1u << 20);
  EXPECT_EQ(c.aio.queue_depth, 8u);
  EXPECT_EQ(c.aio.intra_op_parallelism, 1u);
  EXPECT_EQ(c.optimizer.hyper.mode, adam::AdamMode::kAdamW);
  EXPECT_EQ(c.optimizer.hyper.lr, 3e-4);
  EXPECT_EQ(c.optimizer.hyper.beta2, 0.95);
  EXPECT_EQ(c.optimizer.hyper.weight_decay, 0.1);
  EXPECT_EQ(c.param_dtype, ElementType::kBF16);
  EXPECT_EQ(c.gradient_clipping, 1.0);  // takes effect: the staged step mode
  EXPECT_EQ(c.effective_step_mode(), StepMode::kStaged);
  EXPECT_EQ(c.nvme_directories(c.offload_param.nvme_path),
            (std::vector<std::string>{"/local_nvme"}));
  EXPECT_TRUE(has_notice(c, "aio.thread_count: older name"));
}

TEST(Config, ParsesTheDocsExample) {
  // docs/config.md's example, as printed there.
  const EngineConfig c = parse_config(R"({
  "train_batch_size": 16,
  "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "weight_decay": 0.1}},
  "bf16": {"enabled": true},
  "zero_optimization": {
    "stage": 3,
    "sub_group_size": 1e8,
    "offload_param": {"device": "nvme", "nvme_path": "/nvme0/zinf", "buffer_count": 5, "buffer_size": 1e8},
    "offload_optimizer": {"device": "nvme", "nvme_path": "/nvme0/zinf", "buffer_count": 4}
  },
  "aio": {"block_size": 1048576, "queue_depth": 16, "intra_op_parallelism": 0},
  "zinf": {"nvme_paths": ["/nvme1/zinf"], "pinned_budget_bytes": 4e9, "checksums": true, "backend": "auto"}
})");
  EXPECT_EQ(c.nvme_directories(c.offload_optimizer.nvme_path),
            (std::vector<std::string>{"/nvme0/zinf", "/nvme1/zinf"}));
  EXPECT_EQ(c.zinf.pinned_budget_bytes, 4'000'000'000u);
  EXPECT_EQ(
      c.notices,
      (std::vector<std::string>{"top level: accepted without effect in zinf: train_batch_size"}));
}

TEST(Config, LoadConfigOfAMissingFileNamesThePathAndErrno) {
  test::TestDir dir;
  const std::string path = dir.file("missing.json");
  try {
    (void)load_config(path);
    FAIL() << "no error";
  } catch (const IoError& e) {
    EXPECT_EQ(e.sys_errno(), ENOENT);
    EXPECT_EQ(e.code(), ErrorCode::kNotFound);
    const std::string what = e.what();
    EXPECT_NE(what.find(path), std::string::npos) << what;
    EXPECT_NE(what.find("ENOENT"), std::string::npos) << what;
    EXPECT_NE(what.find("open config"), std::string::npos) << what;
  }
}

// A config that is there but cannot be opened reports the open's own errno, never ENOENT:
// "does not exist" would send the user looking for a file that is right where they put it.
// (ENOTDIR and ELOOP, because a chmod 000 file is readable by root, which the tests may be.)
TEST(Config, LoadConfigKeepsTheRealErrnoOfAFailedOpen) {
  test::TestDir dir;
  { std::ofstream(dir.file("plain")) << "{}"; }
  ASSERT_EQ(::symlink("loop_b", dir.file("loop_a").c_str()), 0);
  ASSERT_EQ(::symlink("loop_a", dir.file("loop_b").c_str()), 0);
  const struct {
    std::string path;
    int errno_value;
    const char* name;
  } cases[] = {{dir.file("plain/config.json"), ENOTDIR, "ENOTDIR"},
               {dir.file("loop_a"), ELOOP, "ELOOP"}};
  for (const auto& c : cases) {
    try {
      (void)load_config(c.path);
      ADD_FAILURE() << "no error for " << c.path;
    } catch (const IoError& e) {
      EXPECT_EQ(e.sys_errno(), c.errno_value) << e.what();
      EXPECT_NE(e.code(), ErrorCode::kNotFound) << e.what();
      const std::string what = e.what();
      EXPECT_NE(what.find(c.name), std::string::npos) << what;
      EXPECT_NE(what.find(c.path), std::string::npos) << what;
    }
  }
}

TEST(Config, LoadConfigNamesTheFileInParseErrors) {
  test::TestDir dir;
  const std::string path = dir.file("bad.json");
  std::ofstream(path) << "{\"aio\": {\"queue_dept\": 8}}";
  try {
    (void)load_config(path);
    FAIL() << "no error";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()),
              path + ": aio.queue_dept: unknown key; did you mean 'queue_depth'?");
  }
}

// ---------------------------------------------------------------------------------------------
// Hostile input: every case is a one-line UsageError naming the source, never a crash, a hang,
// unbounded memory or an unbounded message.

// The message of the UsageError load_config throws for `path`, or "(no error)".
std::string load_error_of(const std::string& path) {
  try {
    (void)load_config(path);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "(no error)";
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(Config, DeepNestingIsRefusedWithoutRecursion) {
  // 100000 levels overflowed the stack in the error message's dump() of the value.
  const std::string arrays(100000, '[');
  std::string e = error_of(arrays);
  EXPECT_EQ(e,
            "cfg.json: line 1, column 65: nesting deeper than 64 levels of objects and arrays "
            "(the limit of a config)");
  std::string objects;
  for (int i = 0; i < 100000; ++i) objects += "{\"a\":";
  e = error_of(objects);
  EXPECT_TRUE(contains(e, "nesting deeper than 64 levels")) << e;
  // Closed, well-formed nesting is refused the same way (100000 levels of it crashed the
  // reader: "must be a JSON object, got <dump>" recursed once per level).
  e = error_of(arrays + std::string(100000, ']'));
  EXPECT_TRUE(contains(e, "nesting deeper than 64 levels")) << e;
  e = error_of("{\"zinf\": " + std::string(100, '[') + std::string(100, ']') + "}");
  EXPECT_TRUE(contains(e, "cfg.json: line 1, column ")) << e;
  EXPECT_TRUE(contains(e, "nesting deeper than 64 levels")) << e;
  // 64 levels are a config (refused for what it says, not for its depth).
  e = error_of("{\"zinf\": {\"nvme_paths\": " + std::string(62, '[') + std::string(62, ']') + "}}");
  EXPECT_TRUE(contains(e, "cfg.json: zinf.nvme_paths[0]: expected a string, got [[[[")) << e;

  test::TestDir dir;
  const std::string path = dir.file("deep.json");
  std::ofstream(path) << arrays;
  e = load_error_of(path);
  EXPECT_EQ(e, path +
                   ": line 1, column 65: nesting deeper than 64 levels of objects and arrays "
                   "(the limit of a config)");
}

TEST(Config, OversizedConfigIsRefused) {
  // 16 MiB + 1 of spaces around an empty object: valid JSON, refused for its size alone.
  constexpr std::size_t kLimit = std::size_t{16} << 20;  // kConfigMaxBytes
  const std::string big = "{}" + std::string(kLimit - 1, ' ');
  EXPECT_EQ(error_of(big),
            "cfg.json: the config is larger than the limit of 16777216 bytes (16 MiB)");
  EXPECT_NO_THROW((void)parse_config("{}" + std::string(kLimit - 2, ' ')));
  test::TestDir dir;
  const std::string path = dir.file("big.json");
  std::ofstream(path) << big;
  EXPECT_EQ(load_error_of(path),
            path + ": the config is larger than the limit of 16777216 bytes (16 MiB)");
}

TEST(Config, FifoIsRefusedWithoutBlocking) {
  test::TestDir dir;
  const std::string path = dir.file("config.fifo");
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0) << std::strerror(errno);
  auto result = std::async(std::launch::async, [&] { return load_error_of(path); });
  if (result.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
    ADD_FAILURE() << "load_config blocked on a FIFO";
    // Unblock the reader (a writer that closes at once gives it end of file) so the test ends.
    const int fd = ::open(path.c_str(), O_WRONLY | O_NONBLOCK);
    if (fd >= 0) ::close(fd);
  }
  EXPECT_EQ(result.get(), path + ": the config is a FIFO, not a regular file; give a JSON file");
}

// Runs in a death-test child: load_config("/dev/zero") with 1 GiB of address space above what
// the child has, so that a reader that tried to read it whole would fail quickly instead of
// taking the machine down. Exits 0 if it was refused as a device.
[[noreturn]] void load_dev_zero_with_bounded_memory() {
  unsigned long pages = 0;
  if (std::FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%lu", &pages) != 1) pages = 0;
    std::fclose(f);
  }
  const rlim_t limit =
      static_cast<rlim_t>(pages) * static_cast<rlim_t>(::sysconf(_SC_PAGESIZE)) + (rlim_t{1} << 30);
  const struct rlimit lim = {limit, limit};
  ::setrlimit(RLIMIT_AS, &lim);
  const std::string e = load_error_of("/dev/zero");
  std::fprintf(stderr, "%s\n", e.c_str());
  std::exit(e == "/dev/zero: the config is a character device, not a regular file; give a JSON "
                 "file"
                ? 0
                : 1);
}

TEST(Config, DevicesAndDirectoriesAreRefusedBeforeAnyRead) {
  test::TestDir dir;
  EXPECT_EQ(load_error_of(dir.path()),
            dir.path() + ": the config is a directory, not a regular file; give a JSON file");
  // /dev/zero never ends: a reader that tried would grow its buffer until memory ran out;
  // refused from fstat, it reads nothing.
  EXPECT_EXIT(load_dev_zero_with_bounded_memory(), ::testing::ExitedWithCode(0),
              "/dev/zero: the config is a character device");
}

TEST(Config, NumberOutOfRangeNamesTheKeyAndTheFile) {
  // nlohmann's "number overflow" was thrown as its own exception: no file, no key, exit 1.
  EXPECT_EQ(error_of(R"({"optimizer": {"params": {"lr": 1e309}}})"),
            "cfg.json: line 1, column 33: optimizer.params.lr: number out of range (1e309 is "
            "beyond a double's +-1.8e308)");
  EXPECT_EQ(error_of("{\"optimizer\": {\"params\": {\"betas\": [0.9,\n -1e400]}}}"),
            "cfg.json: line 2, column 2: optimizer.params.betas[1]: number out of range (-1e400 "
            "is beyond a double's +-1.8e308)");
  EXPECT_EQ(error_of("1e999"),
            "cfg.json: line 1, column 1: number out of range (1e999 is beyond a double's "
            "+-1.8e308)");
  test::TestDir dir;
  const std::string path = dir.file("lr.json");
  std::ofstream(path) << R"({"optimizer": {"params": {"lr": 1e309}}})";
  EXPECT_EQ(load_error_of(path), path +
                                     ": line 1, column 33: optimizer.params.lr: number out of "
                                     "range (1e309 is beyond a double's +-1.8e308)");
}

TEST(Config, NonFiniteOrAbsurdHyperParametersAreRefusedNamingTheKey) {
  EXPECT_EQ(error_of(R"({"optimizer": {"params": {"lr": 1e39}}})"),
            "cfg.json: optimizer.params.lr: must be in [0, 3.4028235e+38], got 1e+39");
  EXPECT_EQ(error_of(R"({"optimizer": {"params": {"eps": 0}}})"),
            "cfg.json: optimizer.params.eps: must be in [1e-45, 3.4028235e+38], got 0");
  EXPECT_EQ(error_of(R"({"optimizer": {"params": {"eps": 1e300}}})"),
            "cfg.json: optimizer.params.eps: must be in [1e-45, 3.4028235e+38], got 1e+300");
  EXPECT_EQ(error_of(R"({"optimizer": {"params": {"weight_decay": 1e300}}})"),
            "cfg.json: optimizer.params.weight_decay: must be in [0, 3.4028235e+38], got 1e+300");
  EXPECT_EQ(error_of(R"({"optimizer": {"params": {"lr": 1e20, "weight_decay": 1e20}}})"),
            "cfg.json: optimizer.params.weight_decay: times lr must be at most 3.4028235e+38, "
            "got 1e+40");
}

TEST(Config, SubGroupSizeBelowTheMinimumIsRefusedNamingIt) {
  // sub_group_size 1 padded every 12-byte record to 4096 bytes: 341 times the state on disk.
  EXPECT_EQ(error_of(R"({"zero_optimization": {"sub_group_size": 1}})"),
            "cfg.json: zero_optimization.sub_group_size: 1 is too small: the smallest accepted "
            "is 32768 (each sub-group's 12-byte-per-element record is padded to the 4096-byte "
            "I/O alignment; from 32768 elements on the padding is at most ~1% of the state)");
  EXPECT_EQ(parse_config(R"({"zero_optimization": {"sub_group_size": 32768}})").sub_group_size,
            32768u);
}

TEST(Config, ValuesAndKeysInErrorsAreCutShort) {
  const std::string long_text(100000, 'x');
  std::string e = error_of(R"({"optimizer": {"type": ")" + long_text + "\"}}");
  EXPECT_EQ(e, "cfg.json: optimizer.type: \"" + std::string(79, 'x') +
                   "... is not supported; zinf's CPU optimizer implements \"Adam\" and \"AdamW\"");
  // A key of 10 MB: no suggestion (no edit distance over megabytes), the key cut short.
  e = error_of("{\"" + std::string(10'000'000, 'k') + "\": 1}");
  EXPECT_EQ(e, "cfg.json: " + std::string(80, 'k') + "...: unknown key");
  // A malformed token as long as the input is not quoted whole.
  e = error_of("{\"zinf\": " + long_text + "}");
  EXPECT_LT(e.size(), 300u) << e;
  EXPECT_TRUE(contains(e, "cfg.json: line 1, column ")) << e;
  e = error_of("{\"zinf\": {\"nvme_paths\": [" + std::string(50, '[') + "1" + std::string(50, ']') +
               "]}}");
  EXPECT_LT(e.size(), 200u) << e;
}

TEST(Config, RoundTripsTheDefaults) {
  const EngineConfig defaults;
  const std::string json = config_to_json(defaults);
  const EngineConfig back = parse_config(json);
  expect_same(back, defaults);
  // The default is written out, so a dumped config keeps verifying its swap files.
  EXPECT_NE(json.find("\"checksums\": true"), std::string::npos) << json;
  // max_in_cpu is written (so it round-trips) and read with a notice that it has no effect.
  EXPECT_EQ(back.notices, (std::vector<std::string>{
                              "zero_optimization.offload_param.max_in_cpu: accepted without "
                              "effect in zinf (no CPU cache of NVMe parameters)"}))
      << json;
}

TEST(Config, RoundTripsAConfigWithEveryFieldChanged) {
  EngineConfig c;
  c.zero_stage = 3;
  c.offload_param = {OffloadDevice::kNvme, "/nvme0/p", false, 9, 123'456'789, 77};
  c.offload_optimizer.device = OffloadDevice::kNvme;
  c.offload_optimizer.nvme_path = "/nvme0/o";
  c.offload_optimizer.pin_memory = false;
  c.offload_optimizer.buffer_count = 6;
  c.offload_optimizer.pipeline_read = true;
  c.offload_optimizer.pipeline_write = true;
  c.offload_optimizer.fast_init = true;
  c.sub_group_size = 18'000'000'000'000'000'001u;  // above 2^53: must stay an exact integer
  c.aio = {1u << 18, 64, 7, true, false, false};
  c.optimizer.hyper.lr = 0.1 / 3;  // not a short decimal: needs all 17 digits
  c.optimizer.hyper.beta1 = 0.85;
  c.optimizer.hyper.beta2 = 0.9876;
  c.optimizer.hyper.eps = 1e-12;
  c.optimizer.hyper.weight_decay = 0.05;
  c.optimizer.hyper.bias_correction = false;
  c.optimizer.hyper.mode = adam::AdamMode::kAdamW;
  c.zinf.nvme_paths = {"/nvme1", "/nvme2", "/nvme1"};
  c.zinf.pinned_budget_bytes = 3ull << 30;
  c.zinf.checksums = false;
  c.zinf.backend = swap::IoEngineKind::kThreads;
  c.zinf.direct_io = false;
  c.zinf.precondition = true;
  c.zinf.prefetch_depth = 5;
  c.zinf.adam_threads = 3;
  c.param_dtype = ElementType::kF16;
  c.gradient_clipping = 0.1 / 3;
  c.loss_scaling = {true, 0, 20, 7, 3, true, 0.25};
  c.zinf.step_mode = StepMode::kStaged;
  c.zinf.state_precision = adam::StatePrecision::kInt8;
  const std::string json = config_to_json(c);
  expect_same(parse_config(json), c);

  // The other values of the enums and of the optimizer's mode.
  c.optimizer.hyper.mode = adam::AdamMode::kAdam;
  c.param_dtype = ElementType::kBF16;
  c.loss_scaling = {};
  c.zinf.step_mode = StepMode::kOnArrival;
  c.zinf.state_precision = adam::StatePrecision::kBF16;
  c.gradient_clipping = 0;
  c.zinf.backend = swap::IoEngineKind::kUring;
  c.offload_param.device = OffloadDevice::kCpu;
  c.offload_optimizer.device = OffloadDevice::kCpu;
  expect_same(parse_config(config_to_json(c)), c);
  c.zinf.step_mode = StepMode::kAuto;
  c.loss_scaling.loss_scale = 512;  // static
  c.loss_scaling.enabled = true;
  c.param_dtype = ElementType::kF16;
  expect_same(parse_config(config_to_json(c)), c);
  c.param_dtype = ElementType::kBF16;  // loss scaling without fp16: no config spells it
  EXPECT_THROW((void)config_to_json(c), UsageError);
  c.param_dtype = ElementType::kF32;
  EXPECT_THROW((void)config_to_json(c), UsageError);
}

TEST(Config, ClippingAndLossScalingKeysTakeEffectAndPickTheStagedMode) {
  EngineConfig c = parse_config(R"({"gradient_clipping": 1.0})");
  EXPECT_EQ(c.gradient_clipping, 1.0);
  EXPECT_FALSE(c.loss_scaling.enabled);
  EXPECT_EQ(c.zinf.step_mode, StepMode::kAuto);
  EXPECT_EQ(c.effective_step_mode(), StepMode::kStaged);
  EXPECT_TRUE(c.notices.empty());

  c = parse_config(R"({"fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 12,
      "loss_scale_window": 100, "hysteresis": 3, "consecutive_hysteresis": true,
      "min_loss_scale": 0.5}})");
  EXPECT_TRUE(c.loss_scaling.enabled);
  EXPECT_EQ(c.loss_scaling.loss_scale, 0.0);
  EXPECT_EQ(c.loss_scaling.initial_scale_power, 12u);
  EXPECT_EQ(c.loss_scaling.loss_scale_window, 100u);
  EXPECT_EQ(c.loss_scaling.hysteresis, 3u);
  EXPECT_TRUE(c.loss_scaling.consecutive_hysteresis);
  EXPECT_EQ(c.loss_scaling.min_loss_scale, 0.5);
  EXPECT_EQ(c.effective_step_mode(), StepMode::kStaged);

  // DeepSpeed's defaults (precision_config.py), and fp16 alone turns loss scaling on.
  c = parse_config(R"({"fp16": {"enabled": true}})");
  EXPECT_TRUE(c.loss_scaling.enabled);
  EXPECT_EQ(c.loss_scaling.loss_scale, 0.0);
  EXPECT_EQ(c.loss_scaling.initial_scale_power, 16u);
  EXPECT_EQ(c.loss_scaling.loss_scale_window, 1000u);
  EXPECT_EQ(c.loss_scaling.hysteresis, 2u);
  EXPECT_FALSE(c.loss_scaling.consecutive_hysteresis);
  EXPECT_EQ(c.loss_scaling.min_loss_scale, 1.0);

  // Neither: the update-on-arrival mode stays the default.
  c = parse_config(R"({"bf16": {"enabled": true}, "gradient_clipping": 0})");
  EXPECT_EQ(c.effective_step_mode(), StepMode::kOnArrival);
  c = parse_config(R"({"fp16": {"enabled": false, "loss_scale": 128, "hysteresis": 4}})");
  EXPECT_FALSE(c.loss_scaling.enabled);
  EXPECT_EQ(c.effective_step_mode(), StepMode::kOnArrival);
  EXPECT_TRUE(
      has_notice(c, "fp16: without effect while fp16.enabled is false: loss_scale, hysteresis"));

  // Forced modes.
  EXPECT_EQ(parse_config(R"({"zinf": {"step_mode": "staged"}})").effective_step_mode(),
            StepMode::kStaged);
  EXPECT_EQ(parse_config(R"({"zinf": {"step_mode": "on_arrival"}})").effective_step_mode(),
            StepMode::kOnArrival);
  EXPECT_EQ(parse_config(R"({"zinf": {"step_mode": "auto"}})").effective_step_mode(),
            StepMode::kOnArrival);
  EXPECT_EQ(step_mode_name(StepMode::kOnArrival), "on_arrival");
}

TEST(Config, OnArrivalWithClippingOrLossScalingIsAnErrorNotANoOp) {
  EXPECT_EQ(error_of(R"({"gradient_clipping": 1.0, "zinf": {"step_mode": "on_arrival"}})"),
            "cfg.json: zinf.step_mode: \"on_arrival\" updates each layer as its gradients "
            "arrive, so it cannot apply gradient_clipping 1 (it needs the global norm of every "
            "gradient) before any update; set zinf.step_mode to \"staged\" or \"auto\"");
  EXPECT_EQ(error_of(R"({"fp16": {"enabled": true}, "zinf": {"step_mode": "on_arrival"}})"),
            "cfg.json: zinf.step_mode: \"on_arrival\" updates each layer as its gradients "
            "arrive, so it cannot apply fp16 loss scaling (it needs every gradient checked for "
            "overflow) before any update; set zinf.step_mode to \"staged\" or \"auto\"");
  // The same check for a config built in code.
  EngineConfig c;
  c.gradient_clipping = 0.5;
  c.zinf.step_mode = StepMode::kOnArrival;
  EXPECT_THROW(check_config(c), UsageError);
  c.zinf.step_mode = StepMode::kStaged;
  EXPECT_NO_THROW(check_config(c));
}

TEST(Config, ClippingAndLossScalingValuesOutOfRangeAreRefusedNamingTheKey) {
  EXPECT_EQ(error_of(R"({"gradient_clipping": -1})"),
            "cfg.json: gradient_clipping: must be a finite number >= 0 (0: no clipping), got -1");
  EXPECT_EQ(error_of(R"({"gradient_clipping": "auto"})"),
            "cfg.json: gradient_clipping: expected a number, got \"auto\"");
  EXPECT_EQ(error_of(R"({"fp16": {"enabled": true, "loss_scale": -2}})"),
            "cfg.json: fp16.loss_scale: must be 0 (dynamic) or a static scale in (0, 2^126], "
            "got -2");
  EXPECT_EQ(error_of(R"({"fp16": {"enabled": true, "initial_scale_power": 127}})"),
            "cfg.json: fp16.initial_scale_power: at most 126 (1/2^126 is the smallest normal "
            "fp32), got 127");
  EXPECT_EQ(error_of(R"({"fp16": {"enabled": true, "min_loss_scale": 0}})"),
            "cfg.json: fp16.min_loss_scale: must be in (0, 2^126], got 0");
  EXPECT_EQ(error_of(R"({"fp16": {"enabled": true, "loss_scale_window": 0}})"),
            "cfg.json: fp16.loss_scale_window: 0 is too small (at least 1)");
  EXPECT_EQ(error_of(R"({"fp16": {"enabled": true, "hysteresis": 0}})"),
            "cfg.json: fp16.hysteresis: 0 is too small (at least 1)");
  EXPECT_EQ(error_of(R"({"zinf": {"step_mode": "deferred"}})"),
            "cfg.json: zinf.step_mode: expected \"auto\", \"on_arrival\" or \"staged\", got "
            "\"deferred\"");
  EXPECT_EQ(error_of(R"({"fp16": {"enabled": true, "loss_scal": 1}})"),
            "cfg.json: fp16.loss_scal: unknown key; did you mean 'loss_scale'?");
}

TEST(Config, OffloadDeviceNames) {
  EXPECT_EQ(offload_device_name(OffloadDevice::kNone), "none");
  EXPECT_EQ(offload_device_name(OffloadDevice::kCpu), "cpu");
  EXPECT_EQ(offload_device_name(OffloadDevice::kNvme), "nvme");
}

}  // namespace
}  // namespace zinf::offload
