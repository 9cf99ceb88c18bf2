// SPDX-License-Identifier: Apache-2.0
// LayerPrefetcher on the HostDevice over a real SwapStore: every byte of every layer reaches
// the compute stream in stream order, the window prefetches ahead and recycles its buffers,
// the byte bound holds, the order is traced and re-traced, stalls and late layers are counted,
// misuse is refused and a device failure fails the prefetcher. Ordering is shown with gates
// and stream-order checks, never sleeps.
#include "zinf/prefetch/layer_prefetcher.h"

#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "../cuda/device_test_util.h"
#include "prefetch_test_util.h"
#include "zinf/common/error.h"

namespace zinf::prefetch {
namespace {

using test::forward;
using test::forward_backward;
using test::Rig;
using test::RigOptions;
using test::run_order;

constexpr std::uint64_t kLayer = 256 << 10;

RigOptions uniform(std::size_t layers, std::uint64_t bytes = kLayer) {
  RigOptions o;
  o.layer_bytes.assign(layers, bytes);
  return o;
}

TEST(LayerPrefetcher, DeliversEveryByteInTheGivenOrder) {
  Rig rig(uniform(6));
  auto p = rig.make(rig.options(2, forward(6)));
  const auto start = std::chrono::steady_clock::now();
  for (int iteration = 0; iteration < 3; ++iteration) {
    run_order(*p, rig, forward(6));
    p->end_iteration();
  }
  EXPECT_EQ(rig.mismatches(), std::vector<std::string>{});
  PrefetcherStats s = p->stats();
  EXPECT_EQ(s.acquires, 18u);
  EXPECT_EQ(s.hits + s.on_demand, 18u);
  EXPECT_EQ(s.retraces, 0u);
  EXPECT_EQ(s.read_failures, 0u);
  EXPECT_GE(s.bytes_to_device, 18 * kLayer);  // no layer is reused in a forward-only order
  EXPECT_LE(s.bytes_to_device, s.layers_issued * kLayer);
  // Reads were in flight for some of the run, and never for longer than the run.
  EXPECT_GT(s.read_busy_time.count(), 0);
  EXPECT_LE(s.read_busy_time, std::chrono::steady_clock::now() - start);
}

TEST(LayerPrefetcher, OddSizedLayersArriveExactly) {
  RigOptions o;
  o.layer_bytes = {4096, 100'000, 1, 3 * kLayer + 17, 8192};
  Rig rig(o);
  auto p = rig.make(rig.options(3, forward(5)));
  for (int iteration = 0; iteration < 2; ++iteration) {
    run_order(*p, rig, forward(5));
    p->end_iteration();
  }
  EXPECT_EQ(rig.mismatches(), std::vector<std::string>{});
  EXPECT_EQ(p->layer_bytes(2), 1u);
}

// The host runs ahead of a compute stream held at a gate: acquires of the prefetched layers
// return at once (the host never waits for copies or compute), and each layer's check, run
// only when the stream reaches it, still sees every byte: the stream waited on the copy event.
// A slow copy lane makes a missing wait show up as a mismatch.
TEST(LayerPrefetcher, ComputeStreamWaitsForTheCopyNotTheHost) {
  RigOptions o = uniform(5);
  o.copy_bandwidth_gbps = 0.05;  // 256 KiB takes ~5 ms to "cross PCIe"
  Rig rig(o);
  auto p = rig.make(rig.options(2, forward(5)));
  test::Gate gate;
  rig.device().enqueue_host_work(rig.compute(), gate.waiter());
  cuda::DeviceSpan l0 = p->acquire(0);  // on demand: returns once its read is done
  rig.check_on_stream(0, l0);
  p->release(0);
  // Layers 1 and 2 were issued by the calls above; with the compute stream blocked, the host
  // still gets them (release of 0 has not been passed, so the window holds 0, 1, 2).
  for (std::size_t l : {1u, 2u}) {
    cuda::DeviceSpan span = p->acquire(l);
    rig.check_on_stream(l, span);
    p->release(l);
  }
  PrefetcherStats s = p->stats();
  EXPECT_EQ(s.hits, 2u);
  EXPECT_EQ(s.on_demand, 1u);
  gate.open();
  for (std::size_t l : {3u, 4u}) {
    cuda::DeviceSpan span = p->acquire(l);
    rig.check_on_stream(l, span);
    p->release(l);
  }
  EXPECT_EQ(rig.mismatches(), std::vector<std::string>{});
}

// When the host keeps pace with the compute stream, every layer after the first of the first
// iteration was issued before its acquire, and the next iteration's first layers are
// prefetched across the iteration boundary: all hits.
TEST(LayerPrefetcher, PrefetchesAheadAndAcrossIterations) {
  Rig rig(uniform(6));
  auto p = rig.make(rig.options(2, forward(6)));
  for (int iteration = 0; iteration < 2; ++iteration) {
    for (std::size_t l = 0; l < 6; ++l) {
      cuda::DeviceSpan span = p->acquire(l);
      rig.check_on_stream(l, span);
      p->release(l);
      rig.device().synchronize(rig.compute());
    }
    p->end_iteration();
    PrefetcherStats s = p->stats();
    EXPECT_EQ(s.on_demand, 1u) << "iteration " << iteration;
    EXPECT_EQ(s.hits, 6u * static_cast<unsigned>(iteration + 1) - 1u) << "iteration " << iteration;
  }
  EXPECT_EQ(rig.mismatches(), std::vector<std::string>{});
}

// Device buffers and staging are reused: however many iterations run, the device never holds
// more than the window (depth + 1) plus the layer in use, and allocations stop growing.
TEST(LayerPrefetcher, RecyclesDeviceBuffersAndStaging) {
  Rig rig(uniform(8));
  const std::size_t depth = 2;
  auto p = rig.make(rig.options(depth, forward_backward(8)));
  for (int iteration = 0; iteration < 4; ++iteration) {
    run_order(*p, rig, forward_backward(8));
    p->end_iteration();
  }
  EXPECT_EQ(rig.mismatches(), std::vector<std::string>{});
  cuda::DeviceStats d = rig.device().stats();
  EXPECT_LE(d.total_allocations, depth + 2);
  EXPECT_LE(d.peak_allocated_bytes, (depth + 2) * kLayer);
  EXPECT_EQ(d.pageable_copies, 0u) << "staging is pinned";
  PrefetcherStats s = p->stats();
  EXPECT_LE(s.peak_held_bytes, (depth + 2) * 2 * kLayer);
  // 64 acquisitions but the turnaround layer (7, 7) is used twice per issue.
  EXPECT_LT(s.layers_issued, 64u);
}

// max_bytes binds before depth: layers of mixed sizes, a deep window and a budget of a few
// layers. The held bytes (staging + device) never pass it, a device sized to it never runs
// out, and the data is exact.
TEST(LayerPrefetcher, NeverExceedsTheByteBound) {
  RigOptions o;
  o.layer_bytes = {kLayer, 2 * kLayer, kLayer / 2, 3 * kLayer, kLayer, 2 * kLayer, kLayer / 4};
  const std::uint64_t max_bytes = 9 * kLayer;  // largest layer: 3 + 3 (staging + device)
  o.device_memory_bytes = max_bytes;           // the simulated GPU throws if the bound is passed
  Rig rig(o);
  PrefetcherOptions po = rig.options(6, forward_backward(7));
  po.max_bytes = max_bytes;
  auto p = rig.make(po);
  for (int iteration = 0; iteration < 3; ++iteration) {
    run_order(*p, rig, forward_backward(7));
    p->end_iteration();
  }
  EXPECT_EQ(rig.mismatches(), std::vector<std::string>{});
  PrefetcherStats s = p->stats();
  EXPECT_LE(s.peak_held_bytes, max_bytes);
  EXPECT_GT(s.peak_held_bytes, 0u);
  EXPECT_LE(rig.device().stats().peak_allocated_bytes, max_bytes);
}

// A staging budget of one layer: reads are serialised through one pinned buffer, and still
// every byte arrives.
TEST(LayerPrefetcher, WorksThroughAOneLayerStagingBudget) {
  Rig rig(uniform(5));
  PrefetcherOptions po = rig.options(3, forward(5));
  po.staging_bytes = kLayer;
  auto p = rig.make(po);
  for (int iteration = 0; iteration < 2; ++iteration) {
    run_order(*p, rig, forward(5));
    p->end_iteration();
  }
  EXPECT_EQ(rig.mismatches(), std::vector<std::string>{});
}

TEST(LayerPrefetcher, TracesTheFirstIterationThenPrefetchesIt) {
  Rig rig(uniform(5));
  auto p = rig.make(rig.options(2));  // no order: trace
  const auto order = forward_backward(5);
  EXPECT_TRUE(p->predicted_order().empty());
  run_order(*p, rig, order);
  EXPECT_EQ(p->stats().hits + p->stats().on_demand, order.size());
  // Tracing fetches on demand; a layer still resident from its forward use may be reused.
  EXPECT_GE(p->stats().on_demand, 5u);
  p->end_iteration();
  EXPECT_EQ(p->predicted_order(), order);
  const PrefetcherStats before = p->stats();
  for (std::size_t l : order) {
    cuda::DeviceSpan span = p->acquire(l);
    rig.check_on_stream(l, span);
    p->release(l);
    rig.device().synchronize(rig.compute());  // keep pace, so every acquire finds its layer issued
  }
  p->end_iteration();
  const PrefetcherStats after = p->stats();
  EXPECT_EQ(after.hits - before.hits, order.size());
  EXPECT_EQ(after.on_demand, before.on_demand);
  EXPECT_EQ(after.retraces, 0u);
  EXPECT_EQ(rig.mismatches(), std::vector<std::string>{});
}

// The trainer's order changes in iteration 2: counted once, the rest of that iteration is on
// demand, and iteration 3 follows the new order with every layer prefetched.
TEST(LayerPrefetcher, RetracesWhenTheOrderChanges) {
  Rig rig(uniform(5));
  auto p = rig.make(rig.options(2, forward(5)));
  run_order(*p, rig, forward(5));
  p->end_iteration();
  EXPECT_EQ(p->stats().retraces, 0u);

  const std::vector<std::size_t> changed = {0, 2, 1, 4, 3};
  const PrefetcherStats before = p->stats();
  run_order(*p, rig, changed);
  // Let the compute stream catch up, so that end_iteration finds room to prefetch the next
  // iteration's first layers.
  rig.device().synchronize(rig.compute());
  p->end_iteration();
  const PrefetcherStats mid = p->stats();
  EXPECT_EQ(mid.retraces, 1u);
  EXPECT_EQ(p->predicted_order(), changed);

  for (std::size_t l : changed) {
    cuda::DeviceSpan span = p->acquire(l);
    rig.check_on_stream(l, span);
    p->release(l);
    rig.device().synchronize(rig.compute());
  }
  p->end_iteration();
  const PrefetcherStats after = p->stats();
  EXPECT_EQ(after.retraces, 1u);
  EXPECT_EQ(after.hits - mid.hits, changed.size());
  EXPECT_EQ(after.on_demand, mid.on_demand);
  EXPECT_GT(mid.on_demand, before.on_demand);
  EXPECT_EQ(rig.mismatches(), std::vector<std::string>{});
}

TEST(LayerPrefetcher, AnIterationEndingEarlyIsARetrace) {
  Rig rig(uniform(4));
  auto p = rig.make(rig.options(1, forward(4)));
  run_order(*p, rig, {0, 1});
  p->end_iteration();
  EXPECT_EQ(p->stats().retraces, 1u);
  EXPECT_EQ(p->predicted_order(), (std::vector<std::size_t>{0, 1}));
  run_order(*p, rig, {0, 1});
  p->end_iteration();
  EXPECT_EQ(p->stats().retraces, 1u);
  EXPECT_EQ(rig.mismatches(), std::vector<std::string>{});
}

// Acquisitions nothing predicted, with a window full of predicted layers and a tight byte
// bound: unused layers are evicted and every acquire still gets its bytes.
TEST(LayerPrefetcher, OutOfOrderAccessFetchesOnDemand) {
  Rig rig(uniform(8));
  PrefetcherOptions po = rig.options(3, forward(8));
  po.max_bytes = 6 * kLayer;  // three layers of staging + device
  auto p = rig.make(po);
  run_order(*p, rig, forward(8));
  p->end_iteration();  // the window now holds the next iteration's first layers
  const std::vector<std::size_t> wild = {7, 3, 3, 0, 5, 1, 6, 2, 4, 7};
  run_order(*p, rig, wild);
  EXPECT_EQ(rig.mismatches(), std::vector<std::string>{});
  PrefetcherStats s = p->stats();
  EXPECT_EQ(s.retraces, 1u);
  EXPECT_LE(s.peak_held_bytes, po.max_bytes);
}

// Depth 0 fetches on demand only: nothing is issued before its acquire, and device memory is
// bounded by the layer in flight plus the one released before it (depth + 2 buffers).
TEST(LayerPrefetcher, DepthZeroFetchesOnDemandOnly) {
  Rig rig(uniform(4));
  auto p = rig.make(rig.options(0, forward(4)));
  for (int iteration = 0; iteration < 2; ++iteration) {
    run_order(*p, rig, forward(4));
    p->end_iteration();
  }
  EXPECT_EQ(rig.mismatches(), std::vector<std::string>{});
  PrefetcherStats s = p->stats();
  EXPECT_EQ(s.hits, 0u);
  EXPECT_EQ(s.on_demand, 8u);
  EXPECT_EQ(s.layers_issued, 8u);
  EXPECT_LE(rig.device().stats().peak_allocated_bytes, 2 * kLayer);
  EXPECT_EQ(rig.device().stats().total_allocations, 2u) << "allocated at construction, then reused";
}

// Depth 0 with reads delayed 30 ms: the compute stream reaches each layer's probe long before
// its data (the probe is enqueued before the read is even issued), so layers are late and the
// wait is accounted as stall time. "Late" is a timing fact: a compute-stream thread descheduled
// for longer than a read would see that layer on time, so the bounds are one layer's worth.
TEST(LayerPrefetcher, AccountsStallTimeOfLateLayers) {
  RigOptions o = uniform(3);
  swap::FaultRule delay;
  delay.kind = swap::FaultKind::kDelay;
  delay.op = swap::IoOp::kRead;
  delay.delay = std::chrono::milliseconds(30);
  delay.times = ~std::uint64_t{0};
  o.faults = {delay};
  Rig rig(o);
  auto p = rig.make(rig.options(0, forward(3)));
  run_order(*p, rig, forward(3));
  EXPECT_EQ(rig.mismatches(), std::vector<std::string>{});
  PrefetcherStats s = p->stats();
  EXPECT_GE(s.late_layers, 1u);
  EXPECT_LE(s.late_layers, 3u);
  EXPECT_GE(s.stall_time, std::chrono::milliseconds(30));
  EXPECT_GE(s.acquire_blocked_time, std::chrono::milliseconds(3 * 30))
      << "the host waited for each read";
}

TEST(LayerPrefetcher, RefusesMisuse) {
  Rig rig(uniform(3));
  auto p = rig.make(rig.options(1, forward(3)));
  try {
    p->acquire(3);
    ADD_FAILURE() << "no throw";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(), "layer prefetcher: acquire of layer 3 but there are 3 layers");
  }
  try {
    p->release(0);
    ADD_FAILURE() << "no throw";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(), "layer prefetcher: release of layer 0, which is not acquired");
  }
  (void)p->acquire(0);
  try {
    p->acquire(0);
    ADD_FAILURE() << "no throw";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(), "layer prefetcher: layer 0 acquired again before its release");
  }
  p->release(0);
  EXPECT_EQ(rig.mismatches(), std::vector<std::string>{});
}

