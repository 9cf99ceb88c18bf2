// SPDX-License-Identifier: Apache-2.0
// The ShardedEngine's checks, shared by the ranks-as-threads test and the MPI test: a rank of a
// sharded engine trained for a few steps must fetch, before every step, exactly the full layers
// one OffloadEngine over the whole layers fetches when fed the ranks' averaged gradients, and end
// with bitwise its master weights. The gradients are small integers times 2^-12, rank r's the
// average plus (2r - (N - 1)) times another such value, so that the average is exact in fp32 for
// any world size and the sum of squares exact in double (the clipped norm is then the same too).
#pragma once

#include <array>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <ostream>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "zinf/cuda/device.h"
#include "zinf/dist/collectives.h"
#include "zinf/dist/sharded_engine.h"
#include "zinf/offload/config.h"
#include "zinf/offload/engine.h"

namespace zinf::dist::test {

using offload::OffloadDevice;

// Odd sizes: one smaller than some worlds (5 elements over 3 ranks pads to 6), one that no
// world size divides, one of each parameter dtype.
inline std::vector<offload::LayerSpec> sharded_layers() {
  return {{"embed", 1001, ElementType::kBF16},
          {"bias", 5, ElementType::kF16},
          {"proj", 2048, ElementType::kBF16}};
}

/// Where a rank's gradients are handed in: host memory, or a device buffer of its device
/// written on the compute stream.
enum class GradPlace { kHost, kDevice };

/// What a run exercises: the tiers, the staged mode with clipping and one overflow step, and
/// the sharded ranks' gradients (placement and dtype; the 1-rank reference always gets fp32 in
/// host memory, the same values).
struct ShardedCase {
  OffloadDevice param = OffloadDevice::kCpu;
  OffloadDevice optimizer = OffloadDevice::kCpu;
  bool staged = false;  // staged, clipped (the coefficient < 1), an inf in step kOverflowStep
  GradPlace grads = GradPlace::kHost;
  ElementType grad_dtype = ElementType::kF32;
  // Dynamic fp16 loss scaling from 2^4, halved at the first overflow (staged cases only).
  bool dynamic_scale = false;
  // zero_optimization.stage: 3 partitions the parameters; 1 and 2 (resident parameters only)
  // keep them whole on every rank.
  int stage = 3;
};

/// The case as a test name's part: "cpu_cpu_on_arrival", "..._device_bf16_grads".
inline std::string case_name(const ShardedCase& c) {
  std::string name = std::string(offload::offload_device_name(c.param)) + "_" +
                     std::string(offload::offload_device_name(c.optimizer)) +
                     (c.staged ? "_staged" : "_on_arrival");
  if (c.grads == GradPlace::kDevice || c.grad_dtype != ElementType::kF32) {
    name += std::string(c.grads == GradPlace::kDevice ? "_device_" : "_host_") +
            std::string(element_type_name(c.grad_dtype)) + "_grads";
  }
  if (c.dynamic_scale) name += "_dynamic_scale";
  if (c.stage != 3) name += "_stage" + std::to_string(c.stage);
  return name;
}

// Failure messages show the case, not its bytes (found by ADL).
inline void PrintTo(const ShardedCase& c, std::ostream* os) { *os << case_name(c); }

constexpr std::uint64_t kSteps = 3;
constexpr std::uint64_t kOverflowStep = 2;

/// The engine config of a case, NVMe paths under `dir` (the sharded engine adds rank<R>).
inline offload::EngineConfig sharded_config(const ShardedCase& c, const std::string& dir) {
  offload::EngineConfig cfg;
  cfg.zero_stage = c.stage;
  cfg.offload_param.device = c.param;
  cfg.offload_param.buffer_count = 2;
  cfg.offload_param.buffer_size = 4096;
  cfg.offload_optimizer.device = c.optimizer;
  cfg.offload_optimizer.buffer_count = 3;
  if (c.param == OffloadDevice::kNvme) cfg.offload_param.nvme_path = dir;
  if (c.optimizer == OffloadDevice::kNvme) cfg.offload_optimizer.nvme_path = dir;
  cfg.sub_group_size = 1024;
  cfg.aio.block_size = 64u << 10;
  cfg.aio.queue_depth = 4;
  cfg.zinf.backend = swap::IoEngineKind::kThreads;
  cfg.zinf.pinned_budget_bytes = 16u << 20;
  cfg.zinf.adam_threads = 1;
  cfg.zinf.tbw_tb = 0;
  cfg.zinf.rate_notice_share = 0;
  cfg.optimizer.hyper.lr = 1.0f / 64;
  cfg.optimizer.hyper.weight_decay = 1.0f / 128;
  cfg.optimizer.hyper.mode = adam::AdamMode::kAdamW;
  if (c.staged) {
    cfg.zinf.step_mode = offload::StepMode::kStaged;
    cfg.gradient_clipping = 0.05;  // below every step's norm: the coefficient is < 1
  }
  if (c.dynamic_scale) {
    cfg.loss_scaling.enabled = true;
    cfg.loss_scaling.initial_scale_power = 4;
    cfg.loss_scaling.hysteresis = 1;
  }
  return cfg;
}

inline float initial_weight(std::size_t layer, std::uint64_t i) {
  return static_cast<float>(static_cast<int>((layer * 131 + i * 17) % 257) - 128) / 256.0f;
}

/// The average gradient of element i of `layer` at step t (what the 1-rank engine is fed).
inline float average_grad(std::size_t layer, std::uint64_t t, std::uint64_t i) {
  const int k = static_cast<int>((layer * 7 + t * 13 + i * 5) % 97) - 48;
  return static_cast<float>(k) / 4096.0f;
}

/// Rank r's gradient of it in a world of n: the average plus (2r - (n - 1)) * delta; the
/// offsets sum to 0 over the ranks. Rank 0 puts an inf in element 0 of layer 0 at the overflow
/// step of a staged case (the average is then inf, and every rank must skip).
inline std::vector<float> rank_grads(const ShardedCase& c, std::size_t layer, std::uint64_t numel,
                                     std::uint64_t t, int rank, int world) {
  std::vector<float> g(numel);
  for (std::uint64_t i = 0; i < numel; ++i) {
    const float delta = static_cast<float>(static_cast<int>((i + t) % 9) - 4) / 4096.0f;
    g[i] = average_grad(layer, t, i) + static_cast<float>(2 * rank - (world - 1)) * delta;
  }
  if (c.staged && t == kOverflowStep && layer == 0 && rank == 0) {
    g[0] = std::numeric_limits<float>::infinity();
  }
  return g;
}

/// A rank's device (make_device's pick, or one the caller lends) and its compute stream.
struct RankDevice {
  RankDevice() : owned(cuda::make_device(cuda::DeviceOptions{})), device(owned.get()) {}
  explicit RankDevice(cuda::Device& lent) : device(&lent) {}
  ~RankDevice() {
    compute = cuda::Stream();
    owned.reset();
  }
  RankDevice(const RankDevice&) = delete;
  RankDevice& operator=(const RankDevice&) = delete;

