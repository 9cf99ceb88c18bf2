// SPDX-License-Identifier: Apache-2.0
// `zinf demo`: a small but real training job through OffloadEngine. A stack of dense tanh
// layers (demo_model.h) learns a random teacher network's outputs; each layer is one engine
// layer of bf16 parameters, fetched for forward and backward, with its fp32 gradients handed in
// as backward produces them and its fp32 master weights and Adam moments in the chosen tier.
// Prints the loss, step time, NVMe rates and prefetch stall share; --json a summary whose
// weights_sha256 is the same for every offload tier.
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "bench_common.h"
#include "args.h"
#include "commands.h"
#include "interrupt.h"
#include "demo_model.h"
#include "format.h"
#include "json_out.h"
#include "launch.h"
#include "scratch.h"
#include "sha256.h"
#include "zinf/common/error.h"
#include "zinf/cuda/device.h"
#include "zinf/dist/sharded_engine.h"
#include "zinf/offload/config.h"
#include "zinf/offload/engine.h"

namespace zinf::tools {
namespace {

using offload::EngineConfig;
using offload::OffloadDevice;

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

// Builds the engine config: the file's (if any), then the command line on top.
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

// Every layer's fp32 master weights in layer order, as little-endian bytes (collective: every
// rank's slices are all-gathered).
std::vector<std::byte> weights_bytes(dist::ShardedEngine& engine) {
  std::vector<float> master;
  std::vector<std::byte> bytes;
  for (std::size_t l = 0; l < engine.layer_count(); ++l) {
    master.resize(engine.layer(l).numel);
    engine.read_master_weights(l, master);
    const std::size_t at = bytes.size();
    bytes.resize(at + master.size() * 4);
    for (std::size_t k = 0; k < master.size(); ++k) {
      const auto u = std::bit_cast<std::uint32_t>(master[k]);
      for (std::size_t b = 0; b < 4; ++b) {
        bytes[at + 4 * k + b] = static_cast<std::byte>(u >> (8 * b));
      }
    }
  }
  return bytes;
}

// The command line, parsed and checked; the engine config is built from it later.
struct DemoOptions {
  // kUnset is outside --adam-threads' range, so no value given can be mistaken for it.
  static constexpr std::uint64_t kUnset = ~std::uint64_t{0};
  std::string offload_text, dir_option, config_path, device_text = "host", dist_text = "auto";
  std::string weights_out, save_dir, resume_dir;
  std::uint64_t steps = 50, seed = 1, every_option = 0;
  demo::MlpShape shape;
  double lr = std::nan("");
  std::uint64_t adam_threads = kUnset;
  std::uint64_t zero_stage = kUnset;
  bool json = false;
  DistMode dist_mode = DistMode::kAuto;  // --dist, parsed
  // How long a collective waits for the other ranks (a step of the largest demo is far
  // shorter); a test of a lost node shortens it.
  std::chrono::milliseconds collective_timeout{std::chrono::seconds(120)};
};

// Parses and checks the options; nullopt when --help was given (and printed).
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
  cli.number("--lr", o.lr, "Adam learning rate", "1e-3, or the config's");
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
           "start from the checkpoint in DIR (weights, Adam moments and step count) instead of "
           "the initial weights; one saved by another number of ranks is resharded");
  cli.duration("--collective-timeout", o.collective_timeout,
               "how long a collective waits for the other ranks before every rank still "
               "running fails (a lost peer): 250ms, 30s, 2m",
               "2m");
  if (!cli.parse(tokens)) return std::nullopt;
  o.dist_mode = parse_dist_mode(o.dist_text);