TEST(LayerPrefetcher, RefusesBadOptions) {
  Rig rig(uniform(2));
  PrefetcherOptions po = rig.options(1);
  po.layer_keys.push_back("nope");
  EXPECT_THROW(
      {
        try {
          rig.make(po);
        } catch (const UsageError& e) {
          EXPECT_STREQ(e.what(), "layer prefetcher: unknown layer key 'nope'");
          throw;
        }
      },
      UsageError);
  po = rig.options(1, {0, 2});
  EXPECT_THROW(rig.make(po), UsageError);
  po = rig.options(1);
  po.max_bytes = kLayer;
  try {
    rig.make(po);
    ADD_FAILURE() << "no throw";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(),
                 "layer prefetcher: max_bytes 262144 cannot hold layer 0 ('layer0'): it "
                 "needs 262144 bytes of staging plus 262144 on the device");
  }
  auto other = cuda::make_device(cuda::DeviceOptions{cuda::DeviceKind::kHost});
  {
    cuda::Stream foreign = other->create_stream();
    EXPECT_THROW(LayerPrefetcher(rig.options(1), rig.store(), rig.device(), foreign.ref()),
                 UsageError);
  }
}

// Holding every layer acquired leaves no room for one more: a clear UsageError, not a hang.
TEST(LayerPrefetcher, AcquiringMoreThanFitsIsAnError) {
  Rig rig(uniform(3));
  PrefetcherOptions po = rig.options(0);
  po.max_bytes = 3 * kLayer;
  auto p = rig.make(po);
  // Synchronizing after each acquire lets the copy finish, so its staging is back in the pool.
  (void)p->acquire(0);
  rig.device().synchronize(rig.compute());
  (void)p->acquire(1);
  rig.device().synchronize(rig.compute());
  try {
    p->acquire(2);
    ADD_FAILURE() << "no throw";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(),
                 "layer prefetcher: cannot fetch layer 2 (262144 bytes of staging plus "
                 "262144 on the device): acquired layers hold 524288 of max_bytes "
                 "786432; release some first");
  }
  p->release(0);
  p->release(1);
  (void)p->acquire(2);
  p->release(2);
  EXPECT_EQ(rig.mismatches(), std::vector<std::string>{});
}

