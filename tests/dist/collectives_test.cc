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
  EXPECT_EQ(element_size(ElementType::kF64), 8u);
  EXPECT_EQ(element_size(ElementType::kI32), 4u);
  EXPECT_EQ(element_size(ElementType::kU8), 1u);
  EXPECT_EQ(reduce_op_name(ReduceOp::kAvg), "avg");
  static_assert(element_type_of<const float>() == ElementType::kF32);
  static_assert(element_type_of<std::int64_t>() == ElementType::kI64);
}

// Ranks as threads: each callback publishes this rank's buffer in its slot, waits for every
// rank (std::barrier), computes from all the slots, and waits again before returning so that
// no rank's buffer is released while another still reads it.
class ThreadGroup {
 public:
  explicit ThreadGroup(int size) : size_(size), slots_(size), sync_(size) {}

  CollectiveCallbacks callbacks(int rank, bool native_reduce_scatter) {
    CollectiveCallbacks cb;
    cb.rank = rank;
    cb.size = size_;
    cb.name = "threads";
    cb.all_gather = [this, rank](std::span<const std::byte> send, std::span<std::byte> recv) {
      publish(rank, send);
      for (int q = 0; q < size_; ++q) copy_slot(q, recv.subspan(q * send.size(), send.size()));
      sync_.arrive_and_wait();
    };
    cb.all_reduce = [this, rank](std::span<std::byte> data, ElementType type, ReduceOp op) {
      EXPECT_NE(op, ReduceOp::kAvg) << "the adapter passed kAvg to a host callback";
      publish(rank, data);
      std::vector<std::byte> out = reduce_slots(0, data.size(), type, op);
      sync_.arrive_and_wait();
      if (!out.empty()) std::memcpy(data.data(), out.data(), out.size());
    };
    cb.broadcast = [this, rank](std::span<std::byte> data, int root) {
      publish(rank, data);
      if (rank != root) copy_slot(root, data);
      sync_.arrive_and_wait();
    };
    cb.barrier = [this] { sync_.arrive_and_wait(); };
    if (native_reduce_scatter) {
      cb.reduce_scatter = [this, rank](std::span<const std::byte> send, std::span<std::byte> recv,
                                       ElementType type, ReduceOp op) {
        ++native_reduce_scatters_;
        publish(rank, send);
        std::vector<std::byte> out = reduce_slots(rank * recv.size(), recv.size(), type, op);
        sync_.arrive_and_wait();
        if (!out.empty()) std::memcpy(recv.data(), out.data(), out.size());
      };
    }
    return cb;
  }

  // Runs body(collectives) on `size` threads, one per rank.
  void run(bool native_reduce_scatter, const std::function<void(Collectives&)>& body) {
    std::vector<std::thread> threads;
    for (int r = 0; r < size_; ++r) {
      threads.emplace_back([this, r, native_reduce_scatter, &body] {
        auto c = make_callback_collectives(callbacks(r, native_reduce_scatter));
        body(*c);
      });
    }
    for (auto& t : threads) t.join();
  }

  std::atomic<int> native_reduce_scatters_{0};

 private:
  void publish(int rank, std::span<const std::byte> bytes) {
    slots_[rank] = bytes;
    sync_.arrive_and_wait();
  }
  // Skips a slot that is `to` itself (this rank's block of an in-place all-gather): copying it
  // onto itself would write memory the other ranks are reading.
  void copy_slot(int q, std::span<std::byte> to) {
    if (!to.empty() && to.data() != slots_[q].data()) {
      std::memcpy(to.data(), slots_[q].data(), to.size());
    }
  }

  template <class T>
  static void reduce_into(std::vector<std::byte>& acc, std::span<const std::byte> in, ReduceOp op) {
    for (std::size_t off = 0; off < acc.size(); off += sizeof(T)) {
      T a, b;
      std::memcpy(&a, acc.data() + off, sizeof a);
      std::memcpy(&b, in.data() + off, sizeof b);
      if (op == ReduceOp::kSum) a = static_cast<T>(a + b);
      if (op == ReduceOp::kMax) a = std::max(a, b);
      if (op == ReduceOp::kMin) a = std::min(a, b);
      std::memcpy(acc.data() + off, &a, sizeof a);
    }
  }

  // Bytes [offset, offset + bytes) of every slot reduced in rank order.
  std::vector<std::byte> reduce_slots(std::size_t offset, std::size_t bytes, ElementType type,
                                      ReduceOp op) {
    std::vector<std::byte> acc(slots_[0].begin() + offset, slots_[0].begin() + offset + bytes);
    for (int q = 1; q < size_; ++q) {
      auto in = slots_[q].subspan(offset, bytes);
      switch (type) {
        case ElementType::kF32: reduce_into<float>(acc, in, op); break;
        case ElementType::kF64: reduce_into<double>(acc, in, op); break;
        case ElementType::kI32: reduce_into<std::int32_t>(acc, in, op); break;
        case ElementType::kI64: reduce_into<std::int64_t>(acc, in, op); break;
        case ElementType::kU8: reduce_into<std::uint8_t>(acc, in, op); break;
      }
    }
    return acc;
  }

  const int size_;
  std::vector<std::span<const std::byte>> slots_;
  std::barrier<> sync_;
};

class CallbackCollectivesGroup : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(CallbackCollectivesGroup, EveryCollectiveIsExact) {
  const auto [size, native] = GetParam();
  ThreadGroup group(size);
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
