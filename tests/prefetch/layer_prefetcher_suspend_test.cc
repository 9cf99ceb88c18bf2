// SPDX-License-Identifier: Apache-2.0
// LayerPrefetcher::suspend/resume: a layer rewritten in its SwapStore key while suspended is
// never handed out stale (resident, cached, issued or mid-read copies are all dropped), the
// rewrite never overlaps a read of the key (no SwapStore UsageError), and misuse is refused.
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "prefetch_test_util.h"
#include "zinf/common/error.h"
#include "zinf/prefetch/layer_prefetcher.h"

namespace zinf::prefetch {
namespace {

using test::forward;
using test::forward_backward;
using test::Rig;
using test::RigOptions;

constexpr std::uint64_t kLayer = 256 << 10;

RigOptions uniform(std::size_t layers) {
  RigOptions o;
  o.layer_bytes.assign(layers, kLayer);
  return o;
}

// Stamps layer `layer` of the store with `generation` (whole-tensor swap_out, waited for).
void rewrite(Rig& rig, std::size_t layer, std::uint32_t generation) {
  swap::BufferPoolOptions po;
  po.budget_bytes = rig.store().padded_size(kLayer);
  po.huge_pages = false;
  swap::BufferPool pool(po);
  swap::BufferLease lease = pool.acquire(rig.store().padded_size(kLayer));
  test::fill_pattern(lease.span(), static_cast<std::uint32_t>(layer), 0, generation);
  rig.store().swap_out(rig.keys()[layer], lease.span()).wait();
}

// Acquires every layer of `order`, checking on the compute stream that each holds the
// generation `gens[layer]`; collects mismatches.
class Checker {
 public:
  void run(Rig& rig, LayerPrefetcher& p, const std::vector<std::size_t>& order,
           const std::vector<std::uint32_t>& gens) {
    for (std::size_t l : order) {
      cuda::DeviceSpan span = p.acquire(l);
      const std::uint32_t g = gens[l];
      rig.device().enqueue_host_work(rig.compute(), [this, l, g, span] {
        std::string err = test::check_pattern(std::span<const std::byte>(span.data(), span.size()),
                                              static_cast<std::uint32_t>(l), 0, g);
        std::lock_guard lock(mu_);
        if (!err.empty()) errors_.push_back("layer " + std::to_string(l) + ": " + err);
      });
      p.release(l);
    }
    p.end_iteration();
  }
  std::vector<std::string> errors(Rig& rig) {
    rig.device().synchronize(rig.compute());
    std::lock_guard lock(mu_);
    return errors_;
  }

 private:
  std::mutex mu_;
  std::vector<std::string> errors_;
};

// Each iteration rewrites every layer (as an optimizer step does) between suspend and resume;
// the next iteration must see exactly the new generation of each layer.
void rewrite_every_iteration(Rig& rig, std::size_t depth, const std::vector<std::size_t>& order,
                             std::size_t layers) {
  auto p = rig.make(rig.options(depth, order));
  Checker checker;
  std::vector<std::uint32_t> gens(layers, test::kLayerGeneration);
  for (std::uint32_t it = 0; it < 4; ++it) {
    checker.run(rig, *p, order, gens);
    for (std::size_t l = 0; l < layers; ++l) {
      p->suspend(l);
      EXPECT_TRUE(p->suspended(l));
      gens[l] = test::kLayerGeneration + 1 + it;
      ASSERT_NO_THROW(rewrite(rig, l, gens[l]));  // no swap_in of the key may be in flight
      p->resume(l);
    }
  }
  checker.run(rig, *p, order, gens);
  EXPECT_EQ(checker.errors(rig), std::vector<std::string>{});
}

TEST(LayerPrefetcherSuspend, RewrittenLayersAreNeverHandedOutStale) {
  // forward_backward: the last layer released (0) is predicted first in the next iteration,
  // so it stays resident; the window also issues the next iteration's first layers.
  Rig rig(uniform(4));
  rewrite_every_iteration(rig, 2, forward_backward(4), 4);
}

TEST(LayerPrefetcherSuspend, TracedOrderAndDeepWindow) {
  Rig rig(uniform(3));
  rewrite_every_iteration(rig, 4, {}, 3);
}

TEST(LayerPrefetcherSuspend, WaitsForReadsInFlight) {
  // Slow reads: suspend() meets the next iteration's reads still in flight.
  RigOptions o = uniform(4);
  swap::FaultRule delay;
  delay.kind = swap::FaultKind::kDelay;
  delay.op = swap::IoOp::kRead;
  delay.times = 1u << 20;
  delay.delay = std::chrono::milliseconds(3);
  o.faults = {delay};
  Rig rig(o);
  rewrite_every_iteration(rig, 3, forward(4), 4);
}

TEST(LayerPrefetcherSuspend, RefusesMisuse) {
  Rig rig(uniform(2));
  auto p = rig.make(rig.options(1, forward(2)));
  (void)p->acquire(0);
  try {
    p->suspend(0);
    ADD_FAILURE() << "no throw";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(),
                 "layer prefetcher: suspend of layer 0, which is acquired (release it first)");
  }
  p->release(0);
  p->suspend(1);
  try {
    p->suspend(1);
    ADD_FAILURE() << "no throw";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(), "layer prefetcher: suspend of layer 1, which is already suspended");
  }
  try {
    (void)p->acquire(1);
    ADD_FAILURE() << "no throw";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(),
                 "layer prefetcher: acquire of layer 1, which is suspended (resume it first)");
  }
  try {
    p->resume(0);
    ADD_FAILURE() << "no throw";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(), "layer prefetcher: resume of layer 0, which is not suspended");
  }
  p->resume(1);
  EXPECT_FALSE(p->suspended(1));
  cuda::DeviceSpan span = p->acquire(1);
  EXPECT_EQ(span.size(), kLayer);
  p->release(1);
}

}  // namespace
}  // namespace zinf::prefetch