// Compute that fails on the stream fails the prefetcher: the next call reports the stream's
// error as DeviceError, every later call refuses with EngineFailed quoting it.
TEST(LayerPrefetcher, ComputeStreamFailureFailsThePrefetcher) {
  Rig rig(uniform(3));
  auto p = rig.make(rig.options(1, forward(3)));
  (void)p->acquire(0);
  // Held until release(0) has returned: otherwise the stream may fail and complete layer 0's
  // release event while release() is still polling, and the error surfaces at release(0).
  test::Gate gate;
  rig.device().enqueue_host_work(rig.compute(), gate.waiter());
  rig.device().enqueue_host_work(rig.compute(),
                                 [] { throw std::runtime_error("kernel exploded"); });
  p->release(0);
  gate.open();
  EXPECT_THROW(rig.device().synchronize(rig.compute()), DeviceError);  // the stream got there
  // acquire(1) queries layer 0's release event, recorded after the failure.
  try {
    p->acquire(1);
    ADD_FAILURE() << "no throw";
  } catch (const DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find("kernel exploded"), std::string::npos) << e.what();
  }
  try {
    p->acquire(2);
    ADD_FAILURE() << "no throw";
  } catch (const EngineFailed& e) {
    EXPECT_NE(std::string(e.what()).find("refusing work after an earlier failure: layer prefetch "
                                         "failed: host: host work on stream "),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("kernel exploded"), std::string::npos) << e.what();
  }
  EXPECT_THROW(p->end_iteration(), EngineFailed);
}

