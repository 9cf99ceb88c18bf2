// SPDX-License-Identifier: Apache-2.0
// InflightOps (python/src/inflight_ops.h), the bookkeeping under zinf.compat.deepspeed's
// aio_handle shared by threads: a waiter returns only once every operation submitted before
// its wait is finished, whoever finished it, and each operation is finished exactly once. In
// the unit label, so the sanitizer presets (TSan) run it; the pybind11 module is not built
// there.
#include "inflight_ops.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

namespace zinf::python {
namespace {

// An operation: which flag it sets when finished. Finishing sets it once; a second finish
// (the operation finished by two waiters) or a missing one is counted.
struct FakeOp {
  std::atomic<int>* flag = nullptr;
};

TEST(InflightOps, AWaiterTakesWhatNobodyTookAndWaitsForTheRest) {
  InflightOps<int> ops;
  const std::uint64_t a = ops.add(1);
  const std::uint64_t b = ops.add(2);
  EXPECT_EQ(a, 0u);
  EXPECT_EQ(b, 1u);
  auto first = ops.claim();
  ASSERT_EQ(first.ops.size(), 2u);
  EXPECT_EQ(first.upto, 2u);
  const std::uint64_t c = ops.add(3);
  auto second = ops.claim();  // only what was added after the first claim
  ASSERT_EQ(second.ops.size(), 1u);
  EXPECT_EQ(second.ops[0].first, c);
  EXPECT_EQ(second.ops[0].second, 3);
  EXPECT_EQ(ops.claim().ops.size(), 0u);
  // The second waiter's own operation is done, but one submitted before its claim is still
  // the first waiter's: it must not return yet.
  ops.finished({c});
  std::atomic<bool> returned{false};
  std::thread waiter([&] {
    ops.wait_finished(second.upto);
    returned = true;
  });
  EXPECT_FALSE(returned.load());
  EXPECT_EQ(ops.unfinished(), 2u);
  ops.finished({a, b});
  waiter.join();
  EXPECT_TRUE(returned.load());
  EXPECT_EQ(ops.unfinished(), 0u);
}

TEST(InflightOps, AWaiterIgnoresOperationsSubmittedAfterItsClaim) {
  InflightOps<int> ops;
  const auto claim = ops.claim();
  ops.add(7);  // another thread's, after the claim: not this waiter's to wait for
  ops.wait_finished(claim.upto);
  EXPECT_EQ(ops.unfinished(), 1u);
}

TEST(InflightOps, ThreadsSubmittingAndWaitingFinishEveryOperationOnceBeforeTheirWaitReturns) {
  // Each thread submits operations and waits every few; after its wait returns, every one of
  // its operations submitted before must be finished, though another thread's wait may have
  // finished it. Rounds of 4 threads x 400 operations.
  constexpr int kThreads = 4;
  constexpr int kPerThread = 400;
  for (int round = 0; round < 5; ++round) {
    InflightOps<FakeOp> ops;
    std::vector<std::unique_ptr<std::atomic<int>>> flags;
    for (int i = 0; i < kThreads * kPerThread; ++i) {
      flags.push_back(std::make_unique<std::atomic<int>>(0));
    }
    std::atomic<int> early{0};
    auto wait = [&] {
      auto claim = ops.claim();
      std::vector<std::uint64_t> numbers;
      for (auto& [n, op] : claim.ops) {
        op.flag->fetch_add(1);
        numbers.push_back(n);
      }
      ops.finished(numbers);
      ops.wait_finished(claim.upto);
    };
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        std::vector<int> mine;
        for (int i = 0; i < kPerThread; ++i) {
          const int k = t * kPerThread + i;
          ops.add(FakeOp{flags[static_cast<std::size_t>(k)].get()});
          mine.push_back(k);
          if (i % 3 == 0 || i + 1 == kPerThread) {
            wait();
            for (const int j : mine) {
              if (flags[static_cast<std::size_t>(j)]->load() != 1) early.fetch_add(1);
            }
            mine.clear();
          }
        }
      });
    }
    for (auto& th : threads) th.join();
    EXPECT_EQ(early.load(), 0) << "round " << round;
    for (const auto& f : flags) ASSERT_EQ(f->load(), 1) << "round " << round;
    EXPECT_EQ(ops.unfinished(), 0u);
  }
}

}  // namespace
}  // namespace zinf::python
