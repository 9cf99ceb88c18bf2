// SPDX-License-Identifier: Apache-2.0
// The NCCL adapter. Everywhere (label unit): over a one-rank stand-in Communicator on the host
// simulation, whose device memory is host memory, so the shared exact checks run unchanged; a
// stream held back by a gate must time out within bounds and fail the adapter. Built with
// ZINF_TEST_GPU (label gpu): over one-rank NCCL on a real GPU, skipping with the reason where no
// GPU or no NCCL is present.
#include "zinf/dist/nccl_collectives.h"

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cuda/device_test_util.h"
#include "collectives_checks.h"
#include "zinf/common/error.h"
#include "zinf/cuda/communicator.h"
#include "zinf/cuda/device.h"

namespace zinf::dist {
namespace {

#ifndef ZINF_TEST_GPU

// One rank: every collective is a copy (or nothing), done as host work on the stream so that it
// is ordered like the real thing and a gated stream holds it back.
class OneRankCommunicator final : public cuda::Communicator {
 public:
  explicit OneRankCommunicator(cuda::Device& device) : device_(device) {}
  std::string_view name() const noexcept override { return "nccl"; }
  int rank() const noexcept override { return 0; }
  int world_size() const noexcept override { return 1; }
  void all_gather(cuda::StreamRef s, cuda::DeviceSpan send, cuda::DeviceSpan recv) override {
    copy(s, send, recv);
  }
  void reduce_scatter(cuda::StreamRef s, cuda::DeviceSpan send, cuda::DeviceSpan recv,
                      cuda::ElementType, cuda::ReduceOp) override {
    copy(s, send, recv);
  }
  void all_reduce(cuda::StreamRef s, cuda::DeviceSpan, cuda::ElementType, cuda::ReduceOp) override {
    ++calls;
    device_.enqueue_host_work(s, [] {});
  }
  void broadcast(cuda::StreamRef s, cuda::DeviceSpan, int) override {
    ++calls;
    device_.enqueue_host_work(s, [] {});
  }
  int calls = 0;

 private:
  void copy(cuda::StreamRef s, cuda::DeviceSpan from, cuda::DeviceSpan to) {
    ++calls;
    device_.enqueue_host_work(s, [from, to] {
      if (from.size() != 0 && from.data() != to.data()) {
        std::memcpy(to.data(), from.data(), from.size());
      }
    });
  }
  cuda::Device& device_;
};

class NcclCollectivesHost : public ::testing::Test {
 protected:
  std::unique_ptr<cuda::Device> device_ =
      cuda::make_device(cuda::DeviceOptions{cuda::DeviceKind::kHost});
  cuda::Stream stream_ = device_->create_stream();
  OneRankCommunicator comm_{*device_};
};

TEST_F(NcclCollectivesHost, EveryCollectiveIsExactOnOneRank) {
  auto c = make_nccl_collectives(*device_, comm_, stream_);
  EXPECT_EQ(c->name(), "nccl");
  EXPECT_EQ(c->memory(), MemoryKind::kDevice);
  EXPECT_EQ(c->size(), 1);
  test::check_all_gather(*c);
  test::check_reduce_scatter(*c);
  test::check_all_reduce(*c);
  test::check_broadcast(*c);
  test::check_misuse(*c);
  const int before = comm_.calls;
  c->barrier();
  EXPECT_EQ(comm_.calls, before + 1) << "a barrier is one all-reduce";
}

TEST_F(NcclCollectivesHost, AHeldStreamTimesOutAndFailsTheAdapter) {
  NcclCollectivesOptions o;
  o.timeout = std::chrono::milliseconds(200);
  auto c = make_nccl_collectives(*device_, comm_, stream_, o);
  zinf::test::Gate gate;
  device_->enqueue_host_work(stream_, gate.waiter());
  std::vector<float> data(7);
  const auto start = std::chrono::steady_clock::now();
  try {
    all_reduce<float>(*c, data, ReduceOp::kMax);
    ADD_FAILURE() << "no throw";
  } catch (const CollectiveError& e) {
    EXPECT_EQ(e.code(), ErrorCode::kTimedOut);
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("all_reduce failed: length=28 engine=nccl: rank 0 of 1: timed out after "
                         "200 ms",
                         0),
              0u)
        << what;
  }
  const auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_GE(waited, std::chrono::milliseconds(200));
  EXPECT_LT(waited, std::chrono::seconds(10));
  EXPECT_THROW(c->barrier(), EngineFailed);
  gate.open();
  device_->synchronize(stream_);
}

TEST_F(NcclCollectivesHost, RefusesAStreamOfAnotherDeviceAndABadTimeout) {
  auto other = cuda::make_device(cuda::DeviceOptions{cuda::DeviceKind::kHost});
  cuda::Stream foreign = other->create_stream();
  EXPECT_THROW((void)make_nccl_collectives(*device_, comm_, foreign), UsageError);
  NcclCollectivesOptions o;
  o.timeout = std::chrono::milliseconds(-1);
  EXPECT_THROW((void)make_nccl_collectives(*device_, comm_, stream_, o), UsageError);
}

#else  // ZINF_TEST_GPU

class NcclCollectivesGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string why = cuda::nccl_unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
    cuda::CudaAvailability avail = cuda::probe_cuda();
    if (!avail.available()) GTEST_SKIP() << "no CUDA device visible: " << avail.reason;
    device_ = cuda::make_device(cuda::DeviceOptions{cuda::DeviceKind::kCuda});
    stream_ = device_->create_stream();
    cuda::CommunicatorOptions o;
    o.id = cuda::make_communicator_id();
    comm_ = cuda::make_nccl_communicator(*device_, o);
  }
  void TearDown() override {
    comm_.reset();
    stream_ = cuda::Stream();
    device_.reset();
  }
  std::unique_ptr<cuda::Device> device_;
  cuda::Stream stream_;
  std::unique_ptr<cuda::Communicator> comm_;
};

TEST_F(NcclCollectivesGpu, OneRankCollectivesOnDeviceMemory) {
  auto c = make_nccl_collectives(*device_, *comm_, stream_);
  const std::size_t count = 4099;
  std::vector<float> host(count), back(count);
  for (std::size_t i = 0; i < count; ++i) host[i] = static_cast<float>(i) - 50.0f;
  const std::size_t bytes = count * sizeof(float);
  cuda::DeviceBuffer a = device_->allocate(bytes), b = device_->allocate(bytes);
  device_->copy_to_device(stream_, a.span(), std::as_bytes(std::span<const float>(host)));
  std::span<std::byte> da(a.data(), bytes), db(b.data(), bytes);
  c->all_reduce(da, ElementType::kF32, ReduceOp::kAvg);
  c->broadcast(da, 0);
  c->reduce_scatter(da, db, ElementType::kF32, ReduceOp::kSum);
  c->all_gather(db, da);
  c->barrier();
  device_->copy_to_host(stream_, std::as_writable_bytes(std::span<float>(back)), a.span());
  device_->synchronize(stream_);
  EXPECT_EQ(std::memcmp(host.data(), back.data(), bytes), 0);
}

#endif  // ZINF_TEST_GPU

}  // namespace
}  // namespace zinf::dist
