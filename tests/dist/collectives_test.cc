// SPDX-License-Identifier: Apache-2.0
// LocalCollectives and the callback adapter, in process: the adapter runs as N ranks on N
// threads whose callbacks exchange through shared memory (ThreadGroup below), once with a
// native reduce_scatter and once with the emulated one; every collective is checked with exact
// values (collectives_checks.h), and a callback's failure must fail the adapter.
#include "zinf/dist/collectives.h"

#include <barrier>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "collectives_checks.h"
#include "thread_group.h"
#include "zinf/common/error.h"
#include "zinf/dist/callback_collectives.h"
#include "zinf/dist/mpi_collectives.h"

namespace zinf::dist {
namespace {

TEST(LocalCollectives, IsTheGroupOfOneRank) {
  auto c = make_local_collectives();
  EXPECT_EQ(c->name(), "local");
  EXPECT_EQ(c->rank(), 0);
  EXPECT_EQ(c->size(), 1);
  EXPECT_EQ(c->memory(), MemoryKind::kHost);
  test::check_all_gather(*c);
  test::check_reduce_scatter(*c);
  test::check_all_reduce(*c);
  test::check_broadcast(*c);
  c->barrier();
}

TEST(LocalCollectives, RefusesMisuseLikeEveryBackend) {
  auto c = make_local_collectives();
  test::check_misuse(*c);
}

TEST(Collectives, NamesAndSizes) {
  EXPECT_EQ(element_type_name(ElementType::kF64), "fp64");
  EXPECT_EQ(element_type_name(ElementType::kBF16), "bf16");
  EXPECT_EQ(element_size(ElementType::kBF16), 2u);
  EXPECT_EQ(element_size(ElementType::kF64), 8u);
  EXPECT_EQ(element_size(ElementType::kI32), 4u);
  EXPECT_EQ(element_size(ElementType::kU8), 1u);
  EXPECT_EQ(reduce_op_name(ReduceOp::kAvg), "avg");
  static_assert(element_type_of<const float>() == ElementType::kF32);
  static_assert(element_type_of<std::int64_t>() == ElementType::kI64);
}

class CallbackCollectivesGroup : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(CallbackCollectivesGroup, EveryCollectiveIsExact) {
  const auto [size, native] = GetParam();
  test::ThreadGroup group(size);
  group.run(native, [](Collectives& c) {
    EXPECT_EQ(c.name(), "threads");
    EXPECT_EQ(c.memory(), MemoryKind::kHost);
    test::check_all_gather(c);
    test::check_reduce_scatter(c);
    test::check_all_reduce(c);
    test::check_broadcast(c);
    test::check_misuse(c);
  });
  // The emulation must not be chosen when the caller has a reduce_scatter.
  EXPECT_EQ(group.native_reduce_scatters_ > 0, native);
}

INSTANTIATE_TEST_SUITE_P(Ranks, CallbackCollectivesGroup,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4), ::testing::Bool()),
                         [](const auto& param_info) {
                           return std::to_string(std::get<0>(param_info.param)) + "ranks" +
                                  (std::get<1>(param_info.param) ? "Native" : "Emulated");
                         });

CollectiveCallbacks one_rank_callbacks() {
  CollectiveCallbacks cb;
  cb.all_gather = [](std::span<const std::byte> s, std::span<std::byte> r) {
    if (!s.empty() && s.data() != r.data()) std::memcpy(r.data(), s.data(), s.size());
  };
  cb.all_reduce = [](std::span<std::byte>, ElementType, ReduceOp) {};
  cb.broadcast = [](std::span<std::byte>, int) {};
  cb.barrier = [] {};
  return cb;
}

