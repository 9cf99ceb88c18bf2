// SPDX-License-Identifier: Apache-2.0
// OffloadEngine's staged step mode (clipping, loss scaling, overflow): clipped and loss-scaled
// steps are bitwise the plain kernel's on copies of the state with the same factor, over
// every parameter tier, from fp32, bf16, fp16 and device gradients, with per-layer
// hyper-parameters; an overflow step leaves
// weights, moments, step count and fetched parameters untouched and the next step proceeds;
// the dynamic loss scale moves through steps and checkpoints; a short pinned budget stages on
// NVMe (same result) or names what is missing; on_arrival with clipping is refused.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <algorithm>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "engine_test_util.h"
#include "support/test_dir.h"
#include "zinf/common/error.h"
#include "zinf/offload/testing.h"
#include "zinf/swap/fault_injection.h"

namespace zinf::offload {
namespace {

using test::EngineRig;

// Gradients of a layer in step t, about +-0.05 a element: the global norm (~3.5 over the
// four test layers) is above the clip used below, so clipping engages.
std::vector<float> grads_of(std::size_t layer, std::uint64_t t, std::uint64_t numel) {
  std::vector<float> g(numel);
  for (std::uint64_t i = 0; i < numel; ++i) {
    g[i] =
        (static_cast<float>(test::mix32(t * 7919 + layer * 104729 + i * 31) % 20001u) / 10000.0f -
         1.0f) *
        0.05f;
  }
  return g;
}

EngineConfig staged_config(OffloadDevice param, OffloadDevice opt, const test::TestDir& dir,
                           double clip, double static_scale) {
  EngineConfig c = test::engine_config(param, opt, dir);
  c.gradient_clipping = clip;
  if (static_scale > 0) {
    c.loss_scaling.enabled = true;
    c.loss_scaling.loss_scale = static_scale;
  }
  return c;
}

// The plain kernel on in-memory copies of the state.
struct Reference {
  std::vector<std::vector<float>> p, m, v;
  adam::CpuAdam adam;

