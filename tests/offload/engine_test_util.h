// SPDX-License-Identifier: Apache-2.0
// Helpers for the OffloadEngine tests: a config per tier combination in a test directory, a
// HostDevice with a compute stream, and a synthetic training loop whose gradients are derived
// from the fetched low-precision parameters (so a wrong or stale fetch changes the result),
// checking on every fetch that the bytes are exactly the rounded current master weights.
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "support/test_dir.h"
#include "zinf/cuda/device.h"
#include "zinf/offload/config.h"
#include "zinf/offload/engine.h"
#include "zinf/offload/testing.h"

namespace zinf::offload {
// Test names and failure messages show "nvme", not "1-byte object <02>" (found by ADL, so in
// the enum's namespace).
inline void PrintTo(OffloadDevice device, std::ostream* os) { *os << offload_device_name(device); }
}  // namespace zinf::offload

namespace zinf::test {

inline std::vector<offload::LayerSpec> engine_layers() {
  return {{"l0", 5000, ElementType::kBF16},
          {"l1", 2 * 2048 + 7, ElementType::kBF16},
          {"l2", 300, ElementType::kF16},
          {"l3", 4096, ElementType::kBF16}};
}

inline offload::EngineConfig engine_config(offload::OffloadDevice param, offload::OffloadDevice opt,
                                           const TestDir& dir) {
  offload::EngineConfig c;
  c.zero_stage = 3;
  c.offload_param.device = param;
  c.offload_param.buffer_count = 3;
  c.offload_param.buffer_size = 1u << 16;
  c.offload_optimizer.device = opt;
  c.offload_optimizer.buffer_count = 3;
  if (param == offload::OffloadDevice::kNvme) c.offload_param.nvme_path = dir.subdir("param");
  if (opt == offload::OffloadDevice::kNvme) c.offload_optimizer.nvme_path = dir.subdir("opt");
  c.sub_group_size = 2048;
  c.aio.block_size = 256u << 10;
  c.aio.queue_depth = 8;
  c.zinf.backend = swap::IoEngineKind::kThreads;
  c.zinf.pinned_budget_bytes = 64u << 20;
  c.zinf.adam_threads = 2;
  c.optimizer.hyper.lr = 1e-2;
  c.optimizer.hyper.weight_decay = 0.01;
  c.optimizer.hyper.mode = adam::AdamMode::kAdamW;
  return c;
}

inline std::uint32_t mix32(std::uint64_t a) {
  a ^= a >> 33;
  a *= 0xff51afd7ed558ccdull;
  a ^= a >> 33;
  return static_cast<std::uint32_t>(a);
}

inline std::vector<float> initial_weights(std::size_t layer, std::uint64_t numel) {
  std::vector<float> w(numel);
  for (std::uint64_t i = 0; i < numel; ++i) {
    w[i] = static_cast<float>(mix32(layer * 1000003 + i) % 20001u) / 10000.0f - 1.0f;
  }
  return w;
}

/// The loop's gradients of `layer` in step `t`, from the bits its fetch returned.
inline std::vector<float> synthetic_grads(std::span<const std::uint16_t> bits, std::uint64_t t,
                                          std::size_t layer) {
  std::vector<float> g(bits.size());
  for (std::size_t i = 0; i < bits.size(); ++i) {
    g[i] = static_cast<float>(bits[i] % 1000u) * 2e-5f - 1e-2f +
           static_cast<float>(mix32(t * 7919 + layer * 31 + i) % 101u) * 1e-5f;
  }
  return g;
}

/// The masters EngineRig's loop must reach after `steps` iterations, computed with the plain
/// kernel on in-memory arrays: each layer from initial_weights, its gradients from its masters
/// rounded to its dtype (what a fetch returns), step t with hyper_of(layer, t).
inline std::vector<std::vector<float>> plain_masters(
    const std::vector<offload::LayerSpec>& layers,
    const std::function<adam::AdamParams(std::size_t layer, std::uint64_t step)>& hyper_of,
    std::uint64_t steps) {
  adam::CpuAdam adam(adam::CpuAdamOptions{1, std::nullopt});
  std::vector<std::vector<float>> p, m, v;
  for (std::size_t l = 0; l < layers.size(); ++l) {
    p.push_back(initial_weights(l, layers[l].numel));
    m.emplace_back(layers[l].numel, 0.0f);
    v.emplace_back(layers[l].numel, 0.0f);
  }
  for (std::uint64_t t = 1; t <= steps; ++t) {
    for (std::size_t l = 0; l < layers.size(); ++l) {
      std::vector<std::uint16_t> bits(layers[l].numel);
      adam.copy_out(p[l], {bits.data(), bits.size(), layers[l].param_dtype, true});
      const auto g = synthetic_grads(bits, t, l);
      adam::AdamParams hp = hyper_of(l, t);
      hp.step = t;
      adam.step(hp, p[l], m[l], v[l], adam::GradView::f32(g));
    }
  }
  return p;
}

/// A HostDevice, its compute stream and an engine; plus the loop.
class EngineRig {
 public:
  /// `copy_gbps` caps the HostDevice's copy lanes (0: memory speed), to make copies slow.
  explicit EngineRig(cuda::DeviceKind kind = cuda::DeviceKind::kHost, double copy_gbps = 0) {
    cuda::DeviceOptions o;
    o.kind = kind;
    o.host_copy_bandwidth_gbps = copy_gbps;
    device_ = cuda::make_device(o);
    compute_ = device_->create_stream();
  }
  ~EngineRig() {
    engine_.reset();
    dev_grads_.clear();
    compute_ = cuda::Stream();
    device_.reset();
  }
  offload::OffloadEngine& make(offload::EngineConfig c,
                               std::vector<offload::LayerSpec> layers = engine_layers()) {
    engine_.reset();
    dev_grads_.clear();
    engine_ = std::make_unique<offload::OffloadEngine>(std::move(c), std::move(layers), *device_,
                                                       compute_.ref());
    return *engine_;
  }
  /// As make(), with fault plans in the engine's I/O engines (zinf/offload/testing.h).
  offload::OffloadEngine& make(offload::EngineConfig c, offload::test_hooks::EngineFaults faults,
                               std::vector<offload::LayerSpec> layers = engine_layers()) {
    engine_.reset();
    engine_ = offload::test_hooks::make_engine_with_faults(
        std::move(c), std::move(layers), *device_, compute_.ref(), std::move(faults));
    return *engine_;
  }
  offload::OffloadEngine& engine() { return *engine_; }
  cuda::Device& device() { return *device_; }
  cuda::StreamRef compute() { return compute_.ref(); }
  /// From now on iteration() hands gradients in from device memory: copied host -> device on
  /// the compute stream, then set_gradients(layer, DeviceSpan, fp32).
  void use_device_gradients(bool on = true) { device_grads_ = on; }
  void reset() { engine_.reset(); }

