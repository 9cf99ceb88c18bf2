// SPDX-License-Identifier: Apache-2.0
// LayerPrefetcher with the host source (the caller's pinned host copies) on the HostDevice: the
// same policy as the store source, so every byte reaches the compute stream in stream order, the
// window and the byte bound hold, the order is traced and re-traced; a failed copy fails the
// prefetcher at the next call; and suspend() waits for a copy still reading a host copy, so a
// rewrite of that memory right after it is never seen torn or stale. Ordering is shown with
// gates and stream-order checks; the one timing check is a lower bound the simulated copy lane
// enforces.
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "../cuda/device_test_util.h"
#include "prefetch_test_util.h"
#include "zinf/common/error.h"
#include "zinf/prefetch/layer_prefetcher.h"
#include "zinf/prefetch/testing.h"

namespace zinf::prefetch {
namespace {

using test::forward;
using test::forward_backward;

constexpr std::uint64_t kLayer = 256 << 10;

struct HostRigOptions {
  std::vector<std::uint64_t> layer_bytes;
  double copy_bandwidth_gbps = 0;
  std::uint64_t device_memory_bytes = 0;
};

// A HostDevice, a compute stream, and one pinned host copy per layer stamped with (layer,
// generation); checks on the compute stream that a span holds a given generation.
class HostRig {
 public:
  explicit HostRig(const HostRigOptions& o) : options_(o) {
    cuda::DeviceOptions dopt;
    dopt.kind = cuda::DeviceKind::kHost;
    dopt.host_copy_bandwidth_gbps = o.copy_bandwidth_gbps;
    dopt.host_memory_bytes = o.device_memory_bytes;
    device_ = cuda::make_device(dopt);
    compute_ = device_->create_stream();
    swap::BufferPoolOptions po;
    for (auto b : o.layer_bytes) po.budget_bytes += (b + 4095) / 4096 * 4096;
    po.huge_pages = false;
    pool_ = std::make_unique<swap::BufferPool>(po);
    pinned_ = device_->register_host(pool_->arena());
    for (std::size_t i = 0; i < o.layer_bytes.size(); ++i) {
      copies_.push_back(pool_->acquire((o.layer_bytes[i] + 4095) / 4096 * 4096));
      generations_.push_back(test::kLayerGeneration);
      rewrite(i, test::kLayerGeneration);
    }
  }
  ~HostRig() {
    compute_ = cuda::Stream();
    copies_.clear();
    pinned_ = cuda::PinnedRegistration();
    pool_.reset();
    device_.reset();
  }

  std::vector<std::span<const std::byte>> host_layers() const {
    std::vector<std::span<const std::byte>> v;
    for (std::size_t i = 0; i < copies_.size(); ++i) {
      v.push_back(std::span<const std::byte>(copies_[i].data(), options_.layer_bytes[i]));
    }
    return v;
  }
  PrefetcherOptions options(std::size_t depth, std::vector<std::size_t> order = {}) const {
    PrefetcherOptions p;
    p.order = std::move(order);
    p.depth = depth;
    return p;
  }
  std::unique_ptr<LayerPrefetcher> make(const PrefetcherOptions& p) {
    return std::make_unique<LayerPrefetcher>(p, host_layers(), *device_, compute_.ref());
  }

  /// Stamps layer `layer`'s host copy with `generation` (the caller has it suspended, or no
  /// prefetcher exists).
  void rewrite(std::size_t layer, std::uint32_t generation) {
    test::fill_pattern(std::span<std::byte>(copies_[layer].data(), options_.layer_bytes[layer]),
                       static_cast<std::uint32_t>(layer), 0, generation);
    generations_[layer] = generation;
  }