  explicit Reference(const std::vector<LayerSpec>& layers) {
    for (std::size_t l = 0; l < layers.size(); ++l) {
      p.push_back(test::initial_weights(l, layers[l].numel));
      m.emplace_back(layers[l].numel, 0.0f);
      v.emplace_back(layers[l].numel, 0.0f);
    }
  }
  void step(adam::AdamParams hp, std::uint64_t t, double factor,
            const std::vector<adam::GradView>& grads) {
    hp.step = t;
    hp.grad_scale *= factor;
    for (std::size_t l = 0; l < grads.size(); ++l) adam.step(hp, p[l], m[l], v[l], grads[l]);
  }
};

// The factor the engine must apply, computed independently (plain double sum in element
// order; the engine sums in lanes, so compare within rounding).
double expected_factor(const std::vector<std::vector<float>>& scaled, double scale, double clip) {
  double sum = 0;
  for (const auto& g : scaled) {
    for (float x : g) sum += static_cast<double>(x) * x;
  }
  const double norm = std::sqrt(sum) / scale;
  const double coefficient = clip > 0 ? std::min(1.0, clip / (norm + 1e-6)) : 1.0;
  return coefficient / scale;
}

// One iteration: forward fetches, backward fetches with the gradients handed in from one
// reused buffer (the staged mode copies them), then step().
StepStats iterate(EngineRig& rig, const std::vector<adam::GradView>& grads) {
  OffloadEngine& e = rig.engine();
  for (std::size_t l = 0; l < e.layer_count(); ++l) (void)rig.fetch_bits(l);
  std::vector<std::byte> reused;
  for (std::size_t l = e.layer_count(); l-- > 0;) {
    (void)rig.fetch_bits(l);
    const std::size_t bytes = grads[l].size * (grads[l].dtype == ElementType::kF32 ? 4 : 2);
    reused.assign(bytes, std::byte{0});
    std::memcpy(reused.data(), grads[l].data, bytes);
    e.set_gradients(l, {reused.data(), grads[l].size, grads[l].dtype});
    std::fill(reused.begin(), reused.end(), std::byte{0xff});  // NaN bits if still read
  }
  return e.step();
}

std::vector<std::vector<std::uint16_t>> all_bits(EngineRig& rig) {
  std::vector<std::vector<std::uint16_t>> out;
  for (std::size_t l = 0; l < rig.engine().layer_count(); ++l) out.push_back(rig.fetch_bits(l));
  return out;
}

std::vector<adam::GradView> views_of(const std::vector<std::vector<float>>& g);
std::vector<std::vector<float>> step_grads(std::uint64_t t);

// (parameter tier, optimizer tier)
using Tiers = std::tuple<OffloadDevice, OffloadDevice>;
class StagedStep : public ::testing::TestWithParam<Tiers> {};

TEST_P(StagedStep, ClippedLossScaledStepsAreThePlainKernelsWithTheSameFactor) {
  const auto [ptier, otier] = GetParam();
  test::TestDir dir;
  EngineRig rig;
  constexpr double kClip = 1.0;
  constexpr double kScale = 1024;  // a power of two: scaling the fp32 gradients is exact
  OffloadEngine& e = rig.make(staged_config(ptier, otier, dir, kClip, kScale));
  EXPECT_EQ(e.step_mode(), StepMode::kStaged);
  EXPECT_EQ(e.loss_scale(), kScale);
  rig.init_weights();
  const auto layers = test::engine_layers();
  Reference ref(layers);
  for (std::uint64_t t = 1; t <= 3; ++t) {
    std::vector<std::vector<float>> scaled;
    std::vector<adam::GradView> views;
    for (std::size_t l = 0; l < layers.size(); ++l) {
      scaled.push_back(grads_of(l, t, layers[l].numel));
      for (float& x : scaled.back()) x *= static_cast<float>(kScale);
    }
    for (const auto& g : scaled) views.push_back(adam::GradView::f32(g));
    const StepStats st = iterate(rig, views);
    EXPECT_FALSE(st.skipped);
    EXPECT_EQ(st.step, t);
    EXPECT_EQ(st.loss_scale, kScale);
    const double want = expected_factor(scaled, kScale, kClip);
    EXPECT_NEAR(st.grad_scale_applied, want, want * 1e-12);
    EXPECT_LT(st.grad_scale_applied, 1.0 / kScale);  // clipping engaged
    EXPECT_NEAR(st.global_grad_norm * st.grad_scale_applied * kScale, kClip, 1e-5);
    ref.step(test::engine_config(ptier, otier, dir).optimizer.hyper, t, st.grad_scale_applied,
             views);
    EXPECT_EQ(test::master_diff(rig.masters(), ref.p), "") << "after step " << t;
  }
  for (std::size_t l = 0; l < layers.size(); ++l) {
    EXPECT_EQ(rig.fetch_bits(l), rig.expected_bits(l)) << "layer " << l;
  }
  EXPECT_EQ(e.stats().steps, 3u);
  EXPECT_EQ(e.stats().skipped_steps, 0u);
}

TEST_P(StagedStep, AnOverflowStepChangesNothingAndTheNextStepProceeds) {
  const auto [ptier, otier] = GetParam();
  test::TestDir dir;
  EngineRig rig;
  OffloadEngine& e = rig.make(staged_config(ptier, otier, dir, 1.0, 0));
  rig.init_weights();
  const auto layers = test::engine_layers();
  const adam::AdamParams hyper = test::engine_config(ptier, otier, dir).optimizer.hyper;
  Reference ref(layers);
  std::uint64_t ref_steps = 0;
  auto run = [&](std::uint64_t t, bool poison) {
    std::vector<std::vector<float>> g;
    std::vector<adam::GradView> views;
    for (std::size_t l = 0; l < layers.size(); ++l) g.push_back(grads_of(l, t, layers[l].numel));
    if (poison) g[2][17] = std::numeric_limits<float>::infinity();
    for (const auto& x : g) views.push_back(adam::GradView::f32(x));
    const StepStats st = iterate(rig, views);
    if (!poison) ref.step(hyper, ++ref_steps, st.grad_scale_applied, views);
    return st;
  };
  (void)run(1, false);
  const auto masters_before = rig.masters();
  const auto bits_before = all_bits(rig);
  const StepStats skipped = run(2, true);
  EXPECT_TRUE(skipped.skipped);
  EXPECT_EQ(skipped.step, 0u);
  EXPECT_TRUE(std::isinf(skipped.global_grad_norm));
  EXPECT_EQ(skipped.grad_scale_applied, 0.0);
  EXPECT_EQ(skipped.elements, 0u);
  EXPECT_EQ(test::master_diff(rig.masters(), masters_before), "");
  EXPECT_EQ(all_bits(rig), bits_before);
  EXPECT_EQ(e.stats().steps, 1u);
  EXPECT_EQ(e.stats().skipped_steps, 1u);
  EXPECT_TRUE(e.stats().last_step.skipped);
  // The next good steps are steps 2 and 3 of the reference: the skipped step moved neither
  // the moments nor the step count (either would change these masters' bits).
  EXPECT_EQ(run(3, false).step, 2u);
  EXPECT_EQ(run(4, false).step, 3u);
  EXPECT_EQ(test::master_diff(rig.masters(), ref.p), "");
  EXPECT_EQ(e.stats().steps, 3u);
}

std::string tiers_name(const ::testing::TestParamInfo<Tiers>& info) {
  return std::string(offload_device_name(std::get<0>(info.param))) + "_params_" +
         std::string(offload_device_name(std::get<1>(info.param))) + "_optimizer";
}

INSTANTIATE_TEST_SUITE_P(Tiers, StagedStep,
                         ::testing::Values(Tiers{OffloadDevice::kNone, OffloadDevice::kCpu},
                                           Tiers{OffloadDevice::kCpu, OffloadDevice::kNvme},
                                           Tiers{OffloadDevice::kNvme, OffloadDevice::kNvme}),
                         tiers_name);

TEST(OffloadEngineStaged, ClippingCombinesWithPerLayerHyperParameters) {
  // A layer without weight decay and with a grad_scale of its own: the step's factor
  // multiplies that layer's grad_scale, and every layer steps with its own set.
  test::TestDir dir;
  auto layers = test::engine_layers();
  const EngineConfig c = staged_config(OffloadDevice::kNone, OffloadDevice::kCpu, dir, 1.0, 0);
  adam::AdamParams own = c.optimizer.hyper;
  own.weight_decay = 0;
  own.grad_scale = 0.25;
  layers[2].hyper = own;
  EngineRig rig;
  OffloadEngine& e = rig.make(c, layers);
  rig.init_weights();
  Reference ref(layers);
  for (std::uint64_t t = 1; t <= 2; ++t) {
    const auto g = step_grads(t);
    const auto views = views_of(g);
    const StepStats st = iterate(rig, views);
    ASSERT_LT(st.grad_scale_applied, 1.0);
    for (std::size_t l = 0; l < layers.size(); ++l) {
      adam::AdamParams hp = l == 2 ? own : c.optimizer.hyper;
      hp.step = t;
      hp.grad_scale *= st.grad_scale_applied;
      ref.adam.step(hp, ref.p[l], ref.m[l], ref.v[l], views[l]);
    }
    EXPECT_EQ(test::master_diff(rig.masters(), ref.p), "") << "step " << t;
  }
  EXPECT_EQ(e.hyper(2).grad_scale, 0.25);  // the factor is the step's only
}

TEST(OffloadEngineStaged, Bf16AndFp16GradientsAreStagedExactly) {
  test::TestDir dir;
  const auto layers = test::engine_layers();
  for (ElementType dtype : {ElementType::kBF16, ElementType::kF16}) {
    EngineRig rig;
    OffloadEngine& e =
        rig.make(staged_config(OffloadDevice::kCpu, OffloadDevice::kCpu, dir, 0.5, 8.0));
    rig.init_weights();
    Reference ref(layers);
    for (std::uint64_t t = 1; t <= 2; ++t) {
      std::vector<std::vector<std::uint16_t>> bits;
      std::vector<adam::GradView> views;
      for (std::size_t l = 0; l < layers.size(); ++l) {
        const auto f = grads_of(l, t, layers[l].numel);
        std::vector<std::uint16_t> b(f.size());
        adam::CpuAdam conv(adam::CpuAdamOptions{.threads = 1});
        std::vector<float> scaled(f);
        for (float& x : scaled) x *= 8.0f;
        conv.copy_out(scaled, {b.data(), b.size(), dtype, true});
        bits.push_back(std::move(b));
      }
      for (const auto& b : bits) views.push_back({b.data(), b.size(), dtype});
      const StepStats st = iterate(rig, views);
      ASSERT_FALSE(st.skipped);
      ref.step(e.hyper(), t, st.grad_scale_applied, views);
      EXPECT_EQ(test::master_diff(rig.masters(), ref.p), "")
          << element_type_name(dtype) << " step " << t;
    }
  }
}

TEST(OffloadEngineStaged, GradientsFromDeviceMemoryAreStagedAsHostOnesAre) {
  // set_gradients(DeviceSpan) in the staged mode: the copy lands in the device-gradient
  // staging, then is staged like host gradients; the result is bitwise the host path's.
  test::TestDir dir;
  std::vector<std::vector<float>> masters[2];
  for (bool device : {false, true}) {
    EngineRig rig;
    OffloadEngine& e =
        rig.make(staged_config(OffloadDevice::kCpu, OffloadDevice::kNvme, dir, 0.05, 0));
    rig.use_device_gradients(device);
    rig.init_weights();
    for (std::uint64_t t = 1; t <= 3; ++t) rig.iteration(t);
    EXPECT_LT(e.stats().last_step.grad_scale_applied, 1.0);  // clipped
    EXPECT_EQ(e.stats().steps, 3u);
    masters[device ? 1 : 0] = rig.masters();
  }
  EXPECT_EQ(test::master_diff(masters[0], masters[1]), "");
}

TEST(OffloadEngineStaged, DynamicLossScaleMovesWithOverflowsAndSurvivesACheckpoint) {
  test::TestDir dir;
  EngineRig rig;
  EngineConfig c = test::engine_config(OffloadDevice::kNone, OffloadDevice::kCpu, dir);
  c.loss_scaling.enabled = true;  // dynamic: loss_scale 0
  c.loss_scaling.initial_scale_power = 10;
  c.loss_scaling.hysteresis = 1;
  c.loss_scaling.loss_scale_window = 2;
  c.loss_scaling.min_loss_scale = 256;
  OffloadEngine& e = rig.make(c);
  EXPECT_EQ(e.step_mode(), StepMode::kStaged);  // auto: fp16 loss scaling
  rig.init_weights();
  const auto layers = test::engine_layers();
  auto run = [&](std::uint64_t t, bool poison) {
    std::vector<std::vector<float>> g;
    std::vector<adam::GradView> views;
    for (std::size_t l = 0; l < layers.size(); ++l) {
      g.push_back(grads_of(l, t, layers[l].numel));
      for (float& x : g.back()) x *= static_cast<float>(e.loss_scale());
    }
    if (poison) g[0][3] = std::numeric_limits<float>::quiet_NaN();
    for (const auto& x : g) views.push_back(adam::GradView::f32(x));
    const double scale = e.loss_scale();
    const StepStats st = iterate(rig, views);
    EXPECT_EQ(st.loss_scale, scale);
    EXPECT_EQ(st.skipped, poison);
    return e.loss_scale();
  };
  EXPECT_EQ(e.loss_scale(), 1024.0);
  EXPECT_EQ(run(1, true), 512.0);  // hysteresis 1: halved at once
  EXPECT_EQ(run(2, true), 256.0);
  EXPECT_EQ(run(3, true), 256.0);  // the floor
  EXPECT_EQ(run(4, false), 256.0);
  EXPECT_EQ(run(5, false), 512.0);  // a window of 2 good steps
  EXPECT_EQ(run(6, false), 512.0);
  EXPECT_EQ(e.stats().skipped_steps, 3u);
  EXPECT_EQ(e.stats().steps, 3u);

  const std::string ckpt = dir.subdir("ckpt");
  e.save(ckpt);
  EXPECT_EQ(run(7, false), 1024.0);
  e.load(ckpt);
  EXPECT_EQ(e.loss_scale(), 512.0);
  EXPECT_EQ(run(7, false), 1024.0);  // one good step into the window, as when saved
  rig.reset();
  EngineRig other;
  OffloadEngine& f = other.make(c);
  f.load(ckpt);
  EXPECT_EQ(f.loss_scale(), 512.0);
}

// The dynamic loss scale is committed with the state it belongs to (inside the optimizer's
// new version): a save that fails on a full drive after the scale moved leaves the previous
// checkpoint whole, and a load gives its scale with its masters, never the newer scale with
// the older masters (the scale once went into a file beside the checkpoint before the state).
TEST(OffloadEngineStaged, TheLossScaleIsCommittedWithItsStateNeverOneSaveApart) {
  test::TestDir dir;
  EngineConfig c = test::engine_config(OffloadDevice::kNone, OffloadDevice::kCpu, dir);
  c.loss_scaling.enabled = true;
  c.loss_scaling.initial_scale_power = 10;
  c.loss_scaling.hysteresis = 1;
  c.loss_scaling.loss_scale_window = 2;
  const auto layers = test::engine_layers();
  auto latest = [](const std::string& ckpt) {
    std::string name;
    std::getline(std::ifstream(ckpt + "/LATEST"), name);
    return name;
  };
  // The writes one save makes (a rule that counts them and fails nothing): the rule below
  // fails the first write of the second save.
  std::uint64_t writes = 0;
  {
    swap::FaultRule count;
    count.kind = swap::FaultKind::kDelay;
    count.op = swap::IoOp::kWrite;
    count.times = ~std::uint64_t{0};
    auto plan = std::make_shared<swap::FaultPlan>(std::vector<swap::FaultRule>{count});
    EngineRig rig;
    rig.make(c, {.param = nullptr, .optimizer = plan});
    rig.init_weights();
    rig.engine().save(dir.subdir("count"));
    writes = plan->fired(0);
  }
  ASSERT_GT(writes, 0u);
  swap::FaultRule full;
  full.kind = swap::FaultKind::kError;
  full.op = swap::IoOp::kWrite;
  full.first_match = writes;
  full.err = ENOSPC;
  auto plan = std::make_shared<swap::FaultPlan>(std::vector<swap::FaultRule>{full});
  EngineRig rig;
  OffloadEngine& e = rig.make(c, {.param = nullptr, .optimizer = plan});
  rig.init_weights();
  auto run = [&](std::uint64_t t, bool poison) {
    std::vector<std::vector<float>> g;
    std::vector<adam::GradView> views;
    for (std::size_t l = 0; l < layers.size(); ++l) {
      g.push_back(grads_of(l, t, layers[l].numel));
      for (float& x : g.back()) x *= static_cast<float>(e.loss_scale());
    }
    if (poison) g[0][3] = std::numeric_limits<float>::quiet_NaN();
    for (const auto& x : g) views.push_back(adam::GradView::f32(x));
    (void)iterate(rig, views);
    return e.loss_scale();
  };
  EXPECT_EQ(run(1, true), 512.0);
  const std::string ckpt = dir.subdir("ckpt");
  e.save(ckpt);
  const auto at_save = rig.masters();
  const std::string version = latest(ckpt);
  EXPECT_TRUE(std::filesystem::is_regular_file(ckpt + "/" + version + "/loss_scale"));
  EXPECT_FALSE(std::filesystem::exists(ckpt + "/zinf-engine-loss-scale"));
  EXPECT_EQ(run(2, false), 512.0);
  EXPECT_EQ(run(3, false), 1024.0);  // a window of 2 good steps
  try {
    e.save(ckpt);
    ADD_FAILURE() << "saved on a full drive";
  } catch (const IoError& err) {
    EXPECT_EQ(err.code(), ErrorCode::kNoSpace) << err.what();
    EXPECT_EQ(std::string(err.what()).rfind("save of checkpoint " + ckpt + ": write failed: ", 0),
              0u)
        << err.what();
  }
  EXPECT_EQ(plan->injected_errors(), 1u);
  EXPECT_EQ(latest(ckpt), version);
  EXPECT_EQ(e.loss_scale(), 1024.0);
  e.load(ckpt);
  EXPECT_EQ(e.loss_scale(), 512.0) << "the scale of the state loaded";
  EXPECT_EQ(test::master_diff(rig.masters(), at_save), "");
}

// Bytes of the smallest budget a refused engine names.
std::uint64_t smallest_budget(const std::string& what) {
  const std::string key = "the smallest budget that works is ";
  const std::size_t at = what.find(key);
  if (at == std::string::npos) return 0;
  return std::stoull(what.substr(at + key.size()));
}

TEST(OffloadEngineStaged, ABudgetTooSmallForPinnedStagingStagesOnNvmeWithTheSameResult) {
  test::TestDir dir;
  const auto layers = test::engine_layers();
  EngineConfig c = staged_config(OffloadDevice::kCpu, OffloadDevice::kNvme, dir, 1.0, 0);
  std::vector<std::vector<float>> pinned_masters;
  {
    EngineRig rig;
    OffloadEngine& e = rig.make(c);
    rig.init_weights();
    for (std::uint64_t t = 1; t <= 2; ++t) {
      std::vector<std::vector<float>> g;
      std::vector<adam::GradView> views;
      for (std::size_t l = 0; l < layers.size(); ++l) g.push_back(grads_of(l, t, layers[l].numel));
      for (const auto& x : g) views.push_back(adam::GradView::f32(x));
      (void)iterate(rig, views);
    }
    EXPECT_EQ(e.stats().staged_grad_bytes_written, 0u);  // 64 MiB: staged in pinned memory
    pinned_masters = rig.masters();
  }
  EngineRig rig;
  c.zinf.pinned_budget_bytes = 1;
  std::uint64_t need = 0;
  try {
    rig.make(c);
    ADD_FAILURE() << "no throw";
  } catch (const UsageError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("the NVMe gradient staging's ring (2 fp32 buffers of the largest "
                        "layer)'s 40960 bytes"),
              std::string::npos)
        << what;
    need = smallest_budget(what);
  }
  ASSERT_GT(need, 0u);
  c.zinf.pinned_budget_bytes = need;  // below what pinned staging (61440 bytes) would add
  OffloadEngine& e = rig.make(c);
  rig.init_weights();
  for (std::uint64_t t = 1; t <= 2; ++t) {
    std::vector<std::vector<float>> g;
    std::vector<adam::GradView> views;
    for (std::size_t l = 0; l < layers.size(); ++l) g.push_back(grads_of(l, t, layers[l].numel));
    for (const auto& x : g) views.push_back(adam::GradView::f32(x));
    (void)iterate(rig, views);
  }
  EXPECT_GT(e.stats().staged_grad_bytes_written, 0u);
  EXPECT_EQ(e.stats().staged_grad_bytes_read, e.stats().staged_grad_bytes_written);
  EXPECT_LE(e.stats().pinned_bytes_peak, need);
  EXPECT_EQ(test::master_diff(rig.masters(), pinned_masters), "");
}

// A config whose budget is the smallest that works, which stages gradients on NVMe.
EngineConfig nvme_staging_config(const test::TestDir& dir) {
  EngineConfig c = staged_config(OffloadDevice::kCpu, OffloadDevice::kNvme, dir, 1.0, 0);
  c.zinf.pinned_budget_bytes = 1;
  try {
    EngineRig rig;
    rig.make(c);
  } catch (const UsageError& e) {
    c.zinf.pinned_budget_bytes = smallest_budget(e.what());
  }
  return c;
}

std::vector<adam::GradView> views_of(const std::vector<std::vector<float>>& g) {
  std::vector<adam::GradView> v;
  for (const auto& x : g) v.push_back(adam::GradView::f32(x));
  return v;
}

std::vector<std::vector<float>> step_grads(std::uint64_t t) {
  std::vector<std::vector<float>> g;
  for (const auto& layer : test::engine_layers()) {
    g.push_back(grads_of(g.size(), t, layer.numel));
  }
  return g;
}

TEST(OffloadEngineStaged, AFailedStagingWriteAbandonsTheStepAndTheEngineStaysUsable) {
  test::TestDir dir;
  EngineConfig c = nvme_staging_config(dir);
  swap::FaultRule rule;
  rule.op = swap::IoOp::kWrite;
  rule.first_match = 1;  // the second layer's staging write
  test_hooks::EngineFaults faults;
  faults.grad_stage = std::make_shared<swap::FaultPlan>(std::vector<swap::FaultRule>{rule});
  EngineRig rig;
  OffloadEngine& e = rig.make(c, faults);
  rig.init_weights();
  const auto before = rig.masters();
  const auto g1 = step_grads(1);
  EXPECT_THROW((void)iterate(rig, views_of(g1)), IoError);
  EXPECT_EQ(faults.grad_stage->injected_errors(), 1u);
  EXPECT_EQ(test::master_diff(rig.masters(), before), "");
  EXPECT_EQ(e.stats().steps, 0u);
  // The step did not happen: the next one is step 1.
  const auto g2 = step_grads(2);
  const StepStats st = iterate(rig, views_of(g2));
  EXPECT_EQ(st.step, 1u);
  Reference ref(test::engine_layers());
  ref.step(e.hyper(), 1, st.grad_scale_applied, views_of(g2));
  EXPECT_EQ(test::master_diff(rig.masters(), ref.p), "");
}

TEST(OffloadEngineStaged, AFailedReadBackOfStagedGradientsFailsTheEngine) {
  test::TestDir dir;
  EngineConfig c = nvme_staging_config(dir);
  swap::FaultRule rule;
  rule.op = swap::IoOp::kRead;
  rule.first_match = 1;  // the second layer's read-back: the first is queued already
  test_hooks::EngineFaults faults;
  faults.grad_stage = std::make_shared<swap::FaultPlan>(std::vector<swap::FaultRule>{rule});
  EngineRig rig;
  OffloadEngine& e = rig.make(c, faults);
  rig.init_weights();
  const auto g1 = step_grads(1);
  EXPECT_THROW((void)iterate(rig, views_of(g1)), IoError);
  EXPECT_THROW((void)e.fetch(0), EngineFailed);
  EXPECT_THROW((void)e.step(), EngineFailed);
}

TEST(OffloadEngineStaged, WithoutAnNvmeDirectoryATooSmallBudgetNamesWhatIsMissing) {
  test::TestDir dir;
  EngineRig rig;
  EngineConfig c = staged_config(OffloadDevice::kCpu, OffloadDevice::kCpu, dir, 1.0, 0);
  c.zinf.pinned_budget_bytes = 1;
  try {
    rig.make(c);
    ADD_FAILURE() << "no throw";
  } catch (const UsageError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(" plus the gradient staging (the whole model's gradients as fp32)'s "
                        "61440 bytes; the smallest budget that works is "),
              std::string::npos)
        << what;
    EXPECT_NE(what.find(" (with an NVMe directory, offload_optimizer or offload_param nvme_path "
                        "or zinf.nvme_paths, the gradients could be staged on NVMe instead "
                        "through a ring of 2 buffers of the largest layer)"),
              std::string::npos)
        << what;
  }
}