  const demo::MlpShape& shape = o.shape;
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

// "nvme", or "cpu/nvme" when the parameters and the optimizer state live apart.
std::string offload_name(const EngineConfig& config) {
  return config.offload_param.device == config.offload_optimizer.device
             ? std::string(offload::offload_device_name(config.offload_param.device))
             : std::string(offload::offload_device_name(config.offload_param.device)) + "/" +
                   std::string(offload::offload_device_name(config.offload_optimizer.device));
}

// What a run says about itself before its first step (rank 0 only).
void print_header(std::FILE* out, const DemoOptions& o, const EngineConfig& config,
                  const std::string& dir_used, std::size_t numel, std::size_t local_batch,
                  dist::Collectives& comm) {
  const demo::MlpShape& shape = o.shape;
  const int ranks = comm.size();
  const double param_bytes = static_cast<double>(shape.layers * numel * 2);
  std::fprintf(out,
               "zinf demo: %zu layers x %zu (%zu parameters, %s bf16, %s fp32 master + Adam), "
               "batch %zu, offload %s%s%s, lr %g\n",
               shape.layers, shape.hidden, shape.layers * numel, decimal_bytes(param_bytes).c_str(),
               decimal_bytes(param_bytes * 6).c_str(), shape.batch, offload_name(config).c_str(),
               dir_used.empty() ? "" : " in ", dir_used.c_str(), config.optimizer.hyper.lr);
  if (ranks > 1) {
    const std::string share =
        config.zero_stage >= 3
            ? "1/" + std::to_string(ranks) + " of every layer"
            : "every layer whole and 1/" + std::to_string(ranks) + " of its optimizer state";
    std::fprintf(out,
                 "zinf demo: data-parallel over %d ranks (%s), ZeRO stage %d: %zu samples and "
                 "%s each%s; figures below are rank 0's\n",
                 ranks, std::string(comm.name()).c_str(), config.zero_stage, local_batch,
                 share.c_str(), dir_used.empty() ? "" : ", swap files in rank<R> folders");
  }
  if (!o.resume_dir.empty()) {
    std::fprintf(out, "zinf demo: resumed from the checkpoint in %s\n", o.resume_dir.c_str());
  }
  if (!dir_used.empty()) {
    // Which I/O settings are in use, so that a tuned config can be seen to take effect.
    std::fprintf(out,
                 "zinf demo: I/O backend %s, aio block_size %s, queue_depth %u, checksums %s, "
                 "direct_io %s\n",
                 std::string(swap::io_engine_kind_name(config.zinf.backend)).c_str(),
                 human_bytes(config.aio.block_size).c_str(), config.aio.queue_depth,
                 config.zinf.checksums ? "on" : "off", config.zinf.direct_io ? "on" : "off");
  }
}

// What the training loop measured.
struct TrainResult {
  std::vector<double> losses, step_times;
  // This rank's NVMe bytes (parameters and optimizer state) in each step.
  std::vector<std::uint64_t> step_bytes_read, step_bytes_written;
  double total_s = 0;
  offload::StepStats last_step;  // its collective byte counts are every step's
};

std::uint64_t nvme_bytes_read(const offload::EngineStats& st) {
  return st.param_bytes_read + st.optimizer_bytes_read;
}
std::uint64_t nvme_bytes_written(const offload::EngineStats& st) {
  return st.param_bytes_written + st.optimizer_bytes_written;
}

// The training loop over one rank's share of the batch, and its progress lines (rank 0's).
struct Trainer {
  dist::ShardedEngine& engine;
  cuda::Device& device;
  cuda::Stream& compute;
  demo::Mlp& net;
  std::span<const float> targets;
  std::size_t layers;
  std::size_t numel;
  std::uint64_t steps;
  dist::Collectives& comm;
  std::FILE* out;
  bool tty;
  std::uint64_t every;

  // One iteration: forward through every layer (the compute runs on the compute stream as
  // host work, reading the fetched bf16 parameters), the loss, then backward in reverse; after
  // each layer's backward the stream is synchronised so its gradients are complete before they
  // go to the engine (whose update of that layer then overlaps the next layer's backward).
  TrainResult run() {
    const int ranks = comm.size();
    const bool leader = comm.rank() == 0;
    std::vector<std::vector<float>> grads(layers, std::vector<float>(numel));
    TrainResult r;
    const auto run_start = std::chrono::steady_clock::now();
    double stall_before = 0;
    offload::EngineStats before = engine.stats();
    for (std::uint64_t s = 0; s < steps; ++s) {
      // Between steps nothing is half done; unwinding closes the engine (its requests drain
      // and its swap files go).
      throw_if_interrupted();
      const auto t0 = std::chrono::steady_clock::now();
      for (std::size_t l = 0; l < layers; ++l) {
        const cuda::DeviceSpan p = engine.fetch(l);
        const std::span<const std::uint16_t> bits(reinterpret_cast<const std::uint16_t*>(p.data()),
                                                  numel);
        device.enqueue_host_work(compute, [this, l, bits] { net.forward_bf16(l, bits); });
        engine.release(l);
      }
      device.synchronize(compute);
      double loss = net.loss(targets);
      // The global batch's loss: the mean of the ranks' means (equal shares).
      if (ranks > 1)
        dist::all_reduce<double>(comm, std::span<double>(&loss, 1), dist::ReduceOp::kAvg);
      if (!std::isfinite(loss)) {
        throw Error("training diverged: the loss is " + std::to_string(loss) + " at step " +
                    std::to_string(s + 1) + "; try a smaller --lr");
      }
      for (std::size_t l = layers; l-- > 0;) {
        const cuda::DeviceSpan p = engine.fetch(l);
        const std::span<const std::uint16_t> bits(reinterpret_cast<const std::uint16_t*>(p.data()),
                                                  numel);
        std::span<float> g = grads[l];
        device.enqueue_host_work(compute, [this, l, bits, g] { net.backward_bf16(l, bits, g); });
        engine.release(l);
        device.synchronize(compute);
        engine.set_gradients(l, adam::GradView::f32(grads[l]));
      }
      r.last_step = engine.step();
      const double step_s = seconds_since(t0);
      r.losses.push_back(loss);
      r.step_times.push_back(step_s);

      const offload::EngineStats st = engine.stats();
      const double stall_share = step_s > 0 ? (st.stall_seconds - stall_before) / step_s : 0;
      stall_before = st.stall_seconds;
      r.step_bytes_read.push_back(nvme_bytes_read(st) - nvme_bytes_read(before));
      r.step_bytes_written.push_back(nvme_bytes_written(st) - nvme_bytes_written(before));
      before = st;
      if (leader) progress_line(s, loss, step_s, st, stall_share);
    }
    r.total_s = seconds_since(run_start);
    return r;
  }

