// SPDX-License-Identifier: Apache-2.0
// GradientStage: staged gradients come back exactly (fp32, and bf16/fp16 widened), from pinned
// memory and from NVMe through the two-buffer ring (with the release callback before a buffer
// is reused); the caller's buffer is free once stage() returns; the sum of squares does not
// depend on arrival order; one inf or NaN is an overflow; a failed staging write is reported
// by replay before any layer is handed out.
#include "grad_stage.h"

#include <gtest/gtest.h>

#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <thread>
#include <vector>
#include <functional>

#include "support/test_dir.h"
#include "zinf/common/error.h"
#include "zinf/swap/fault_injection.h"

namespace zinf::offload::detail {
namespace {

std::vector<StagedLayer> test_layers() { return {{"a", 5000}, {"b", 300}, {"c", 70001}}; }

std::vector<float> grads_of(std::size_t layer, std::uint64_t numel) {
  std::vector<float> g(numel);
  for (std::uint64_t i = 0; i < numel; ++i) {
    g[i] = static_cast<float>((layer * 7919 + i * 31) % 2001) * 1e-3f - 1.0f;
  }
  return g;
}

GradStageOptions pinned_options() {
  GradStageOptions o;
  o.layers = test_layers();
  return o;
}

GradStageOptions nvme_options(const test::TestDir& dir) {
  GradStageOptions o;
  o.layers = test_layers();
  o.nvme = true;
  o.directories = {dir.subdir("g0"), dir.subdir("g1")};
  o.io.kind = swap::IoEngineKind::kThreads;
  o.io.queue_depth = 4;
  return o;
}

// Every staged layer's gradients as replay hands them out, copied, each consumed at once.
struct Replayed {
  std::vector<std::vector<float>> grads;
  std::vector<std::size_t> order;
};

Replayed replay_all(GradientStage& stage, std::size_t layers) {
  Replayed r;
  r.grads.resize(layers);
  stage.replay([&](std::size_t l, adam::GradView g, const std::function<void()>& consumed) {
    EXPECT_EQ(g.dtype, ElementType::kF32);
    const auto* p = static_cast<const float*>(g.data);
    r.grads[l].assign(p, p + g.size);
    r.order.push_back(l);
    if (consumed) consumed();
  });
  return r;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

TEST(GradientStage, PinnedStagingGivesTheGradientsBackInLayerOrder) {
  GradientStage stage(pinned_options());
  EXPECT_FALSE(stage.on_nvme());
  EXPECT_EQ(stage.pinned_bytes(), grad_stage_pinned_bytes(test_layers()));
  const auto layers = test_layers();
  std::vector<float> buffer;
  for (std::size_t l : {2u, 0u}) {  // backward order; layer 1 gets none
    buffer = grads_of(l, layers[l].numel);
    stage.stage(l, adam::GradView::f32(buffer));
    std::fill(buffer.begin(), buffer.end(), 99.0f);  // the caller's buffer is free again
  }
  EXPECT_TRUE(stage.staged(0));
  EXPECT_FALSE(stage.staged(1));
  const Replayed r = replay_all(stage, layers.size());
  EXPECT_EQ(r.order, (std::vector<std::size_t>{0, 2}));
  EXPECT_TRUE(same_bits(r.grads[0], grads_of(0, layers[0].numel)));
  EXPECT_TRUE(same_bits(r.grads[2], grads_of(2, layers[2].numel)));
  EXPECT_FALSE(stage.overflow());
  stage.clear();
  EXPECT_FALSE(stage.staged(0));
  EXPECT_EQ(stage.sum_of_squares(), 0.0);
}

TEST(GradientStage, SumOfSquaresIsTheNormSquaredWhateverTheArrivalOrder) {
  const auto layers = test_layers();
  GradientStage forward(pinned_options());
  GradientStage backward(pinned_options());
  std::vector<std::vector<float>> g;
  double want = 0;
  for (std::size_t l = 0; l < layers.size(); ++l) {
    g.push_back(grads_of(l, layers[l].numel));
    for (float x : g.back()) want += static_cast<double>(x) * x;
  }
  for (std::size_t l = 0; l < layers.size(); ++l) forward.stage(l, adam::GradView::f32(g[l]));
  for (std::size_t l = layers.size(); l-- > 0;) backward.stage(l, adam::GradView::f32(g[l]));
  EXPECT_EQ(std::bit_cast<std::uint64_t>(forward.sum_of_squares()),
            std::bit_cast<std::uint64_t>(backward.sum_of_squares()));
  EXPECT_NEAR(forward.sum_of_squares(), want, want * 1e-12);
}

TEST(GradientStage, Bf16AndFp16GradientsWidenExactly) {
  GradStageOptions o;
  o.layers = {{"h", 8}, {"b", 3}};
  GradientStage stage(o);
  // fp16: 1, -2, 65504 (the largest), 2^-24 (the smallest subnormal), 2^-14 (smallest
  // normal), 0x03ff (the largest subnormal), -0, 0.5.
  const std::vector<std::uint16_t> h = {0x3c00, 0xc000, 0x7bff, 0x0001,
                                        0x0400, 0x03ff, 0x8000, 0x3800};
  const std::vector<float> h_want = {1.0f,
                                     -2.0f,
                                     65504.0f,
                                     std::ldexp(1.0f, -24),
                                     std::ldexp(1.0f, -14),
                                     std::ldexp(1023.0f, -24),
                                     -0.0f,
                                     0.5f};
  // bf16: 1, -3, and the bf16 of 1e-20 (its top 16 bits).
  const std::vector<std::uint16_t> b = {
      0x3f80, 0xc040, static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(1e-20f) >> 16)};
  const std::vector<float> b_want = {
      1.0f, -3.0f, std::bit_cast<float>(std::bit_cast<std::uint32_t>(1e-20f) & 0xffff0000u)};
  stage.stage(0, adam::GradView::f16(h));
  stage.stage(1, adam::GradView::bf16(b));
  const Replayed r = replay_all(stage, 2);
  EXPECT_TRUE(same_bits(r.grads[0], h_want));
  EXPECT_TRUE(same_bits(r.grads[1], b_want));
  EXPECT_FALSE(stage.overflow());
}

TEST(GradientStage, OneInfOrNanAnywhereIsAnOverflow) {
  const auto layers = test_layers();
  for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN()}) {
    GradientStage stage(pinned_options());
    auto g0 = grads_of(0, layers[0].numel);
    auto g2 = grads_of(2, layers[2].numel);
    g2[12345] = bad;
    stage.stage(0, adam::GradView::f32(g0));
    EXPECT_FALSE(stage.overflow());
    stage.stage(2, adam::GradView::f32(g2));
    EXPECT_TRUE(stage.overflow()) << bad;
    stage.clear();
    EXPECT_FALSE(stage.overflow());
  }
  // fp16 inf and NaN bits, and the largest finite values, which are not an overflow.
  GradStageOptions o;
  o.layers = {{"h", 2}};
  GradientStage stage(o);
  const std::vector<std::uint16_t> big = {0x7bff, 0xfbff};
  stage.stage(0, adam::GradView::f16(big));
  EXPECT_FALSE(stage.overflow());
  stage.clear();
  const std::vector<std::uint16_t> inf = {0x3c00, 0x7c00};
  stage.stage(0, adam::GradView::f16(inf));
  EXPECT_TRUE(stage.overflow());
  stage.clear();
  const std::vector<std::uint16_t> nan = {0x7e00, 0x3c00};
  stage.stage(0, adam::GradView::f16(nan));
  EXPECT_TRUE(stage.overflow());
}

