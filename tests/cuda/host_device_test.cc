// SPDX-License-Identifier: Apache-2.0
// HostDevice behaviour beyond the Device contract: simulated memory capacity, the shared
// bandwidth lanes, device memory being host memory, and logging of unreported failures.
#include <chrono>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "device_test_util.h"
#include "support/pattern.h"
#include "support/self_exec.h"
#include "zinf/common/error.h"
#include "zinf/cuda/device.h"
#include "zinf/cuda/testing.h"

namespace zinf::cuda {
namespace {

using test::check_pattern;
using test::fill_pattern;
using test::LogCapture;
using test::PageBuffer;

std::unique_ptr<Device> host_device(double gbps = 0, std::uint64_t memory = 0) {
  DeviceOptions o;
  o.kind = DeviceKind::kHost;
  o.host_copy_bandwidth_gbps = gbps;
  o.host_memory_bytes = memory;
  return make_device(o);
}

TEST(HostDevice, CapacityRefusesAllocationAndRollsBack) {
  auto device = host_device(0, 8192);
  DeviceBuffer a = device->allocate(6144);
  try {
    DeviceBuffer b = device->allocate(4096);
    FAIL() << "allocation past the capacity succeeded";
  } catch (const DeviceError& e) {
    EXPECT_STREQ(e.what(),
                 "allocate on host: 4096 bytes do not fit in device memory (capacity 8192 bytes, "
                 "6144 allocated)");
  }
  DeviceStats st = device->stats();
  EXPECT_EQ(st.capacity_bytes, 8192u);
  EXPECT_EQ(st.allocated_bytes, 6144u);
  EXPECT_EQ(st.live_allocations, 1u);
  DeviceBuffer c = device->allocate(2048);  // exactly fills it
  EXPECT_EQ(device->stats().allocated_bytes, 8192u);
  EXPECT_THROW((void)device->allocate(1), DeviceError);
  a.reset();
  DeviceBuffer d = device->allocate(6144);
  EXPECT_EQ(device->stats().peak_allocated_bytes, 8192u);
}

TEST(HostDevice, DeviceMemoryIsHostMemory) {
  auto device = host_device();
  constexpr std::size_t kSize = 10000;
  DeviceBuffer buf = device->allocate(kSize);
  PageBuffer in(kSize);
  fill_pattern(in, 2, 0, 3);
  Stream s = device->create_stream();
  device->copy_to_device(s, buf.span(), in);
  device->synchronize(s);
  EXPECT_EQ(check_pattern({buf.data(), kSize}, 2, 0, 3), "");
}

// Device memory is host memory, yet the device knows its own: a buffer's bytes are its, a host
// buffer's and a freed buffer's are not, and a range may not run past its buffer.
TEST(HostDevice, OwnsItsAllocationsOnly) {
  auto device = host_device();
  DeviceBuffer buf = device->allocate(4096);
  EXPECT_TRUE(test_hooks::host_device_owns(*device, buf.data(), 4096));
  EXPECT_TRUE(test_hooks::host_device_owns(*device, buf.data() + 4000, 96));
  EXPECT_FALSE(test_hooks::host_device_owns(*device, buf.data() + 4000, 97));
  PageBuffer host(4096);
  EXPECT_FALSE(test_hooks::host_device_owns(*device, host.data(), 1));
  const std::byte* freed = buf.data();
  buf.reset();
  EXPECT_FALSE(test_hooks::host_device_owns(*device, freed, 1));
}

// The cap is a host-simulation feature (it models PCIe); a CUDA device has no such option.
TEST(HostDevice, BandwidthCapBoundsCopyTime) {
  constexpr double kGbps = 4.0;
  std::unique_ptr<Device> device = host_device(kGbps);
  constexpr std::size_t kSize = 8u << 20;
  DeviceBuffer buf = device->allocate(kSize);
  PageBuffer in(kSize);
  fill_pattern(in, 1, 0, 1);
  PageBuffer out(kSize);
  Stream s = device->create_stream();
  const double minimum_s = static_cast<double>(kSize) / (kGbps * 1e9);
  for (bool to_device : {true, false}) {
    auto start = std::chrono::steady_clock::now();
    if (to_device) {
      device->copy_to_device(s, buf.span(), in);
    } else {
      device->copy_to_host(s, out, buf.span());
    }
    device->synchronize(s);
    std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    EXPECT_GE(took.count(), minimum_s) << (to_device ? "to device" : "to host");
  }
  EXPECT_EQ(check_pattern(out, 1, 0, 1), "");
}

TEST(HostDevice, StreamsShareTheBandwidthOfOneDirection) {
  // Two streams copy 4 MiB each to the device at once over a 1 GB/s lane: together they take at
  // least 8 MiB / 1 GB/s, as on one PCIe link (a lower bound only: not a timing test).
  constexpr double kGbps = 1.0;
  constexpr std::size_t kSize = 4u << 20;
  auto device = host_device(kGbps);
  DeviceBuffer a = device->allocate(kSize);
  DeviceBuffer b = device->allocate(kSize);
  PageBuffer in(kSize);
  Stream s1 = device->create_stream();
  Stream s2 = device->create_stream();
  auto start = std::chrono::steady_clock::now();
  device->copy_to_device(s1, a.span(), in);
  device->copy_to_device(s2, b.span(), in);
  device->synchronize(s1);
  device->synchronize(s2);
  std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
  EXPECT_GE(took.count(), 2.0 * kSize / (kGbps * 1e9));
}

TEST(HostDevice, UnreportedFailureIsLoggedWhenTheStreamGoes) {
  auto device = host_device();
  LogCapture logs(LogLevel::kWarning);
  std::uint64_t id = 0;
  {
    Stream s = device->create_stream();
    id = s.id();
    device->enqueue_host_work(s, [] { throw std::runtime_error("lost"); });
  }
  ASSERT_EQ(logs.lines().size(), 1u);
  EXPECT_EQ(logs.lines()[0], "warning: stream " + std::to_string(id) +
                                 " destroyed after a failure no synchronize() reported: host "
                                 "work on stream " +
                                 std::to_string(id) + " failed: engine=host: lost");
}

TEST(HostDevice, ReportedFailureIsNotLoggedAgain) {
  auto device = host_device();
  LogCapture logs(LogLevel::kWarning);
  {
    Stream s = device->create_stream();
    device->enqueue_host_work(s, [] { throw 42; });
    try {
      device->synchronize(s);
      FAIL() << "no error";
    } catch (const DeviceError& e) {
      EXPECT_EQ(std::string(e.what()), "host work on stream " + std::to_string(s.id()) +
                                           " failed: engine=host: unknown exception");
    }
  }
  EXPECT_TRUE(logs.lines().empty());
}

TEST(HostDevice, RejectsBadOptions) {
  DeviceOptions o;
  o.kind = DeviceKind::kHost;
  o.host_copy_bandwidth_gbps = -1;
  try {
    (void)make_device(o);
    FAIL() << "negative bandwidth accepted";
  } catch (const UsageError& e) {
    EXPECT_STREQ(
        e.what(),
        "make_device: host_copy_bandwidth_gbps must be >= 0 (0 = uncapped), got -1.000000");
  }
  o.host_copy_bandwidth_gbps = std::numeric_limits<double>::quiet_NaN();
  EXPECT_THROW((void)make_device(o), UsageError);
  o.host_copy_bandwidth_gbps = 0;
  o.device_index = -1;
  try {
    (void)make_device(o);
    FAIL() << "negative device index accepted";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(), "make_device: device_index must be >= 0, got -1");
  }
}

TEST(HostDevice, FailedStreamSkipsLaterCopies) {
  // After a failure nothing more lands in device memory from that stream.
  auto device = host_device();
  DeviceBuffer buf = device->allocate(4096);
  PageBuffer zeros(4096), data(4096);
  fill_pattern(data, 1, 0, 1);
  Stream s = device->create_stream();
  device->copy_to_device(s, buf.span(), zeros);
  device->enqueue_host_work(s, [] { throw std::runtime_error("stop"); });
  device->copy_to_device(s, buf.span(), data);
  EXPECT_THROW(device->synchronize(s), DeviceError);
  for (std::size_t i = 0; i < buf.size(); ++i) ASSERT_EQ(buf.data()[i], std::byte{0}) << i;
}

TEST(HostDeviceDeathTest, OwnerOutlivingItsDeviceAborts) {
  // A buffer or stream that outlives its Device would free into a dead object: that is a bug,
  // caught by ZINF_CHECK in every build type.
  zinf::test::prefer_threadsafe_death_tests();
  EXPECT_DEATH(
      {
        auto device = host_device();
        DeviceBuffer buf = device->allocate(64);
        device.reset();
      },
      "must die before its Device");
  EXPECT_DEATH(
      {
        auto device = host_device();
        Stream s = device->create_stream();
        device.reset();
      },
      "host destroyed while 0 buffer\\(s\\), 1 stream\\(s\\) and 0 pinned registration\\(s\\) "
      "still live");
}

}  // namespace
}  // namespace zinf::cuda