  // The step's line: rewritten in place on a terminal, one in `every` otherwise.
  void progress_line(std::uint64_t s, double loss, double step_s, const offload::EngineStats& st,
                     double stall_share) const {
    char line[256];
    std::snprintf(line, sizeof line,
                  "step %4llu/%llu  loss %.6f  step %.3f s  nvme read %.2f GB/s write %.2f GB/s  "
                  "stall %4.1f%%",
                  static_cast<unsigned long long>(s + 1), static_cast<unsigned long long>(steps),
                  loss, step_s, st.nvme_read_gbps, st.nvme_write_gbps, 100.0 * stall_share);
    if (tty) {
      std::fprintf(out, "\r%s\x1b[K", line);  // clear what a longer line left
      if (s + 1 == steps) std::fputc('\n', out);
      std::fflush(out);
    } else if (s == 0 || (s + 1) % every == 0 || s + 1 == steps) {
      std::fprintf(out, "%s\n", line);
      std::fflush(out);
    }
  }
};

// One rank's own NVMe bytes: in all (including a load and a save), and in the last step.
struct RankBytes {
  std::uint64_t read = 0, written = 0, step_read = 0, step_written = 0;
};

// Every rank's RankBytes, in rank order (collective where there are several ranks).
std::vector<RankBytes> gather_rank_bytes(dist::Collectives& comm, const offload::EngineStats& st,
                                         const TrainResult& r) {
  const std::array<std::int64_t, 4> mine = {static_cast<std::int64_t>(nvme_bytes_read(st)),
                                            static_cast<std::int64_t>(nvme_bytes_written(st)),
                                            static_cast<std::int64_t>(r.step_bytes_read.back()),
                                            static_cast<std::int64_t>(r.step_bytes_written.back())};
  std::vector<std::int64_t> all(mine.size() * static_cast<std::size_t>(comm.size()));
  if (comm.size() > 1) {
    dist::all_gather<std::int64_t>(comm, mine, all);
  } else {
    std::copy(mine.begin(), mine.end(), all.begin());
  }
  std::vector<RankBytes> out;
  for (std::size_t i = 0; i < all.size(); i += mine.size()) {
    out.push_back({static_cast<std::uint64_t>(all[i]), static_cast<std::uint64_t>(all[i + 1]),
                   static_cast<std::uint64_t>(all[i + 2]), static_cast<std::uint64_t>(all[i + 3])});
  }
  return out;
}

// The summary after training (rank 0): the text, and with --json the JSON object on stdout.
void report(std::FILE* out, const DemoOptions& o, const EngineConfig& config,
            const std::string& dir_used, std::size_t numel, int ranks, const TrainResult& r,
            const offload::EngineStats& st, const std::vector<RankBytes>& per_rank,
            const std::string& sha) {
  const demo::MlpShape& shape = o.shape;
  const std::vector<double>& losses = r.losses;
  const double stall_share = r.total_s > 0 ? st.stall_seconds / r.total_s : 0;
  const double step_median = median(r.step_times);
  const std::uint64_t nvme_read = nvme_bytes_read(st);
  const std::uint64_t nvme_written = nvme_bytes_written(st);

  std::fprintf(out,
               "loss %.6f -> %.6f (x%.3f) in %llu steps, %.1f s; median step %.3f s\n"
               "nvme: read %s (optimizer state %.2f GB/s, parameters %.2f GB/s), written %s "
               "(%.2f GB/s); prefetch stall %.1f%% "
               "(%llu hits, %llu on demand); pinned peak %s\n"
               "weights_sha256 %s\n",
               losses.front(), losses.back(), losses.back() / losses.front(),
               static_cast<unsigned long long>(o.steps), r.total_s, step_median,
               decimal_bytes(static_cast<double>(nvme_read)).c_str(), st.nvme_read_gbps,
               st.param_read_gbps, decimal_bytes(static_cast<double>(nvme_written)).c_str(),
               st.nvme_write_gbps, 100.0 * stall_share,
               static_cast<unsigned long long>(st.prefetch_hits),
               static_cast<unsigned long long>(st.prefetch_on_demand),
               decimal_bytes(static_cast<double>(st.pinned_bytes_peak)).c_str(), sha.c_str());
  const offload::StepStats& last = r.last_step;
  if (ranks > 1) {
    std::fprintf(out,
                 "collectives per step, received by rank 0 (a ring's bytes): all-gather %s, "
                 "reduce-scatter %s, all-reduce %s\n",
                 decimal_bytes(static_cast<double>(last.allgather_bytes)).c_str(),
                 decimal_bytes(static_cast<double>(last.reduce_scatter_bytes)).c_str(),
                 decimal_bytes(static_cast<double>(last.all_reduce_bytes)).c_str());
    // Each rank moves its own slices only, on its own drive: N shares of about the same size.
    std::fprintf(out, "nvme per rank, last step (read / written):");
    for (std::size_t k = 0; k < per_rank.size(); ++k) {
      std::fprintf(out, "%s rank %zu %s / %s", k == 0 ? "" : ",", k,
                   decimal_bytes(static_cast<double>(per_rank[k].step_read)).c_str(),
                   decimal_bytes(static_cast<double>(per_rank[k].step_written)).c_str());
    }
    std::fputc('\n', out);
  }
  if (!o.json) return;
  Json j;
  j["command"] = "demo";
  j["offload"] = offload_name(config);
  j["layers"] = std::uint64_t{shape.layers};
  j["hidden"] = std::uint64_t{shape.hidden};
  j["batch"] = std::uint64_t{shape.batch};
  j["seed"] = o.seed;
  j["lr"] = config.optimizer.hyper.lr;
  j["parameters"] = std::uint64_t{shape.layers * numel};
  j["steps"] = o.steps;
  j["initial_loss"] = losses.front();
  j["final_loss"] = losses.back();
  j["losses"] = losses;
  j["step_seconds"] = step_median;
  j["total_seconds"] = r.total_s;
  j["nvme_bytes_read"] = nvme_read;
  j["nvme_bytes_written"] = nvme_written;
  j["step_nvme_bytes_read"] = r.step_bytes_read;
  j["step_nvme_bytes_written"] = r.step_bytes_written;
  Json read = Json::array(), written = Json::array(), step_read = Json::array(),
       step_written = Json::array();
  for (const RankBytes& b : per_rank) {
    read.push_back(b.read);
    written.push_back(b.written);
    step_read.push_back(b.step_read);
    step_written.push_back(b.step_written);
  }
  j["rank_nvme_bytes_read"] = read;
  j["rank_nvme_bytes_written"] = written;
  j["rank_step_nvme_bytes_read"] = step_read;
  j["rank_step_nvme_bytes_written"] = step_written;
  j["nvme_read_gbps"] = st.nvme_read_gbps;
  j["nvme_write_gbps"] = st.nvme_write_gbps;
  j["param_read_gbps"] = st.param_read_gbps;
  j["stall_seconds"] = st.stall_seconds;
  j["stall_share"] = stall_share;
  j["prefetch_hits"] = st.prefetch_hits;
  j["prefetch_on_demand"] = st.prefetch_on_demand;
  j["pinned_bytes_peak"] = st.pinned_bytes_peak;
  j["dir"] = dir_used;
  j["weights_sha256"] = sha;
  j["ranks"] = ranks;
  j["zero_stage"] = config.zero_stage;
  // The last step's (every step moves the same; 0 on one rank).
  j["allgather_bytes_per_step"] = last.allgather_bytes;
  j["reduce_scatter_bytes_per_step"] = last.reduce_scatter_bytes;
  j["all_reduce_bytes_per_step"] = last.all_reduce_bytes;
  j["resumed_from"] = o.resume_dir;
  j["saved_to"] = o.save_dir;
  std::printf("%s\n", json_text(j).c_str());
}

}  // namespace