  /// Enqueues on the compute stream a check that `span` holds layer `layer`'s current
  /// generation (as of this call) when the stream gets there.
  void check_on_stream(std::size_t layer, cuda::DeviceSpan span) {
    const std::uint32_t g = generations_[layer];
    const std::uint64_t want = options_.layer_bytes[layer];
    ++enqueued_;
    device_->enqueue_host_work(compute_, [this, layer, span, g, want] {
      std::string err = test::check_pattern(std::span<const std::byte>(span.data(), span.size()),
                                            static_cast<std::uint32_t>(layer), 0, g);
      if (span.size() != want) err = "size " + std::to_string(span.size());
      std::lock_guard lock(mu_);
      ++run_;
      if (!err.empty()) mismatches_.push_back("layer " + std::to_string(layer) + ": " + err);
    });
  }
  std::vector<std::string> mismatches() {
    device_->synchronize(compute_);
    std::lock_guard lock(mu_);
    EXPECT_EQ(run_, enqueued_);
    return mismatches_;
  }
  void run_order(LayerPrefetcher& p, const std::vector<std::size_t>& order) {
    for (std::size_t l : order) {
      cuda::DeviceSpan span = p.acquire(l);
      check_on_stream(l, span);
      p.release(l);
    }
  }

  cuda::Device& device() { return *device_; }
  cuda::StreamRef compute() { return compute_.ref(); }