TEST(OffloadEngineStaged, OnArrivalWithClippingIsRefusedAndTheDefaultStaysOnArrival) {
  test::TestDir dir;
  EngineRig rig;
  EngineConfig c = test::engine_config(OffloadDevice::kNone, OffloadDevice::kCpu, dir);
  EXPECT_EQ(rig.make(c).step_mode(), StepMode::kOnArrival);
  EXPECT_EQ(rig.engine().loss_scale(), 1.0);
  c.gradient_clipping = 1.0;
  c.zinf.step_mode = StepMode::kOnArrival;
  try {
    rig.make(c);
    ADD_FAILURE() << "no throw";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("zinf.step_mode: \"on_arrival\" updates each layer as "
                                         "its gradients arrive, so it cannot apply "
                                         "gradient_clipping 1"),
              std::string::npos)
        << e.what();
  }
  // Forced staged without clipping or scaling: plain Adam through the staging, the factor 1.
  c.gradient_clipping = 0;
  c.zinf.step_mode = StepMode::kStaged;
  OffloadEngine& e = rig.make(c);
  rig.init_weights();
  const auto layers = test::engine_layers();
  std::vector<std::vector<float>> g;
  std::vector<adam::GradView> views;
  for (std::size_t l = 0; l < layers.size(); ++l) g.push_back(grads_of(l, 1, layers[l].numel));
  for (const auto& x : g) views.push_back(adam::GradView::f32(x));
  const StepStats st = iterate(rig, views);
  EXPECT_EQ(st.grad_scale_applied, 1.0);
  Reference ref(layers);
  ref.step(e.hyper(), 1, 1.0, views);
  EXPECT_EQ(test::master_diff(rig.masters(), ref.p), "");
}

}  // namespace
}  // namespace zinf::offload