  std::unique_ptr<cuda::Device> owned;
  cuda::Device* device;
  cuda::Stream compute = device->create_stream();
};

/// What one run saw: per step, the bytes of every full layer fetched before it; the masters
/// after the last step; whether each step was skipped.
struct Trace {
  std::vector<std::vector<std::vector<std::byte>>> fetched;  // [step][layer]
  std::vector<std::vector<float>> masters;
  std::vector<bool> skipped;
  std::vector<double> grad_scale;  // each step's grad_scale_applied (the clipping factor)
  // Each step's collective byte counts: all-gather, reduce-scatter, all-reduce.
  std::vector<std::array<std::uint64_t, 3>> collective_bytes;
};

/// The collective byte counts a rank of `world` must report for a step of run_steps (every
/// layer fetched once), `skipped` or not: a ring's (N - 1) / N of each padded buffer (the
/// gradients fp32), twice that for an all-reduce; the parameters all-gathered at each fetch
/// (stage 3) or once after a step that was not skipped (stages 1, 2).
inline std::array<std::uint64_t, 3> expected_collective_bytes(const ShardedCase& c, int world,
                                                              bool skipped) {
  std::array<std::uint64_t, 3> want{0, 0, 0};
  const auto n = static_cast<std::uint64_t>(world);
  for (const auto& l : sharded_layers()) {
    const std::uint64_t padded = (l.numel + n - 1) / n * n;
    const std::uint64_t params = padded * element_size(l.param_dtype) / n * (n - 1);
    const std::uint64_t grads = padded * sizeof(float) / n * (n - 1);
    if (c.stage == 3 || !skipped) want[0] += params;
    if (c.stage == 1) {
      want[2] += 2 * grads;
    } else {
      want[1] += grads;
    }
  }
  return want;
}

/// An engine of either kind behind the calls the loop makes.
template <class Engine>
std::vector<std::byte> fetch_bytes(Engine& e, RankDevice& d, std::size_t layer,
                                   const offload::LayerSpec& spec) {
  std::vector<std::byte> host(spec.numel * element_size(spec.param_dtype));
  const cuda::DeviceSpan span = e.fetch(layer);
  EXPECT_EQ(span.size(), host.size()) << spec.name;
  d.device->copy_to_host(d.compute.ref(), host, span);
  e.release(layer);
  d.device->synchronize(d.compute.ref());
  return host;
}

// The compiler's IEEE half type (GCC 12 has no C++ _Float16 on aarch64; its __fp16 is the same).
#if defined(__aarch64__)
using Half = __fp16;
#else
using Half = _Float16;
#endif

/// A rank's gradients `g` of layer `l` handed to `e` as the case says. bf16 and fp16 hold them
/// exactly (small integers times 2^-12, and inf), so the average is the fp32 run's. Device
/// gradients are written on the compute stream behind a stretch of busy compute, so an engine
/// that did not wait for that stream would read them unwritten. `narrow` and `dev` keep what
/// the engine may read until step() returns.
template <class Engine>
void hand_in(Engine& e, RankDevice& d, const ShardedCase& c, std::size_t l,
             const std::vector<float>& g, std::vector<std::uint16_t>& narrow,
             cuda::DeviceBuffer& dev) {
  std::span<const std::byte> bytes = std::as_bytes(std::span(g));
  if (c.grad_dtype != ElementType::kF32) {
    narrow.resize(g.size());
    for (std::size_t i = 0; i < g.size(); ++i) {
      narrow[i] = c.grad_dtype == ElementType::kBF16
                      ? static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(g[i]) >> 16)
                      : std::bit_cast<std::uint16_t>(static_cast<Half>(g[i]));
    }
    bytes = std::as_bytes(std::span(narrow));
  }
  if (c.grads == GradPlace::kHost) {
    e.set_gradients(l, adam::GradView{bytes.data(), g.size(), c.grad_dtype});
    return;
  }
  dev = d.device->allocate(bytes.size());
  d.device->enqueue_busy(d.compute.ref(), std::chrono::milliseconds(10));
  d.device->copy_to_device(d.compute.ref(), dev.span(), bytes);
  e.set_gradients(l, dev.span(), c.grad_dtype);
}