// A prefetcher that registers its staging arena with the engine drops that registration when
// it goes: the next prefetcher's arena (often mapped at the same address) must not be read into
// the first one's pinned pages. With io_uring this is where stale fixed buffers would show.
TEST(LayerPrefetcher, EngineRegistrationEndsWithThePrefetcher) {
  RigOptions o = uniform(4, 2u << 20);  // an arena large enough to be mapped where the last was
  o.engine = swap::IoEngineKind::kUring;
  if (std::string why = swap::io_uring_unavailable_reason(); !why.empty()) {
    GTEST_SKIP() << "io_uring unavailable: " << why;
  }
  Rig rig(o);
  // Rounds 1 and 3 register, round 2 does not: it reads into an arena that round 1's (gone)
  // registration would cover if it had been left behind.
  for (int round = 0; round < 3; ++round) {
    PrefetcherOptions po = rig.options(2, forward(4));
    if (round != 1) po.register_with_engine = &rig.engine();
    auto p = rig.make(po);
    run_order(*p, rig, forward(4));
    EXPECT_EQ(rig.mismatches(), std::vector<std::string>{}) << "round " << round;
  }
}

// Destroying the prefetcher with reads in flight and a layer still acquired waits for them
// (sanitizers check that nothing is used after it is freed).
TEST(LayerPrefetcher, DestructionWaitsForWorkInFlight) {
  RigOptions o = uniform(6);
  o.copy_bandwidth_gbps = 0.1;
  Rig rig(o);
  auto p = rig.make(rig.options(4, forward(6)));
  cuda::DeviceSpan span = p->acquire(0);
  rig.check_on_stream(0, span);
  p.reset();
  EXPECT_EQ(rig.mismatches(), std::vector<std::string>{});
}

}  // namespace
}  // namespace zinf::prefetch
