// SPDX-License-Identifier: Apache-2.0
// Communicator: the factory's errors, which hold everywhere (a build without NCCL says so; the
// host simulation is refused), and, built with ZINF_TEST_GPU, one-rank NCCL collectives on a
// real GPU (label gpu; they skip with the runtime's reason where no GPU is visible).
#include "zinf/cuda/communicator.h"

#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "zinf/common/error.h"
#include "zinf/config.h"
#include "zinf/cuda/device.h"

namespace zinf::cuda {
namespace {

#ifndef ZINF_TEST_GPU

TEST(Communicator, FactoryErrorWithoutNcclOrWithoutAGpu) {
  auto host = make_device(DeviceOptions{DeviceKind::kHost});
  CommunicatorOptions options;
#if ZINF_HAVE_NCCL
  EXPECT_EQ(nccl_unavailable_reason(), "");
  try {
    (void)make_nccl_communicator(*host, options);
    ADD_FAILURE() << "no throw";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(), "the NCCL communicator needs a CUDA device; 'host' is not one");
  }
#else
  const std::string why = nccl_unavailable_reason();
  EXPECT_EQ(why.rfind("zinf was built without NCCL", 0), 0u) << why;
  try {
    (void)make_nccl_communicator(*host, options);
    ADD_FAILURE() << "no throw";
  } catch (const DeviceError& e) {
    EXPECT_EQ(std::string(e.what()), "cannot create an NCCL communicator: " + why);
  }
  EXPECT_THROW((void)make_communicator_id(), DeviceError);
#endif
}

TEST(Communicator, ElementSizes) {
  EXPECT_EQ(element_size(ElementType::kF32), 4u);
  EXPECT_EQ(element_size(ElementType::kF16), 2u);
  EXPECT_EQ(element_size(ElementType::kBF16), 2u);
  EXPECT_EQ(element_size(ElementType::kU8), 1u);
  EXPECT_EQ(element_size(ElementType::kF64), 8u);
  EXPECT_EQ(element_size(ElementType::kI32), 4u);
  EXPECT_EQ(element_size(ElementType::kI64), 8u);
}

#else  // ZINF_TEST_GPU

class CommunicatorGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string why = nccl_unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
    CudaAvailability cuda = probe_cuda();
    if (!cuda.available()) GTEST_SKIP() << "no CUDA device visible: " << cuda.reason;
    device_ = make_device(DeviceOptions{DeviceKind::kCuda});
    stream_ = device_->create_stream();
    CommunicatorOptions o;
    o.id = make_communicator_id();
    comm_ = make_nccl_communicator(*device_, o);
  }
  void TearDown() override {
    comm_.reset();
    stream_ = Stream();
    device_.reset();
  }

  std::unique_ptr<Device> device_;
  Stream stream_;
  std::unique_ptr<Communicator> comm_;
};

TEST_F(CommunicatorGpu, OneRankAllGatherCopiesTheShard) {
  EXPECT_EQ(comm_->name(), "nccl");
  EXPECT_EQ(comm_->world_size(), 1);
  const std::size_t n = 1 << 20;
  std::vector<std::byte> host(n), back(n);
  for (std::size_t i = 0; i < n; ++i) host[i] = static_cast<std::byte>(i * 7 + 3);
  DeviceBuffer send = device_->allocate(n), recv = device_->allocate(n);
  device_->copy_to_device(stream_, send.span(), host);
  comm_->all_gather(stream_, send.span(), recv.span());
  device_->copy_to_host(stream_, back, recv.span());
  device_->synchronize(stream_);
  EXPECT_EQ(std::memcmp(host.data(), back.data(), n), 0);
}

TEST_F(CommunicatorGpu, OneRankReduceScatterSumAndAverageAreIdentity) {
  const std::size_t count = 1 << 16;
  std::vector<float> host(count), back(count);
  for (std::size_t i = 0; i < count; ++i) host[i] = static_cast<float>(i) * 0.5f - 100.0f;
  const std::size_t bytes = count * sizeof(float);
  DeviceBuffer send = device_->allocate(bytes), recv = device_->allocate(bytes);
  device_->copy_to_device(stream_, send.span(), std::as_bytes(std::span<const float>(host)));
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
    comm_->reduce_scatter(stream_, send.span(), recv.span(), ElementType::kF32, op);
    device_->copy_to_host(stream_, std::as_writable_bytes(std::span<float>(back)), recv.span());
    device_->synchronize(stream_);
    EXPECT_EQ(std::memcmp(host.data(), back.data(), bytes), 0);
  }
}

TEST_F(CommunicatorGpu, OneRankAllReduceAndBroadcastLeaveTheDataAsItIs) {
  const std::size_t count = 4099;
  std::vector<double> host(count), back(count);
  for (std::size_t i = 0; i < count; ++i) host[i] = static_cast<double>(i) - 7.0;
  const std::size_t bytes = count * sizeof(double);
  DeviceBuffer data = device_->allocate(bytes);
  device_->copy_to_device(stream_, data.span(), std::as_bytes(std::span<const double>(host)));
  comm_->all_reduce(stream_, data.span(), ElementType::kF64, ReduceOp::kSum);
  comm_->all_reduce(stream_, data.span(), ElementType::kF64, ReduceOp::kMax);
  comm_->broadcast(stream_, data.span(), 0);
  device_->copy_to_host(stream_, std::as_writable_bytes(std::span<double>(back)), data.span());
  device_->synchronize(stream_);
  EXPECT_EQ(std::memcmp(host.data(), back.data(), bytes), 0);
  EXPECT_THROW(comm_->broadcast(stream_, data.span(), 1), UsageError);
  EXPECT_THROW(comm_->all_reduce(stream_, data.span(0, 12), ElementType::kF64, ReduceOp::kSum),
               UsageError);
}

TEST_F(CommunicatorGpu, RefusesMismatchedSizes) {
  DeviceBuffer a = device_->allocate(4096), b = device_->allocate(8192);
  EXPECT_THROW(comm_->all_gather(stream_, a.span(), b.span()), UsageError);
  EXPECT_THROW(
      comm_->reduce_scatter(stream_, a.span(), a.span(0, 4095), ElementType::kF32, ReduceOp::kSum),
      UsageError);
}

#endif  // ZINF_TEST_GPU

}  // namespace
}  // namespace zinf::cuda