/// Steps [first, last] of the loop: fetch every layer (recorded), hand in the gradients of
/// `rank` of `world` (world 0: the average, for the 1-rank reference), step.
template <class Engine>
void run_steps(Engine& e, RankDevice& d, const ShardedCase& c, int rank, int world,
               std::uint64_t first, std::uint64_t last, Trace& trace) {
  const auto layers = sharded_layers();
  for (std::uint64_t t = first; t <= last; ++t) {
    std::vector<std::vector<std::byte>> seen;
    for (std::size_t l = 0; l < layers.size(); ++l) seen.push_back(fetch_bytes(e, d, l, layers[l]));
    trace.fetched.push_back(std::move(seen));
    // Kept until step() returns: the on_arrival mode reads them until then.
    std::vector<std::vector<float>> grads(layers.size());
    std::vector<std::vector<std::uint16_t>> narrow(layers.size());
    std::vector<cuda::DeviceBuffer> on_device(layers.size());
    for (std::size_t l = layers.size(); l-- > 0;) {
      std::vector<float>& g = grads[l];
      if (world == 0) {
        g.resize(layers[l].numel);
        for (std::uint64_t i = 0; i < g.size(); ++i) g[i] = average_grad(l, t, i);
        if (c.staged && t == kOverflowStep && l == 0) g[0] = std::numeric_limits<float>::infinity();
        e.set_gradients(l, adam::GradView::f32(g));
      } else {
        g = rank_grads(c, l, layers[l].numel, t, rank, world);
        hand_in(e, d, c, l, g, narrow[l], on_device[l]);
      }
    }
    const offload::StepStats st = e.step();
    trace.skipped.push_back(st.skipped);
    trace.grad_scale.push_back(st.grad_scale_applied);
    trace.collective_bytes.push_back(
        {st.allgather_bytes, st.reduce_scatter_bytes, st.all_reduce_bytes});
  }
}

