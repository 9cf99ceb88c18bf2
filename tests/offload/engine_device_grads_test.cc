// SPDX-License-Identifier: Apache-2.0
// OffloadEngine::set_gradients from device memory, on the HostDevice: the weights are bitwise
// those of host gradients for every parameter tier, the call returns while the compute that
// writes the gradients is still running (and the copy waits for it), a single staging buffer
// is enough (set_gradients waits for it), the staging is counted in the pinned budget, misuse
// is refused with its exact text, and a failed copy fails the step without touching the state.
#include <chrono>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engine_test_util.h"
#include "zinf/common/error.h"
#include "zinf/offload/config.h"
#include "zinf/offload/engine.h"

namespace zinf::offload {
namespace {

using test::EngineRig;
using test::master_diff;

std::vector<std::vector<float>> train(OffloadDevice param, bool device_grads,
                                      std::uint32_t staging = 2,
                                      cuda::DeviceKind kind = cuda::DeviceKind::kHost) {
  test::TestDir dir;
  EngineRig rig(kind);
  EngineConfig c = test::engine_config(param, OffloadDevice::kCpu, dir);
  c.zinf.grad_staging_buffers = staging;
  rig.make(c);
  rig.init_weights();
  rig.use_device_gradients(device_grads);
  for (std::uint64_t t = 1; t <= 3; ++t) rig.iteration(t);
  const EngineStats st = rig.engine().stats();
  if (device_grads) {
    std::uint64_t bytes = 0;
    for (const auto& l : test::engine_layers()) bytes += l.numel * 4;
    EXPECT_EQ(st.grad_bytes_to_host, 3 * bytes);
  } else {
    EXPECT_EQ(st.grad_bytes_to_host, 0u);
  }
  EXPECT_LE(st.pinned_bytes_peak, c.zinf.pinned_budget_bytes);
  return rig.masters();
}

class DeviceGradients : public ::testing::TestWithParam<OffloadDevice> {};

TEST_P(DeviceGradients, GiveBitwiseTheWeightsOfHostGradients) {
  const auto host = train(GetParam(), false);
  EXPECT_EQ(master_diff(train(GetParam(), true), host), "");
  // One staging buffer: every set_gradients after the first waits for the optimizer to have
  // read the previous layer's gradients.
  EXPECT_EQ(master_diff(train(GetParam(), true, /*staging=*/1), host), "");
}

// The same on a GPU: real device-to-host copies on a CUDA stream into registered memory.
TEST_P(DeviceGradients, OnCudaGiveBitwiseTheWeightsOfHostGradients) {
  const cuda::CudaAvailability cuda_ok = cuda::probe_cuda();
  if (!cuda_ok.available()) GTEST_SKIP() << "no CUDA device: " << cuda_ok.reason;
  const auto host = train(GetParam(), false, 2, cuda::DeviceKind::kCuda);
  EXPECT_EQ(master_diff(train(GetParam(), true, 2, cuda::DeviceKind::kCuda), host), "");
}

INSTANTIATE_TEST_SUITE_P(ParamTiers, DeviceGradients,
                         ::testing::Values(OffloadDevice::kNone, OffloadDevice::kCpu,
                                           OffloadDevice::kNvme),
                         [](const ::testing::TestParamInfo<OffloadDevice>& tier) {
                           return std::string(offload_device_name(tier.param));
                         });

// The gradients are written by compute still running when set_gradients returns: the call does
// not block on it, and the copy waits for it (else the update would read the stale zeros).
TEST(DeviceGradients, SetGradientsReturnsWhileTheComputeWritingThemRuns) {
  test::TestDir dir;
  EngineRig rig;
  rig.make(test::engine_config(OffloadDevice::kCpu, OffloadDevice::kCpu, dir));
  rig.init_weights();
  cuda::Device& dev = rig.device();
  const std::size_t n = rig.engine().layer(0).numel;
  std::vector<float> g(n);
  for (std::size_t i = 0; i < n; ++i) g[i] = 1e-3f * static_cast<float>(i % 7) - 2e-3f;
  cuda::DeviceBuffer d = dev.allocate(n * sizeof(float));
  // The host side of an asynchronous copy must live until the copy has run.
  const std::vector<float> zeros(n, 0.0f);
  dev.copy_to_device(rig.compute(), d.span(), std::as_bytes(std::span<const float>(zeros)));
  dev.synchronize(rig.compute());
  // "Backward": 2 s of compute (far more than set_gradients takes, sanitizers included), then
  // the gradients land in device memory (host memory on the HostDevice, so host work on the
  // stream can write them).
  std::byte* target = d.data();
  dev.enqueue_busy(rig.compute(), std::chrono::milliseconds(2000));
  dev.enqueue_host_work(rig.compute(), [target, &g] { std::memcpy(target, g.data(), g.size() * 4); });
  cuda::Event after = dev.create_event();
  dev.record(after, rig.compute());

  rig.engine().set_gradients(0, d.span(), ElementType::kF32);
  EXPECT_FALSE(after.query()) << "set_gradients waited for the compute stream";
  (void)rig.engine().step();

  // The same step from host gradients, in a second engine.
  test::TestDir dir2;
  EngineRig ref;
  ref.make(test::engine_config(OffloadDevice::kCpu, OffloadDevice::kCpu, dir2));
  ref.init_weights();
  ref.engine().set_gradients(0, adam::GradView::f32(g));
  (void)ref.engine().step();
  EXPECT_EQ(master_diff(rig.masters(), ref.masters()), "");
}

TEST(DeviceGradients, StagingIsCountedInThePinnedBudgetAndNamedInItsError) {
  test::TestDir dir;
  EngineRig rig;
  EngineConfig c = test::engine_config(OffloadDevice::kNvme, OffloadDevice::kCpu, dir);
  c.offload_optimizer.buffer_count = 4;
  c.zinf.prefetch_depth = 2;
  c.zinf.grad_staging_buffers = 2;
  c.zinf.pinned_budget_bytes = 1000;
  const std::vector<LayerSpec> one = {{"w", 2048, ElementType::kBF16}};
  // As PinnedBudgetTooSmallNamesTheSmallestThatWorks (40960 + 16384), plus 2 x 2048 x 4 bytes.
  try {
    rig.make(c, one);
    ADD_FAILURE() << "no throw";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(),
                 "OffloadEngine: zinf.pinned_budget_bytes 1000 cannot hold the optimizer's "
                 "40960 bytes plus the parameter staging's 16384 bytes plus the device-gradient "
                 "staging's 16384 bytes (zinf.grad_staging_buffers 2 x the largest layer's fp32 "
                 "gradients; 0 if gradients always come from host memory); the smallest budget "
                 "that works is 73728");
  }
  c.zinf.pinned_budget_bytes = 73728;
  rig.make(c, one);
  // Allocated at the first device-gradient call, not before.
  EXPECT_EQ(rig.engine().stats().pinned_bytes, 57344u);
  std::vector<float> w(2048, 0.5f);
  rig.engine().set_master_weights(0, w);
  cuda::DeviceBuffer d = rig.device().allocate(2048 * 4);
  const std::vector<float> ones(2048, 1.0f);  // alive until step() has read the copy
  rig.device().copy_to_device(rig.compute(), d.span(), std::as_bytes(std::span<const float>(ones)));
  rig.engine().set_gradients(0, d.span(), ElementType::kF32);
  (void)rig.engine().step();
  EXPECT_EQ(rig.engine().stats().pinned_bytes, 73728u);
  EXPECT_EQ(rig.engine().stats().pinned_bytes_peak, 73728u);
}

TEST(DeviceGradients, MisuseIsRefusedWithItsText) {
  test::TestDir dir;
  EngineRig rig;
  EngineConfig c = test::engine_config(OffloadDevice::kCpu, OffloadDevice::kCpu, dir);
  rig.make(c);
  rig.init_weights();
  OffloadEngine& e = rig.engine();
  cuda::DeviceBuffer d = rig.device().allocate(5000 * 4);
  auto text = [](auto&& f) {
    try {
      f();
    } catch (const UsageError& err) {
      return std::string(err.what());
    }
    return std::string("no UsageError");
  };
  EXPECT_EQ(text([&] { e.set_gradients(0, d.span(0, 4999 * 4), ElementType::kF32); }),
            "OffloadEngine::set_gradients: layer 'l0' has 5000 elements, got 4999 gradients in "
            "device memory");
  EXPECT_EQ(text([&] { e.set_gradients(0, d.span(0, 5000 * 2 + 1), ElementType::kBF16); }),
            "OffloadEngine::set_gradients: layer 'l0' has 5000 elements, got 10001 bytes of bf16 "
            "gradients in device memory");
  {
    cuda::DeviceOptions o;
    o.kind = cuda::DeviceKind::kHost;
    auto other = cuda::make_device(o);
    cuda::DeviceBuffer foreign = other->allocate(5000 * 4);
    EXPECT_EQ(text([&] { e.set_gradients(0, foreign.span(), ElementType::kF32); }),
              "OffloadEngine::set_gradients: layer 'l0': the gradients are not in the memory of "
              "device host");
  }
  // Nothing was queued by the refusals: a normal step works.
  e.set_gradients(0, d.span(), ElementType::kF32);
  (void)e.step();
  EXPECT_EQ(e.stats().steps, 1u);

  c.zinf.grad_staging_buffers = 0;
  rig.make(c);
  rig.init_weights();
  EXPECT_EQ(text([&] { rig.engine().set_gradients(0, d.span(), ElementType::kF32); }),
            "OffloadEngine::set_gradients: gradients in device memory need "
            "zinf.grad_staging_buffers >= 1 (it is 0: host gradients only)");
}

// The compute stream fails before the gradients are written: the copy that waits for it fails,
// and the step fails as a failed read does. Nothing was updated: the masters are as before and
// the step count did not move.
TEST(DeviceGradients, AFailedCopyFailsTheStepAndLeavesTheStateAsItWas) {
  test::TestDir dir;
  EngineRig rig;
  rig.make(test::engine_config(OffloadDevice::kCpu, OffloadDevice::kCpu, dir));
  rig.init_weights();
  const auto before = rig.masters();
  cuda::Device& dev = rig.device();
  cuda::Stream bad = dev.create_stream();
  cuda::DeviceBuffer d = dev.allocate(5000 * 4);
  dev.enqueue_host_work(bad, [] { throw std::runtime_error("backward kernel failed"); });
  // The engine's compute stream is the rig's; make it wait on the failed stream's work.
  cuda::Event failed = dev.create_event();
  dev.record(failed, bad);
  dev.wait(rig.compute(), failed);
  rig.engine().set_gradients(0, d.span(), ElementType::kF32);
  try {
    (void)rig.engine().step();
    ADD_FAILURE() << "no throw";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("backward kernel failed"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(rig.engine().stats().steps, 0u);
  EXPECT_EQ(master_diff(rig.masters(), before), "");
}

}  // namespace
}  // namespace zinf::offload