TEST(GradientStage, NvmeStagingReplaysThroughTheRing) {
  test::TestDir dir;
  const auto layers = test_layers();
  GradientStage stage(nvme_options(dir));
  EXPECT_TRUE(stage.on_nvme());
  EXPECT_EQ(stage.pinned_bytes(), grad_stage_ring_bytes(layers, nvme_options(dir).directories));
  for (int step = 0; step < 2; ++step) {
    std::vector<float> buffer;
    for (std::size_t l = layers.size(); l-- > 0;) {
      buffer = grads_of(l + step, layers[l].numel);
      stage.stage(l, adam::GradView::f32(buffer));
      std::fill(buffer.begin(), buffer.end(), -7.0f);
    }
    const Replayed r = replay_all(stage, layers.size());
    EXPECT_EQ(r.order, (std::vector<std::size_t>{0, 1, 2}));
    for (std::size_t l = 0; l < layers.size(); ++l) {
      EXPECT_TRUE(same_bits(r.grads[l], grads_of(l + step, layers[l].numel))) << l;
    }
    stage.clear();
  }
  EXPECT_GT(stage.bytes_written(), 0u);
  EXPECT_EQ(stage.bytes_read(), stage.bytes_written());
}

TEST(GradientStage, AFailedStagingWriteIsReportedBeforeAnyLayerIsHandedOut) {
  test::TestDir dir;
  GradStageOptions o = nvme_options(dir);
  swap::FaultRule rule;
  rule.op = swap::IoOp::kWrite;
  o.io.faults = std::make_shared<swap::FaultPlan>(std::vector<swap::FaultRule>{rule});
  GradientStage stage(o);
  const auto layers = test_layers();
  for (std::size_t l = 0; l < layers.size(); ++l) {
    const auto g = grads_of(l, layers[l].numel);
    stage.stage(l, adam::GradView::f32(g));  // no throw: the step reports it
  }
  std::size_t handed = 0;
  EXPECT_THROW(
      stage.replay([&](std::size_t, adam::GradView, const std::function<void()>&) { ++handed; }),
      IoError);
  EXPECT_EQ(handed, 0u);
  stage.clear();
  // The next step works (the rule fired once).
  for (std::size_t l = 0; l < layers.size(); ++l) {
    const auto g = grads_of(l, layers[l].numel);
    stage.stage(l, adam::GradView::f32(g));
  }
  const Replayed r = replay_all(stage, layers.size());
  EXPECT_TRUE(same_bits(r.grads[1], grads_of(1, layers[1].numel)));
}

