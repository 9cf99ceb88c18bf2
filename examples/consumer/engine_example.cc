// SPDX-License-Identifier: Apache-2.0
// The C++ OffloadEngine on a tiny model with the host device, computing on the trainer's own
// stream: set master weights, fetch and check the bf16 copy, hand in gradients, step, and
// check that Adam's first step moved every weight by lr against its gradient's sign. Exits 1
// on any mismatch.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <vector>

#include "zinf/cuda/cuda_interop.h"
#include "zinf/cuda/device.h"
#include "zinf/offload/config.h"
#include "zinf/offload/engine.h"

namespace {

// Round-to-nearest-even fp32 -> bf16 bits (finite inputs).
std::uint16_t to_bf16(float f) {
  std::uint32_t bits = 0;
  std::memcpy(&bits, &f, sizeof bits);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>(bits >> 16);
}

int run() {
  namespace off = zinf::offload;
  const char* kConfig = R"({
    "zero_optimization": {"stage": 3, "sub_group_size": 32768,
      "offload_param": {"device": "cpu", "buffer_count": 2, "buffer_size": 4096},
      "offload_optimizer": {"device": "cpu"}},
    "optimizer": {"type": "Adam", "params": {"lr": 0.01}}
  })";
  const double lr = 0.01;
  std::vector<off::LayerSpec> layers = {{"embed", 1000, zinf::ElementType::kBF16},
                                        {"head", 300, zinf::ElementType::kBF16}};
  auto device = zinf::cuda::make_device({.kind = zinf::cuda::DeviceKind::kHost});
  // The trainer's own stream: a cudaStream_t on a GPU; on the host device a host stream stands
  // in for it. zinf adopts it (never destroys it), so fetch's copies are ordered into it.
  zinf::cuda::Stream trainer_stream = device->create_stream();
  zinf::cuda::AdoptedStream compute =
      zinf::cuda::adopt_stream(*device, zinf::cuda::native_stream(trainer_stream));
  off::OffloadEngine engine(off::parse_config(kConfig), layers, *device, compute);

  // One iteration over every layer, then one step: Adam's step count is the engine's, so each
  // layer's first update must come from the first step to match the closed form below.
  const std::size_t count = engine.layer_count();
  std::vector<std::vector<float>> w(count), g(count);
  int failures = 0;
  for (std::size_t l = 0; l < count; ++l) {
    const std::size_t n = engine.layer(l).numel;
    w[l].resize(n);
    g[l].resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      w[l][i] = 0.001f * static_cast<float>(i % 97) - 0.05f;
      g[l][i] = (i % 3 == 0) ? -0.5f : 0.25f;
    }
    engine.set_master_weights(l, w[l]);
  }
  for (std::size_t l = 0; l < count; ++l) {
    const std::size_t n = w[l].size();
    zinf::cuda::DeviceSpan p = engine.fetch(l);
    device->synchronize(compute);  // host device: the span is host memory once the stream ran
    if (p.size() != n * 2) {
      std::fprintf(stderr, "layer %zu: fetched %zu bytes, want %zu\n", l, p.size(), n * 2);
      return 1;
    }
    std::vector<std::uint16_t> bf16(n);
    std::memcpy(bf16.data(), p.data(), p.size());
    engine.release(l);
    for (std::size_t i = 0; i < n; ++i) {
      if (bf16[i] != to_bf16(w[l][i])) ++failures;
    }
    engine.set_gradients(l, zinf::adam::GradView::f32(g[l]));
  }
  engine.step();
  for (std::size_t l = 0; l < count; ++l) {
    std::vector<float> after(w[l].size());
    engine.read_master_weights(l, after);
    for (std::size_t i = 0; i < after.size(); ++i) {
      // Adam's first step with bias correction: m_hat/sqrt(v_hat) = sign(g).
      const double want = w[l][i] - lr * (g[l][i] > 0 ? 1.0 : -1.0);
      if (std::fabs(after[i] - want) > 1e-5) ++failures;
    }
  }
  const off::EngineStats stats = engine.stats();
  if (stats.steps != 1) {
    std::fprintf(stderr, "stats.steps = %llu, want 1\n",
                 static_cast<unsigned long long>(stats.steps));
    return 1;
  }
  if (failures != 0) {
    std::fprintf(stderr, "%d mismatched elements\n", failures);
    return 1;
  }
  std::printf("engine_example: ok (%zu layers, %llu steps)\n", engine.layer_count(),
              static_cast<unsigned long long>(stats.steps));
  return 0;
}

}  // namespace

int main() {
  try {
    return run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "engine_example: %s\n", e.what());
    return 1;
  }
}
