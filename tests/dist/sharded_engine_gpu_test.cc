// SPDX-License-Identifier: Apache-2.0
// ShardedEngine over the NCCL adapter on a GPU (label gpu): one rank over one-rank NCCL,
// bitwise the plain OffloadEngine on the same CUDA device, through a checkpoint too; skips
// with the reason where no GPU or no NCCL is present. One rank fetches from its own engine, so
// what crosses NCCL here is the device-staged traffic (gradients' reduce-scatter, failure
// flags, checkpoint agreement, and device gradients reduce-scattered in place); the multi-rank
// device all-gather is sharded_engine_test's, on the host simulation.
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "sharded_engine_checks.h"
#include "support/test_dir.h"
#include "zinf/cuda/communicator.h"
#include "zinf/cuda/device.h"
#include "zinf/dist/nccl_collectives.h"
#include "zinf/dist/sharded_engine.h"

namespace zinf::dist {
namespace {

using offload::OffloadDevice;
using test::ShardedCase;

class ShardedEngineGpu : public ::testing::TestWithParam<ShardedCase> {
 protected:
  void SetUp() override {
    if (std::string why = cuda::nccl_unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
    cuda::CudaAvailability avail = cuda::probe_cuda();
    if (!avail.available()) GTEST_SKIP() << "no CUDA device visible: " << avail.reason;
  }
};

TEST_P(ShardedEngineGpu, OneRankOverNcclIsBitwiseTheOffloadEngine) {
  const ShardedCase c = GetParam();
  for (const bool through_checkpoint : {false, true}) {
    SCOPED_TRACE(through_checkpoint ? "saved and loaded before the last step" : "uninterrupted");
    zinf::test::TestDir dir;
    const test::Trace want = test::reference_trace(c, dir.subdir("reference"));
    std::unique_ptr<cuda::Device> device =
        cuda::make_device(cuda::DeviceOptions{cuda::DeviceKind::kCuda});
    test::RankDevice d(*device);
    cuda::CommunicatorOptions o;
    o.id = cuda::make_communicator_id();
    std::unique_ptr<cuda::Communicator> nccl = cuda::make_nccl_communicator(*device, o);
    // A stream of the adapter's own, not the compute stream: the engine must order the two.
    cuda::Stream collectives_stream = device->create_stream();
    auto comm = make_nccl_collectives(*device, *nccl, collectives_stream);
    test::check_sharded_engine(*comm, d, c, dir.subdir("nvme"), want,
                               through_checkpoint ? dir.file("ckpt") : "");
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, ShardedEngineGpu,
    ::testing::Values(ShardedCase{OffloadDevice::kCpu, OffloadDevice::kCpu, false},
                      ShardedCase{OffloadDevice::kNvme, OffloadDevice::kNvme, true},
                      // Device gradients: fp32 reduce-scattered by NCCL where they are; fp16
                      // widened on the host.
                      ShardedCase{OffloadDevice::kCpu, OffloadDevice::kCpu, false,
                                  test::GradPlace::kDevice, ElementType::kF32},
                      ShardedCase{OffloadDevice::kNvme, OffloadDevice::kNvme, true,
                                  test::GradPlace::kDevice, ElementType::kF16}),
    [](const auto& p) { return test::case_name(p.param); });

}  // namespace
}  // namespace zinf::dist
