// SPDX-License-Identifier: Apache-2.0
// make_device: the kinds, the kAuto probe and its one-line fallback notice, and the error for
// an explicit CUDA request without a device. Valid with and without a GPU.
#include "zinf/cuda/device.h"

#include <string>

#include <gtest/gtest.h>

#include "device_test_util.h"
#include "zinf/common/error.h"
#include "zinf/config.h"

namespace zinf::cuda {
namespace {

using test::LogCapture;

TEST(MakeDevice, HostIsQuietAndHost) {
  LogCapture logs(LogLevel::kDebug);
  auto device = make_device(DeviceOptions{DeviceKind::kHost});
  EXPECT_EQ(device->kind(), DeviceKind::kHost);
  EXPECT_EQ(device->name(), "host");
  EXPECT_TRUE(logs.lines().empty());
}

TEST(MakeDevice, ProbeGivesAReasonWhenNoDeviceIsVisible) {
  CudaAvailability cuda = probe_cuda();
  if (cuda.available()) {
    EXPECT_GT(cuda.device_count, 0);
    EXPECT_EQ(cuda.reason, "");
    return;
  }
  EXPECT_EQ(cuda.device_count, 0);
#if ZINF_HAVE_CUDA
  // No driver: cudaErrorInsufficientDriver; driver but no GPU: cudaErrorNoDevice.
  EXPECT_EQ(cuda.reason.rfind("cudaGetDeviceCount: cudaError", 0), 0u) << cuda.reason;
#else
  EXPECT_EQ(cuda.reason, "zinf was built without CUDA");
#endif
  EXPECT_EQ(probe_cuda().reason, cuda.reason) << "probing again gives the same answer";
}

TEST(MakeDevice, AutoPrefersCudaElseFallsBackWithOneNotice) {
  CudaAvailability cuda = probe_cuda();
  LogCapture logs(LogLevel::kDebug);
  auto device = make_device(DeviceOptions{DeviceKind::kAuto});
  if (cuda.available()) {
    EXPECT_EQ(device->kind(), DeviceKind::kCuda);
    EXPECT_EQ(device->name(), "cuda:0");
    EXPECT_TRUE(logs.lines().empty());
    return;
  }
  EXPECT_EQ(device->kind(), DeviceKind::kHost);
  ASSERT_EQ(logs.lines().size(), 1u);
  EXPECT_EQ(logs.lines()[0],
            "notice: no CUDA device visible (" + cuda.reason + "); using host simulation");
}

TEST(MakeDevice, ExplicitCudaWithoutDeviceThrowsTheReason) {
  CudaAvailability cuda = probe_cuda();
  if (cuda.available()) GTEST_SKIP() << "a CUDA device is visible; the error path needs none";
  try {
    (void)make_device(DeviceOptions{DeviceKind::kCuda});
    FAIL() << "kCuda succeeded without a device";
  } catch (const DeviceError& e) {
    EXPECT_EQ(std::string(e.what()),
              "CUDA device requested but none is visible (" + cuda.reason + ")");
  }
}

TEST(MakeDevice, DeviceIndexPastTheVisibleDevicesIsUsageError) {
  CudaAvailability cuda = probe_cuda();
  if (!cuda.available()) GTEST_SKIP() << "no CUDA device visible: " << cuda.reason;
  DeviceOptions o{DeviceKind::kCuda};
  o.device_index = cuda.device_count;
  try {
    (void)make_device(o);
    FAIL() << "device index accepted";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()),
              "make_device: device_index " + std::to_string(cuda.device_count) + " but only " +
                  std::to_string(cuda.device_count) + " CUDA device(s) are visible");
  }
}

TEST(MakeDevice, ParsesKinds) {
  EXPECT_EQ(parse_device_kind("auto"), DeviceKind::kAuto);
  EXPECT_EQ(parse_device_kind("cuda"), DeviceKind::kCuda);
  EXPECT_EQ(parse_device_kind("host"), DeviceKind::kHost);
  for (DeviceKind k : {DeviceKind::kAuto, DeviceKind::kCuda, DeviceKind::kHost}) {
    EXPECT_EQ(parse_device_kind(device_kind_name(k)), k);
  }
  try {
    (void)parse_device_kind("gpu");
    FAIL() << "'gpu' accepted";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(), "unknown device kind 'gpu' (expected auto, cuda or host)");
  }
}

}  // namespace
}  // namespace zinf::cuda