int demo_main(const std::vector<std::string>& tokens) {
  const std::optional<DemoOptions> parsed = parse_options(tokens);
  if (!parsed) return 0;
  const DemoOptions& o = *parsed;
  const demo::MlpShape& shape = o.shape;

  std::string dir_used;
  EngineConfig config = make_config(o.config_path, o.offload_text, o.dir_option, o.lr,
                                    o.adam_threads, o.adam_threads != DemoOptions::kUnset,
                                    o.zero_stage == DemoOptions::kUnset
                                        ? std::nullopt
                                        : std::optional<int>(static_cast<int>(o.zero_stage)),
                                    dir_used);
  if (!dir_used.empty() && dir_used == (o.dir_option.empty() ? kDefaultScratchDir : o.dir_option)) {
    std::error_code ec;
    std::filesystem::create_directories(dir_used, ec);
    if (ec) throw UsageError("cannot create --dir " + dir_used + ": " + ec.message());
  }

  // Data-parallel: the global batch is split across the ranks, each keeping 1/N of every
  // layer (stage 3) or of its optimizer state (stages 1, 2) (ShardedEngine); one rank is the
  // plain engine.
  DistJob job(o.dist_mode, o.collective_timeout);
  const int ranks = job.size();
  if (shape.batch % static_cast<std::size_t>(ranks) != 0) {
    throw UsageError("--batch " + std::to_string(shape.batch) + " does not split evenly over " +
                     std::to_string(ranks) + " ranks: give a multiple of " + std::to_string(ranks));
  }
  demo::MlpShape local_shape = shape;
  local_shape.batch = shape.batch / static_cast<std::size_t>(ranks);
  const bool leader = job.rank() == 0;
  const std::size_t numel = demo::layer_numel(shape.hidden);
  std::vector<offload::LayerSpec> specs;
  for (std::size_t l = 0; l < shape.layers; ++l) {
    specs.push_back({"dense" + std::to_string(l), numel, ElementType::kBF16});
  }

  cuda::DeviceOptions device_options;
  device_options.kind = cuda::DeviceKind::kHost;
  const auto device = cuda::make_device(device_options);
  cuda::Stream compute = device->create_stream();
  dist::ShardedEngine engine(config, specs, *device, compute, job.comm());

  if (o.resume_dir.empty()) {
    std::vector<float> init(numel);
    for (std::size_t l = 0; l < shape.layers; ++l) {
      demo::init_student_layer(init, shape.hidden, o.seed, l);
      engine.set_master_weights(l, init);
    }
  } else {
    // Another model's checkpoint (other --layers or --hidden) is refused here, naming it.
    engine.load(o.resume_dir);
  }
  const demo::TrainingSet data = demo::make_training_set(shape, o.seed);
  demo::Mlp net(local_shape);
  // This rank's samples: rows [rank * local batch, (rank + 1) * local batch) of the set.
  const std::size_t rows = local_shape.batch * shape.hidden;
  const auto first_row = static_cast<std::ptrdiff_t>(rows * static_cast<std::size_t>(job.rank()));
  std::copy_n(data.inputs.begin() + first_row, rows, net.input().begin());
  const std::span<const float> targets(data.targets.data() + first_row, rows);

  std::FILE* out = o.json ? stderr : stdout;
  if (leader) print_header(out, o, config, dir_used, numel, local_shape.batch, job.comm());
  std::fflush(out);

  Trainer trainer{engine,
                  *device,
                  compute,
                  net,
                  targets,
                  shape.layers,
                  numel,
                  o.steps,
                  job.comm(),
                  out,
                  isatty(fileno(out)) != 0,
                  o.every_option != 0 ? o.every_option : std::max<std::uint64_t>(1, o.steps / 10)};
  const TrainResult result = trainer.run();
  if (!o.save_dir.empty()) {
    engine.save(o.save_dir);  // collective: every rank's slices, then rank 0's global manifest
    if (leader) std::fprintf(out, "zinf demo: checkpoint saved in %s\n", o.save_dir.c_str());
  }

  const offload::EngineStats st = engine.stats();
  const std::vector<RankBytes> per_rank = gather_rank_bytes(job.comm(), st, result);
  const std::vector<std::byte> weights = weights_bytes(engine);
  Sha256 hash;
  hash.update(weights);
  const std::string sha = to_hex(hash.finish());
  if (!leader) return 0;
  if (!o.weights_out.empty()) {
    write_output_file(o.weights_out, std::string_view(reinterpret_cast<const char*>(weights.data()),
                                                      weights.size()));
  }
  report(out, o, config, dir_used, numel, ranks, result, st, per_rank, sha);
  return 0;
}

}  // namespace zinf::tools
