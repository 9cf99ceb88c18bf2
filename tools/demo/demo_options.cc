// SPDX-License-Identifier: Apache-2.0
// `zinf demo`'s command line and engine config (demo_options.h).
#include "demo_options.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "args.h"
#include "scratch.h"
#include "zinf/common/error.h"

namespace zinf::tools::demo {

using offload::EngineConfig;
using offload::OffloadDevice;

namespace {

constexpr const char* kAbout = R"(
Trains a small network through zinf's OffloadEngine: --layers dense layers of width --hidden
with tanh between them learn to reproduce a fixed random "teacher" network of the same shape on
--batch fixed random inputs (mean squared error, full batch, Adam). Each layer's bf16
parameters are fetched through the engine for forward and backward; its fp32 gradients go to
the engine as backward produces them, and the fp32 master weights and Adam moments live in the
--offload tier. The forward and backward run in plain C++ on the host device's compute stream.
The final weights (weights_sha256) are bitwise the same for every --offload tier, and for a
run cut in two by --save and --resume (10 steps, or 6 saved and 4 resumed).)";

constexpr const char* kFooter = R"(
SIGINT, SIGTERM and SIGHUP stop training between steps and remove the swap files (exit status
128 + the signal's number, e.g. 130 for SIGINT).)";

}  // namespace

EngineConfig make_config(const std::string& config_path, const std::string& offload_text,
                         const std::string& dir_option, double lr, std::uint64_t adam_threads,
                         bool adam_threads_given, std::optional<int> zero_stage,
                         std::string& dir_used) {
  EngineConfig config = config_path.empty() ? EngineConfig{} : offload::load_config(config_path);
  // Without a config the demo partitions as it always has (stage 3); with one, the config's
  // stage; --zero-stage over both.
  if (config_path.empty()) config.zero_stage = 3;
  if (zero_stage) config.zero_stage = *zero_stage;
  const bool config_offloads = config.offload_param.device != OffloadDevice::kNone ||
                               config.offload_optimizer.device != OffloadDevice::kNone;
  if (offload_text.empty() && !config_offloads) {
    // The demo is about offload: a config without any (e.g. `zinf tune --out`'s, which holds
    // only I/O settings) keeps the demo's NVMe default rather than silently training in memory.
    if (!config_path.empty()) {
      std::fprintf(stderr,
                   "zinf demo: %s offloads nothing (no zero_optimization.offload_param or "
                   "offload_optimizer): keeping the demo's nvme default; --offload none trains "
                   "without offload\n",
                   config_path.c_str());
    }
    config.offload_param.device = OffloadDevice::kNvme;
    config.offload_optimizer.device = OffloadDevice::kNvme;
  }
  if (!offload_text.empty()) {
    OffloadDevice device;
    if (offload_text == "none") {
      device = OffloadDevice::kNone;
    } else if (offload_text == "cpu") {
      device = OffloadDevice::kCpu;
    } else if (offload_text == "nvme") {
      device = OffloadDevice::kNvme;
    } else {
      throw UsageError("invalid --offload '" + offload_text + "': expected none, cpu or nvme");
    }
    config.offload_param.device = device;
    config.offload_optimizer.device = device;
  }
  // Parameter offload is ZeRO stage 3 in DeepSpeed's terms: --offload raises the config's
  // stage, but a stage given on the command line is not overruled.
  if (config.offload_param.device != OffloadDevice::kNone && config.zero_stage < 3) {
    if (zero_stage) {
      throw UsageError("--zero-stage " + std::to_string(*zero_stage) +
                       " keeps the parameters whole on every rank, but --offload " +
                       std::string(offload::offload_device_name(config.offload_param.device)) +
                       " offloads them (parameter offload needs stage 3): give --zero-stage 3, "
                       "or a config with offload_param none and --offload left out");
    }
    config.zero_stage = 3;
  }
  const bool nvme = config.offload_param.device == OffloadDevice::kNvme ||
                    config.offload_optimizer.device == OffloadDevice::kNvme;
  // --dir wins; without it, an NVMe tier whose path the config does not give uses the default.
  auto set_path = [&](std::string& path, OffloadDevice device) {
    if (device != OffloadDevice::kNvme) return;
    if (!dir_option.empty() || (path.empty() && config.zinf.nvme_paths.empty())) {
      path = dir_option.empty() ? kDefaultScratchDir : dir_option;
      dir_used = path;
    } else if (dir_used.empty()) {
      dir_used = path.empty() ? config.zinf.nvme_paths.front() : path;
    }
  };
  set_path(config.offload_param.nvme_path, config.offload_param.device);
  set_path(config.offload_optimizer.nvme_path, config.offload_optimizer.device);
  if (nvme && !dir_option.empty()) config.zinf.nvme_paths.clear();
  if (!std::isnan(lr)) config.optimizer.hyper.lr = lr;
  if (adam_threads_given) config.zinf.adam_threads = static_cast<std::uint32_t>(adam_threads);
  if (config.param_dtype != ElementType::kBF16) {
    throw UsageError(
        "zinf demo trains bf16 parameters, but the config enables fp16; remove "
        "\"fp16\" or enable \"bf16\"");
  }
  return config;
}

std::optional<DemoOptions> parse_options(const std::vector<std::string>& tokens) {
  DemoOptions o;
  Cli cli("demo", kAbout, kFooter);
  cli.text("--offload", o.offload_text, "T", "none | cpu | nvme: parameters and optimizer state",
           "nvme, or the config's");
  cli.text("--dir", o.dir_option, "DIR", "directory for the NVMe swap files",
           "./zinf-scratch, created if missing");
  cli.text("--config", o.config_path, "FILE",
           "a DeepSpeed-style JSON config (docs/config.md); --offload and --dir "
           "override its offload devices and NVMe paths, --lr its learning rate");
  cli.count("--steps", o.steps, "training steps");
  cli.count("--layers", o.shape.layers, "dense layers");
  cli.count("--hidden", o.shape.hidden,
            "layer width: hidden x hidden weights + hidden biases per "
            "layer");
  cli.count("--batch", o.shape.batch, "training samples");
  cli.number("--lr", o.lr, "Adam learning rate (with --resume, replaces the checkpoint's)",
             "1e-3, or the config's; with --resume the checkpoint's");
  cli.count("--seed", o.seed, "seed of the teacher, the inputs and the initial weights");
  cli.count("--adam-threads", o.adam_threads, "CPU Adam threads, 0 = one per hardware thread", 0,
            1024, "0, or the config's");
  cli.count("--every", o.every_option, "print one line every N steps when not on a terminal", 0,
            UINT64_MAX, "steps / 10");
  cli.text("--device", o.device_text, "D",
           "host (the only one: the compute is plain C++ over host memory)");
  cli.count("--zero-stage", o.zero_stage,
            "zero_optimization.stage on several ranks: 1 or 2 keep every layer whole on every "
            "rank, 3 keeps 1/N of it (0 is refused there)",
            0, 3, "the config's, or 3 without one");
  cli.flag("--json", o.json, "print a JSON summary on stdout (progress goes to stderr)");
  cli.text("--dist", o.dist_text, "M",
           "auto | none | mpi: data-parallel over the ranks of mpirun (auto: when a launcher "
           "set OMPI_COMM_WORLD_SIZE or PMI_SIZE > 1)",
           "auto");
  cli.text("--weights-out", o.weights_out, "FILE",
           "write the final fp32 master weights (the bytes weights_sha256 hashes) to FILE");
  cli.text("--save", o.save_dir, "DIR",
           "after the last step, checkpoint the engine in DIR (every rank's slices under "
           "DIR/rank<R>; created if missing)");
  cli.text("--resume", o.resume_dir, "DIR",
           "start from the checkpoint in DIR (weights, Adam moments, step count and learning "
           "rate, unless --lr gives another) instead of the initial weights; one saved by "
           "another number of ranks is resharded");
  cli.duration("--collective-timeout", o.collective_timeout,
               "how long a collective waits for the other ranks before every rank still "
               "running fails (a lost peer): 250ms, 30s, 2m",
               "2m");
  if (!cli.parse(tokens)) return std::nullopt;
  o.dist_mode = parse_dist_mode(o.dist_text);

  const MlpShape& shape = o.shape;
  if (o.steps == 0 || o.steps > 1'000'000) throw UsageError("--steps must be in [1, 1000000]");
  if (shape.layers == 0 || shape.layers > 4096) throw UsageError("--layers must be in [1, 4096]");
  if (shape.hidden == 0 || shape.hidden > 16384) throw UsageError("--hidden must be in [1, 16384]");
  if (shape.batch == 0 || shape.batch > 65536) throw UsageError("--batch must be in [1, 65536]");
  if (!std::isnan(o.lr) && !(o.lr > 0 && std::isfinite(o.lr))) {
    throw UsageError("--lr must be a finite number > 0");
  }
  if (o.device_text == "cuda") {
    throw UsageError(
        "--device cuda is not supported: the demo's forward and backward are plain "
        "C++ over host memory; use --device host");
  }
  if (o.device_text != "host")
    throw UsageError("invalid --device '" + o.device_text + "': expected host");
  return o;
}

}  // namespace zinf::tools::demo