template <class Engine>
void init_masters(Engine& e) {
  const auto layers = sharded_layers();
  for (std::size_t l = 0; l < layers.size(); ++l) {
    std::vector<float> w(layers[l].numel);
    for (std::uint64_t i = 0; i < w.size(); ++i) w[i] = initial_weight(l, i);
    e.set_master_weights(l, w);
  }
}

template <class Engine>
std::vector<std::vector<float>> read_masters(Engine& e) {
  std::vector<std::vector<float>> out;
  for (std::size_t l = 0; l < e.layer_count(); ++l) {
    out.emplace_back(e.layer(l).numel);
    e.read_master_weights(l, out.back());
  }
  return out;
}

/// The 1-rank OffloadEngine's run over the whole layers (swap files under `dir`).
inline Trace reference_trace(const ShardedCase& c, const std::string& dir) {
  RankDevice d;
  offload::OffloadEngine e(sharded_config(c, dir), sharded_layers(), *d.device, d.compute.ref());
  init_masters(e);
  Trace t;
  run_steps(e, d, c, 0, 0, 1, kSteps, t);
  t.masters = read_masters(e);
  return t;
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

/// One rank's run on `d`, compared with `want` bitwise: every fetch, every skip, the final
/// masters. With `ckpt`, the engine is saved after step kSteps - 1 and the last step runs on a
/// new engine loaded from it.
inline void check_sharded_engine(Collectives& comm, RankDevice& d, const ShardedCase& c,
                                 const std::string& dir, const Trace& want,
                                 const std::string& ckpt = "") {
  const int rank = comm.rank();
  const int world = comm.size();
  Trace got;
  auto e = std::make_unique<ShardedEngine>(sharded_config(c, dir), sharded_layers(), *d.device,
                                           d.compute.ref(), comm);
  init_masters(*e);
  if (ckpt.empty()) {
    run_steps(*e, d, c, rank, world, 1, kSteps, got);
  } else {
    run_steps(*e, d, c, rank, world, 1, kSteps - 1, got);
    e->save(ckpt);
    e.reset();
    e = std::make_unique<ShardedEngine>(sharded_config(c, dir), sharded_layers(), *d.device,
                                        d.compute.ref(), comm);
    e->load(ckpt);
    run_steps(*e, d, c, rank, world, kSteps, kSteps, got);
  }
  got.masters = read_masters(*e);
  ASSERT_EQ(got.fetched.size(), want.fetched.size());
  for (std::size_t t = 0; t < want.fetched.size(); ++t) {
    for (std::size_t l = 0; l < want.fetched[t].size(); ++l) {
      EXPECT_EQ(got.fetched[t][l], want.fetched[t][l])
          << "rank " << rank << " of " << world << ": fetch of layer " << l << " before step "
          << t + 1;
    }
  }
  EXPECT_EQ(got.skipped, want.skipped) << "rank " << rank << " of " << world;
  EXPECT_EQ(got.grad_scale, want.grad_scale) << "rank " << rank << " of " << world;
  for (std::size_t t = 0; t < got.collective_bytes.size(); ++t) {
    // The plain engine moves none.
    EXPECT_EQ(want.collective_bytes[t], (std::array<std::uint64_t, 3>{0, 0, 0}));
    EXPECT_EQ(got.collective_bytes[t], expected_collective_bytes(c, world, got.skipped[t]))
        << "rank " << rank << " of " << world << ": collective bytes of step " << t + 1;
  }
  for (std::size_t l = 0; l < want.masters.size(); ++l) {
    EXPECT_TRUE(same_bits(got.masters[l], want.masters[l]))
        << "rank " << rank << " of " << world << ": master weights of layer " << l;
  }
  // This rank's engine holds its slices only.
  for (std::size_t l = 0; l < e->layer_count(); ++l) {
    EXPECT_EQ(e->local().layer(l).numel, (e->layer(l).numel + world - 1) / world);
  }
  // Its swap files are in its own rank<R> folder while it lives (one rank: the directory as
  // the plain engine uses it); the folder goes with the engine once empty.
  const bool nvme = c.param == OffloadDevice::kNvme || c.optimizer == OffloadDevice::kNvme;
  const std::string folder = dir + "/rank" + std::to_string(rank);
  EXPECT_EQ(std::filesystem::is_directory(folder), nvme && world > 1) << folder;
  e.reset();
  EXPECT_FALSE(std::filesystem::exists(folder)) << folder;
}

/// Steps [first, last] of the run on a new engine of this rank, compared with `want` bitwise
/// (fetches, skips, clipping factors, and at kSteps the masters): from the initial masters
/// (first == 1) or loaded from `load_from`, which another world size may have saved; saved to
/// `save_to` after `last` where given.
inline void check_sharded_engine_steps(Collectives& comm, RankDevice& d, const ShardedCase& c,
                                       const std::string& dir, const Trace& want,
                                       std::uint64_t first, std::uint64_t last,
                                       const std::string& load_from, const std::string& save_to) {
  const int rank = comm.rank();
  const int world = comm.size();
  ShardedEngine e(sharded_config(c, dir), sharded_layers(), *d.device, d.compute.ref(), comm);
  if (first == 1) {
    init_masters(e);
  } else {
    e.load(load_from);
  }
  Trace got;
  run_steps(e, d, c, rank, world, first, last, got);
  for (std::uint64_t t = first; t <= last; ++t) {
    for (std::size_t l = 0; l < want.fetched[t - 1].size(); ++l) {
      EXPECT_EQ(got.fetched[t - first][l], want.fetched[t - 1][l])
          << "rank " << rank << " of " << world << ": fetch of layer " << l << " before step " << t;
    }
    EXPECT_EQ(got.skipped[t - first], want.skipped[t - 1]) << "rank " << rank << ", step " << t;
    EXPECT_EQ(got.grad_scale[t - first], want.grad_scale[t - 1])
        << "rank " << rank << ", step " << t;
  }
  if (last == kSteps) {
    const auto masters = read_masters(e);
    for (std::size_t l = 0; l < want.masters.size(); ++l) {
      EXPECT_TRUE(same_bits(masters[l], want.masters[l]))
          << "rank " << rank << " of " << world << ": master weights of layer " << l;
    }
  }
  if (!save_to.empty()) e.save(save_to);
}

}  // namespace zinf::dist::test