 private:
  HostRigOptions options_;
  std::unique_ptr<cuda::Device> device_;
  cuda::Stream compute_;
  std::unique_ptr<swap::BufferPool> pool_;
  cuda::PinnedRegistration pinned_;
  std::vector<swap::BufferLease> copies_;
  std::vector<std::uint32_t> generations_;
  std::mutex mu_;
  std::size_t enqueued_ = 0;
  std::size_t run_ = 0;
  std::vector<std::string> mismatches_;
};

HostRigOptions uniform(std::size_t layers, std::uint64_t bytes = kLayer) {
  HostRigOptions o;
  o.layer_bytes.assign(layers, bytes);
  return o;
}

// The host runs ahead of a compute stream held at a gate, with a slow copy lane: prefetched
// layers are handed out at once and each check, run when the stream reaches it, sees every
// byte (the stream waited for the copy, the host did not). Copies go straight from the pinned
// host copies: nothing read, nothing pageable.
TEST(LayerPrefetcherHostSource, ComputeStreamWaitsForTheCopyNotTheHost) {
  HostRigOptions o = uniform(5);
  o.copy_bandwidth_gbps = 0.05;  // 256 KiB takes ~5 ms
  HostRig rig(o);
  auto p = rig.make(rig.options(2, forward(5)));
  test::Gate gate;
  rig.device().enqueue_host_work(rig.compute(), gate.waiter());
  const auto start = std::chrono::steady_clock::now();
  for (std::size_t l = 0; l < 3; ++l) {
    cuda::DeviceSpan span = p->acquire(l);
    rig.check_on_stream(l, span);
    p->release(l);
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(15))
      << "acquire waited for copies";
  PrefetcherStats s = p->stats();
  EXPECT_EQ(s.hits, 2u);
  EXPECT_EQ(s.on_demand, 1u);
  gate.open();
  rig.run_order(*p, {3, 4});
  p->end_iteration();
  rig.run_order(*p, forward(5));
  EXPECT_EQ(rig.mismatches(), std::vector<std::string>{});
  s = p->stats();
  EXPECT_EQ(s.bytes_read, 0u);
  EXPECT_EQ(s.read_busy_time.count(), 0);
  EXPECT_EQ(s.read_failures, 0u);
  EXPECT_GE(s.bytes_to_device, 10 * kLayer);
  EXPECT_EQ(rig.device().stats().pageable_copies, 0u);
}

// Odd sizes and forward-backward: exact bytes, and the window recycles its device buffers (no
// staging: the bound is device memory only, depth + 2 layers).
TEST(LayerPrefetcherHostSource, OddSizesArriveExactlyAndBuffersAreReused) {
  HostRigOptions o;
  o.layer_bytes = {4096, 100'000, 1, 3 * kLayer + 17, 8192};
  HostRig rig(o);
  auto p = rig.make(rig.options(2, forward_backward(5)));
  for (int iteration = 0; iteration < 3; ++iteration) {
    rig.run_order(*p, forward_backward(5));
    p->end_iteration();
  }
  EXPECT_EQ(rig.mismatches(), std::vector<std::string>{});
  EXPECT_EQ(p->layer_bytes(2), 1u);
  EXPECT_EQ(p->layer_bytes(3), 3 * kLayer + 17);
}

// The window: with the host running ahead of the compute stream, device memory never holds
// more than depth + 1 layers issued-or-released plus the one the caller holds.
TEST(LayerPrefetcherHostSource, WindowHoldsAtMostDepthPlusOneLayers) {
  HostRig rig(uniform(8));
  const std::size_t depth = 2;
  auto p = rig.make(rig.options(depth, forward_backward(8)));
  for (int iteration = 0; iteration < 3; ++iteration) {
    rig.run_order(*p, forward_backward(8));
    p->end_iteration();
  }
  EXPECT_EQ(rig.mismatches(), std::vector<std::string>{});
  const cuda::DeviceStats d = rig.device().stats();
  EXPECT_LE(d.peak_allocated_bytes, (depth + 2) * kLayer);
  EXPECT_LE(d.total_allocations, depth + 2);
  EXPECT_LE(p->stats().peak_held_bytes, (depth + 2) * kLayer);
}

// max_bytes binds before depth: mixed sizes, a deep window, a simulated GPU exactly max_bytes
// large (it throws if the bound is passed).
TEST(LayerPrefetcherHostSource, NeverExceedsTheByteBound) {
  HostRigOptions o;
  o.layer_bytes = {kLayer, 2 * kLayer, kLayer / 2, 3 * kLayer, kLayer, 2 * kLayer, kLayer / 4};
  const std::uint64_t max_bytes = 5 * kLayer;
  o.device_memory_bytes = max_bytes;
  HostRig rig(o);
  PrefetcherOptions po = rig.options(6, forward_backward(7));
  po.max_bytes = max_bytes;
  auto p = rig.make(po);
  for (int iteration = 0; iteration < 3; ++iteration) {
    rig.run_order(*p, forward_backward(7));
    p->end_iteration();
  }
  EXPECT_EQ(rig.mismatches(), std::vector<std::string>{});
  EXPECT_LE(p->stats().peak_held_bytes, max_bytes);
  EXPECT_LE(rig.device().stats().peak_allocated_bytes, max_bytes);
}

// Traced first iteration, then all hits; the order changes: one re-trace, on demand for the
// rest of that iteration, and the next iteration follows the new order with every layer
// prefetched.
TEST(LayerPrefetcherHostSource, TracesAndRetracesWhenTheOrderChanges) {
  HostRig rig(uniform(5));
  auto p = rig.make(rig.options(2));
  rig.run_order(*p, forward(5));
  p->end_iteration();
  EXPECT_EQ(p->predicted_order(), forward(5));
  EXPECT_EQ(p->stats().on_demand, 5u);

  const std::vector<std::size_t> changed = {0, 2, 1, 4, 3};
  rig.run_order(*p, changed);
  rig.device().synchronize(rig.compute());
  p->end_iteration();
  const PrefetcherStats mid = p->stats();
  EXPECT_EQ(mid.retraces, 1u);
  EXPECT_EQ(p->predicted_order(), changed);
  for (std::size_t l : changed) {
    cuda::DeviceSpan span = p->acquire(l);
    rig.check_on_stream(l, span);
    p->release(l);
    rig.device().synchronize(rig.compute());  // keep pace: every acquire finds its layer issued
  }
  p->end_iteration();
  const PrefetcherStats after = p->stats();
  EXPECT_EQ(after.retraces, 1u);
  EXPECT_EQ(after.hits - mid.hits, changed.size());
  EXPECT_EQ(after.on_demand, mid.on_demand);
  EXPECT_EQ(rig.mismatches(), std::vector<std::string>{});
}

// A copy that fails on the copy stream (here: the test hook throws before layer 1's copy) fails
// the compute stream that waits for it; the next call meets that as DeviceError with the
// failure's text, and every later call refuses with EngineFailed quoting it.
TEST(LayerPrefetcherHostSource, AFailedCopyIsADeviceErrorAtTheNextCall) {
  HostRig rig(uniform(4));
  auto p = rig.make(rig.options(1, forward(4)));
  test_hooks::set_copy_hook(*p, [](std::size_t layer) {
    if (layer == 1) throw std::runtime_error("copy engine fault");
  });
  cuda::DeviceSpan l0 = p->acquire(0);
  rig.check_on_stream(0, l0);
  p->release(0);
  (void)p->acquire(1);  // its copy failed: the compute stream now waits on a failed event
  EXPECT_THROW(rig.device().synchronize(rig.compute()), DeviceError);
  // release(1) records its event after the failure and polls it: it reports the failure once
  // the stream's worker has processed the record, which may be before the poll or not. If not,
  // the next call (after a synchronize, so that it has) does.
  std::string text;
  try {
    p->release(1);
  } catch (const DeviceError& e) {
    text = e.what();
  }
  if (text.empty()) {
    EXPECT_THROW(rig.device().synchronize(rig.compute()), DeviceError);
    try {
      (void)p->acquire(2);
      ADD_FAILURE() << "no throw";
    } catch (const DeviceError& e) {
      text = e.what();
    }
  }
  EXPECT_NE(text.find("copy engine fault"), std::string::npos) << text;
  try {
    (void)p->acquire(3);
    ADD_FAILURE() << "no throw";
  } catch (const EngineFailed& e) {
    EXPECT_NE(std::string(e.what()).find("copy engine fault"), std::string::npos) << e.what();
  }
  EXPECT_THROW(p->end_iteration(), EngineFailed);
  EXPECT_THROW(p->suspend(3), EngineFailed);
}

// The rewrite hazard of this source: the host copy IS what the copy reads. Copies queue on a slow
// lane (5 ms per layer), so layer 4's copy starts ~20 ms after the window issued it; suspend(4)
// must not return before it has read the host copy, since the caller rewrites that memory at
// once. The lane enforces the lower bound, so the timing check cannot flake on a slow machine.
// The layer is then handed out with the new generation only.
TEST(LayerPrefetcherHostSource, SuspendWaitsForACopyStillReadingTheHostCopy) {
  HostRigOptions o = uniform(6);
  o.copy_bandwidth_gbps = 0.05;
  HostRig rig(o);
  auto p = rig.make(rig.options(4, forward(6)));
  const auto start = std::chrono::steady_clock::now();
  (void)p->acquire(0);  // on demand; then the window issues 1..4 behind it on the lane
  p->release(0);
  p->suspend(4);
  const auto waited = std::chrono::steady_clock::now() - start;
  // Layer 4's copy is the fifth on the lane: it cannot end before 5 x 256 KiB / 0.05 GB/s.
  EXPECT_GE(waited, std::chrono::microseconds(5 * 5242)) << "suspend returned before the copy";
  rig.rewrite(4, test::kLayerGeneration + 1);  // straight away, as the optimizer's copy-out does
  p->resume(4);
  rig.run_order(*p, {1, 2, 3, 4, 5});
  p->end_iteration();
  rig.run_order(*p, forward(6));
  EXPECT_EQ(rig.mismatches(), std::vector<std::string>{});
}

// A released layer the compute stream still uses when it is suspended: suspend does not wait
// for the stream (the step may rewrite the host copy while backward runs); that device copy is
// stale: the stream's pending work still reads it intact, and the next acquire gets the new
// bytes, never the stale copy.
TEST(LayerPrefetcherHostSource, SuspendDoesNotWaitForComputeAndNeverHandsOutTheStaleCopy) {
  HostRig rig(uniform(3));
  auto p = rig.make(rig.options(2, forward_backward(3)));
  rig.run_order(*p, forward_backward(3));
  p->end_iteration();  // layer 0 (released last, predicted first) stays resident
  rig.device().synchronize(rig.compute());
  test::Gate gate;
  cuda::DeviceSpan l0 = p->acquire(0);
  rig.device().enqueue_host_work(rig.compute(), gate.waiter());
  rig.check_on_stream(0, l0);  // the old generation, checked while the gate holds the stream
  p->release(0);
  const auto start = std::chrono::steady_clock::now();
  p->suspend(0);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
  // The stream is still held: rewriting the host copy must not reach the device copy it uses.
  rig.rewrite(0, test::kLayerGeneration + 1);
  p->resume(0);
  gate.open();
  cuda::DeviceSpan again = p->acquire(0);  // waits for the stale copy to be passed, fetches anew
  rig.check_on_stream(0, again);
  p->release(0);
  EXPECT_EQ(rig.mismatches(), std::vector<std::string>{});
}

// Every iteration rewrites every layer between suspend and resume (the engine's step), with a
// deep window and slow copies, so that suspends meet copies queued and in flight.
TEST(LayerPrefetcherHostSource, RewrittenEveryIterationNeverHandedOutStaleOrTorn) {
  HostRigOptions o = uniform(4);
  o.copy_bandwidth_gbps = 0.2;
  HostRig rig(o);
  auto p = rig.make(rig.options(3, forward_backward(4)));
  for (std::uint32_t it = 0; it < 4; ++it) {
    rig.run_order(*p, forward_backward(4));
    for (std::size_t l = 0; l < 4; ++l) {
      p->suspend(l);
      rig.rewrite(l, test::kLayerGeneration + 1 + it);
      p->resume(l);
    }
    p->end_iteration();
  }
  rig.run_order(*p, forward_backward(4));
  EXPECT_EQ(rig.mismatches(), std::vector<std::string>{});
}

// Holding every layer the byte bound allows leaves no room for one more: a clear UsageError
// naming the device bytes (there is no staging), not a hang; releasing one makes room.
TEST(LayerPrefetcherHostSource, AcquiringMoreThanFitsIsAnError) {
  HostRig rig(uniform(3));
  PrefetcherOptions po = rig.options(0);
  po.max_bytes = 2 * kLayer;
  auto p = rig.make(po);
  (void)p->acquire(0);
  (void)p->acquire(1);
  try {
    p->acquire(2);
    ADD_FAILURE() << "no throw";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(),
                 "layer prefetcher: cannot fetch layer 2 (262144 bytes on the device): acquired "
                 "layers hold 524288 of max_bytes 524288; release some first");
  }
  p->release(0);
  cuda::DeviceSpan span = p->acquire(2);
  rig.check_on_stream(2, span);
  p->release(2);
  p->release(1);
  EXPECT_EQ(rig.mismatches(), std::vector<std::string>{});
}

TEST(LayerPrefetcherHostSource, RefusesBadOptions) {
  HostRig rig(uniform(2));
  auto expect_usage = [](auto&& f, const std::string& want) {
    try {
      f();
      ADD_FAILURE() << "no throw: " << want;
    } catch (const UsageError& e) {
      EXPECT_EQ(std::string(e.what()), want);
    }
  };
  PrefetcherOptions po = rig.options(1);
  po.max_bytes = kLayer - 1;
  expect_usage([&] { rig.make(po); },
               "layer prefetcher: max_bytes 262143 cannot hold layer 0 ('host copy 0'): it "
               "needs 262144 bytes on the device");
  po = rig.options(1);
  po.layer_keys = {"a", "b"};
  expect_usage([&] { rig.make(po); },
               "layer prefetcher: layer_keys and register_with_engine are for a store source; "
               "host copies have neither keys nor staging");
  expect_usage([&] { LayerPrefetcher(rig.options(1), {}, rig.device(), rig.compute()); },
               "layer prefetcher: no layers");
  std::vector<std::span<const std::byte>> layers = rig.host_layers();
  layers[1] = {};
  expect_usage([&] { LayerPrefetcher(rig.options(1), layers, rig.device(), rig.compute()); },
               "layer prefetcher: the host copy of layer 1 is empty");
  const PrefetcherOptions bad_order = rig.options(1, {0, 2});
  expect_usage([&] { rig.make(bad_order); },
               "layer prefetcher: order names layer 2 but there are 2 layers");
}

}  // namespace
}  // namespace zinf::prefetch