TEST(CallbackCollectives, RefusesMissingCallbacksAndBadRanks) {
  CollectiveCallbacks cb = one_rank_callbacks();
  cb.name = "gloo";
  cb.broadcast = nullptr;
  cb.barrier = nullptr;
  try {
    (void)make_callback_collectives(cb);
    ADD_FAILURE() << "no throw";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(), "callback collectives 'gloo': missing callbacks: broadcast, barrier");
  }
  cb = one_rank_callbacks();
  cb.rank = 2;
  cb.size = 2;
  EXPECT_THROW((void)make_callback_collectives(cb), UsageError);
  cb = one_rank_callbacks();
  cb.memory = MemoryKind::kDevice;
  try {
    (void)make_callback_collectives(cb);
    ADD_FAILURE() << "no throw";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("device memory needs a reduce_scatter callback"),
              std::string::npos)
        << e.what();
  }
}

TEST(CallbackCollectives, AThrowingCallbackFailsTheCollectiveAndTheAdapter) {
  CollectiveCallbacks cb = one_rank_callbacks();
  cb.rank = 1;
  cb.size = 3;
  cb.name = "gloo";
  cb.all_reduce = [](std::span<std::byte>, ElementType, ReduceOp) {
    throw std::runtime_error("Connection closed by peer [10.0.0.2]:4242");
  };
  auto c = make_callback_collectives(cb);
  std::vector<float> data(5);
  try {
    all_reduce<float>(*c, data, ReduceOp::kSum);
    ADD_FAILURE() << "no throw";
  } catch (const CollectiveError& e) {
    EXPECT_EQ(e.code(), ErrorCode::kIo);
    EXPECT_EQ(e.status().operation(), "all_reduce");
    EXPECT_STREQ(e.what(),
                 "all_reduce failed: length=20 engine=gloo: rank 1 of 3: the callback threw: "
                 "Connection closed by peer [10.0.0.2]:4242");
  }
  // The group is in an unknown state now: everything refuses, quoting the first failure.
  try {
    c->barrier();
    ADD_FAILURE() << "no throw";
  } catch (const EngineFailed& e) {
    EXPECT_NE(std::string(e.what()).find("all_reduce failed"), std::string::npos) << e.what();
  }
}

TEST(CallbackCollectives, AZinfErrorFromACallbackKeepsItsType) {
  CollectiveCallbacks cb = one_rank_callbacks();
  cb.barrier = [] { throw DeviceError("cudaStreamSynchronize failed: an illegal memory access"); };
  auto c = make_callback_collectives(cb);
  EXPECT_THROW(c->barrier(), DeviceError);
  EXPECT_THROW(c->barrier(), EngineFailed);
}

TEST(CallbackCollectives, DeviceMemoryPassesTheAverageThrough) {
  CollectiveCallbacks cb = one_rank_callbacks();
  cb.memory = MemoryKind::kDevice;
  ReduceOp seen = ReduceOp::kSum;
  cb.all_reduce = [&seen](std::span<std::byte>, ElementType, ReduceOp op) { seen = op; };
  cb.reduce_scatter = [](std::span<const std::byte>, std::span<std::byte>, ElementType, ReduceOp) {
  };
  auto c = make_callback_collectives(cb);
  // Never dereferenced on the host: a device address stands in as plain memory here.
  std::vector<float> data(4);
  all_reduce<float>(*c, data, ReduceOp::kAvg);
  EXPECT_EQ(seen, ReduceOp::kAvg);
}

TEST(MpiCollectives, FactoryWithoutMpiOrWithoutInitSaysWhy) {
  const std::string why = mpi_unavailable_reason();
  try {
    (void)make_mpi_collectives();
    ADD_FAILURE() << "no throw";
  } catch (const UsageError& e) {
    const std::string what = e.what();
    if (why.empty()) {
      // Built with MPI, but this process never called MPI_Init.
      EXPECT_NE(what.find("MPI is not initialized"), std::string::npos) << what;
    } else {
      EXPECT_EQ(what, "cannot create MPI collectives: " + why);
    }
  }
}

}  // namespace
}  // namespace zinf::dist