TEST(GradientStage, ARingBufferIsRefilledOnlyAfterItsLayerIsConsumed) {
  // The optimizer's pipeline consumes layers later, on its own thread: replay must wait
  // before reading layer 2 into layer 0's buffer until layer 0 is consumed.
  test::TestDir dir;
  const auto layers = test_layers();
  GradientStage stage(nvme_options(dir));
  for (std::size_t l = 0; l < layers.size(); ++l) {
    const auto g = grads_of(l, layers[l].numel);
    stage.stage(l, adam::GradView::f32(g));
  }
  std::vector<std::function<void()>> pending;
  std::vector<std::vector<float>> seen(layers.size());
  std::atomic<bool> layer0_consumed{false};
  std::thread consumer;
  stage.replay([&](std::size_t l, adam::GradView g, std::function<void()> consumed) {
    const auto* p = static_cast<const float*>(g.data);
    seen[l].assign(p, p + g.size);
    if (l == 0) {
      // Consumed a little later, from another thread, after checking the buffer is intact.
      consumer = std::thread([&, consumed, p, n = g.size] {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        EXPECT_TRUE(same_bits(std::vector<float>(p, p + n), grads_of(0, layers[0].numel)));
        layer0_consumed = true;
        consumed();
      });
    } else {
      if (l == 2) {
        EXPECT_TRUE(layer0_consumed.load());
      }
      consumed();
    }
  });
  consumer.join();
  for (std::size_t l = 0; l < layers.size(); ++l) {
    EXPECT_TRUE(same_bits(seen[l], grads_of(l, layers[l].numel))) << l;
  }
}

TEST(GradientStage, SizeMismatchIsAUsageError) {
  GradientStage stage(pinned_options());
  std::vector<float> g(10);
  EXPECT_THROW(stage.stage(0, adam::GradView::f32(g)), UsageError);
  EXPECT_FALSE(stage.staged(0));
}

}  // namespace
}  // namespace zinf::offload::detail
