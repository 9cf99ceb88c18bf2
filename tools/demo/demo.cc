// SPDX-License-Identifier: Apache-2.0
// `zinf demo`: a small but real training job through OffloadEngine. A stack of dense tanh
// layers (demo_model.h) learns a random teacher network's outputs; each layer is one engine
// layer of bf16 parameters, fetched for forward and backward, with its fp32 gradients handed in
// as backward produces them and its fp32 master weights and Adam moments in the chosen tier.
// Prints the loss, step time, NVMe rates and prefetch stall share; --json a summary whose
// weights_sha256 is the same for every offload tier.
// The command line and the engine config are demo_options.cc's; what the run says before and
// after training, demo_report.cc's.
#include <unistd.h>

#include <algorithm>
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
#include "commands.h"
#include "interrupt.h"
#include "demo_model.h"
#include "demo_options.h"
#include "demo_report.h"
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

using demo::DemoOptions;
using demo::RankBytes;
using demo::TrainResult;
using offload::EngineConfig;

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
      r.step_bytes_read.push_back(demo::nvme_bytes_read(st) - demo::nvme_bytes_read(before));
      r.step_bytes_written.push_back(demo::nvme_bytes_written(st) -
                                     demo::nvme_bytes_written(before));
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

}  // namespace

int demo_main(const std::vector<std::string>& tokens) {
  const std::optional<DemoOptions> parsed = demo::parse_options(tokens);
  if (!parsed) return 0;
  const DemoOptions& o = *parsed;
  const demo::MlpShape& shape = o.shape;

  std::string dir_used;
  EngineConfig config = demo::make_config(o.config_path, o.offload_text, o.dir_option, o.lr,
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
    // load() gives every layer the checkpoint's hyper-parameters, over the config's. A --lr
    // on the command line is the user changing the resumed run's rate, so it replaces the
    // checkpoint's in turn (every layer, every rank alike); without one the checkpoint's
    // rate goes on. Either way the header and the report show the rate the steps use.
    if (!std::isnan(o.lr)) {
      adam::AdamParams hyper = engine.local().hyper();
      hyper.lr = o.lr;
      engine.set_hyper(hyper);
    }
    config.optimizer.hyper = engine.local().hyper();
  }
  const demo::TrainingSet data = demo::make_training_set(shape, o.seed);
  demo::Mlp net(local_shape);
  // This rank's samples: rows [rank * local batch, (rank + 1) * local batch) of the set.
  const std::size_t rows = local_shape.batch * shape.hidden;
  const auto first_row = static_cast<std::ptrdiff_t>(rows * static_cast<std::size_t>(job.rank()));
  std::copy_n(data.inputs.begin() + first_row, rows, net.input().begin());
  const std::span<const float> targets(data.targets.data() + first_row, rows);

  std::FILE* out = o.json ? stderr : stdout;
  if (leader) demo::print_header(out, o, config, dir_used, numel, local_shape.batch, job.comm());
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
  const std::vector<RankBytes> per_rank = demo::gather_rank_bytes(job.comm(), st, result);
  const std::vector<std::byte> weights = weights_bytes(engine);
  Sha256 hash;
  hash.update(weights);
  const std::string sha = to_hex(hash.finish());
  if (!leader) return 0;
  if (!o.weights_out.empty()) {
    write_output_file(o.weights_out, std::string_view(reinterpret_cast<const char*>(weights.data()),
                                                      weights.size()));
  }
  demo::report(out, o, config, dir_used, numel, ranks, result, st, per_rank, sha);
  return 0;
}

}  // namespace zinf::tools