  void init_weights() {
    for (std::size_t l = 0; l < engine_->layer_count(); ++l) {
      engine_->set_master_weights(l, initial_weights(l, engine_->layer(l).numel));
    }
  }

  /// The low-precision bits a fetch must return now: the masters rounded as the kernel does.
  std::vector<std::uint16_t> expected_bits(std::size_t layer) {
    const auto& spec = engine_->layer(layer);
    std::vector<float> m(spec.numel);
    engine_->read_master_weights(layer, m);
    std::vector<std::uint16_t> out(spec.numel);
    adam::CpuAdam adam(adam::CpuAdamOptions{1, std::nullopt});
    adam.copy_out(m, {out.data(), out.size(), spec.param_dtype, true});
    return out;
  }

  /// Fetches `layer`, copies its bytes to the host on the compute stream and releases it.
  std::vector<std::uint16_t> fetch_bits(std::size_t layer) {
    const auto& spec = engine_->layer(layer);
    std::vector<std::uint16_t> host(spec.numel);
    cuda::DeviceSpan span = engine_->fetch(layer);
    EXPECT_EQ(span.size(), spec.numel * 2);
    device_->copy_to_host(compute_, std::as_writable_bytes(std::span<std::uint16_t>(host)), span);
    engine_->release(layer);
    device_->synchronize(compute_);
    return host;
  }

  /// One iteration of step `t`: forward fetches in order, backward fetches in reverse with
  /// gradients computed from the fetched bits, then step(). With `check`, every fetch must be
  /// exactly expected_bits (computed before the iteration).
  void iteration(std::uint64_t t, bool check = true, std::vector<std::size_t> forward = {}) {
    const std::size_t n = engine_->layer_count();
    if (forward.empty()) {
      for (std::size_t l = 0; l < n; ++l) forward.push_back(l);
    }
    std::vector<std::vector<std::uint16_t>> want(n);
    if (check) {
      for (std::size_t l = 0; l < n; ++l) want[l] = expected_bits(l);
    }
    for (std::size_t l : forward) {
      auto got = fetch_bits(l);
      if (check) {
        EXPECT_EQ(got, want[l]) << "forward fetch of layer " << l << " before step " << t;
      }
    }
    grads_.assign(n, {});
    for (std::size_t k = forward.size(); k-- > 0;) {
      const std::size_t l = forward[k];
      auto got = fetch_bits(l);
      if (check) {
        EXPECT_EQ(got, want[l]) << "backward fetch of layer " << l << " before step " << t;
      }
      grads_[l] = synthetic_grads(got, t, l);
      const auto& g = grads_[l];
      if (device_grads_) {
        if (dev_grads_.size() < n) dev_grads_.resize(n);
        if (dev_grads_[l].empty()) dev_grads_[l] = device_->allocate(g.size() * sizeof(float));
        device_->copy_to_device(compute_, dev_grads_[l].span(),
                                std::as_bytes(std::span<const float>(g)));
        engine_->set_gradients(l, dev_grads_[l].span(), ElementType::kF32);
      } else {
        engine_->set_gradients(l, adam::GradView::f32(g));
      }
    }
    (void)engine_->step();
  }

  std::vector<std::vector<float>> masters() {
    std::vector<std::vector<float>> out;
    for (std::size_t l = 0; l < engine_->layer_count(); ++l) {
      out.emplace_back(engine_->layer(l).numel);
      engine_->read_master_weights(l, out.back());
    }
    return out;
  }

 private:
  std::unique_ptr<cuda::Device> device_;
  cuda::Stream compute_;
  std::vector<cuda::DeviceBuffer> dev_grads_;  // before the engine: it may still read them
  std::unique_ptr<offload::OffloadEngine> engine_;
  std::vector<std::vector<float>> grads_;
  bool device_grads_ = false;
};

/// Bitwise equality of two sets of master weights ("" if equal).
inline std::string master_diff(const std::vector<std::vector<float>>& a,
                               const std::vector<std::vector<float>>& b) {
  if (a.size() != b.size()) return "layer count differs";
  for (std::size_t l = 0; l < a.size(); ++l) {
    if (a[l].size() != b[l].size()) return "size of layer " + std::to_string(l) + " differs";
    if (std::memcmp(a[l].data(), b[l].data(), a[l].size() * 4) != 0) {
      return "layer " + std::to_string(l) + " differs";
    }
  }
  return "";
}

}  // namespace zinf::test
