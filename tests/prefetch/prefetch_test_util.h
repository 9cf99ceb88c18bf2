// SPDX-License-Identifier: Apache-2.0
// A rig for the LayerPrefetcher tests: a real IoEngine and SwapStore in a per-test directory
// holding stamped layers, a HostDevice (optionally with a copy-bandwidth cap) and a compute
// stream, plus helpers that check a layer's bytes on the compute stream, in stream order.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "support/pattern.h"
#include "support/test_dir.h"
#include "zinf/cuda/device.h"
#include "zinf/prefetch/layer_prefetcher.h"
#include "zinf/swap/buffer_pool.h"
#include "zinf/swap/fault_injection.h"
#include "zinf/swap/io_engine.h"
#include "zinf/swap/swap_store.h"

namespace zinf::test {

/// Generation stamped into the layers' bytes (pattern.h), so stale data is told apart.
inline constexpr std::uint32_t kLayerGeneration = 7;

struct RigOptions {
  std::vector<std::uint64_t> layer_bytes;
  swap::IoEngineKind engine = swap::IoEngineKind::kThreads;
  /// Installed from the start; give read rules (op = kRead) so that writing the layers in the
  /// constructor is never faulted.
  std::vector<swap::FaultRule> faults;
  double copy_bandwidth_gbps = 0;  // HostDevice cap, 0 = memcpy speed
  std::uint32_t io_block_size = 256 << 10;
  std::uint64_t device_memory_bytes = 0;
};

/// Owns everything a prefetcher needs; members in construction order.
class Rig {
 public:
  explicit Rig(const RigOptions& o) : options_(o) {
    plan_ = std::make_shared<swap::FaultPlan>(o.faults, 1);
    swap::IoOptions io;
    io.kind = o.engine;
    io.block_size = o.io_block_size;
    io.queue_depth = 8;
    if (!o.faults.empty()) io.faults = plan_;
    engine_ = swap::make_io_engine(io);
    swap::SwapStoreOptions so;
    so.directories = {dir_.subdir("nvme")};
    std::uint64_t total = 0;
    for (auto b : o.layer_bytes) total += (b + (1u << 20) - 1) / (1u << 20) * (1u << 20);
    so.capacity_bytes = total;
    so.stripe_bytes = 1u << 20;
    store_ = std::make_unique<swap::SwapStore>(so, *engine_);
    swap::BufferPoolOptions po;
    po.budget_bytes = *std::max_element(o.layer_bytes.begin(), o.layer_bytes.end()) + (1u << 20);
    po.huge_pages = false;
    swap::BufferPool pool(po);
    for (std::size_t i = 0; i < o.layer_bytes.size(); ++i) {
      keys_.push_back("layer" + std::to_string(i));
      store_->allocate(keys_[i], o.layer_bytes[i]);
      swap::BufferLease lease = pool.acquire(store_->padded_size(o.layer_bytes[i]));
      fill_pattern(lease.span(), static_cast<std::uint32_t>(i), 0, kLayerGeneration);
      store_->swap_out(keys_[i], lease.span()).wait();
    }
    cuda::DeviceOptions dopt;
    dopt.kind = cuda::DeviceKind::kHost;
    dopt.host_copy_bandwidth_gbps = o.copy_bandwidth_gbps;
    dopt.host_memory_bytes = o.device_memory_bytes;
    device_ = cuda::make_device(dopt);
    compute_ = device_->create_stream();
  }

  ~Rig() {
    compute_ = cuda::Stream();
    device_.reset();
    store_.reset();
    engine_.reset();
  }

  prefetch::PrefetcherOptions options(std::size_t depth,
                                      std::vector<std::size_t> order = {}) const {
    prefetch::PrefetcherOptions p;
    p.layer_keys = keys_;
    p.order = std::move(order);
    p.depth = depth;
    p.huge_pages = false;
    return p;
  }

  std::unique_ptr<prefetch::LayerPrefetcher> make(const prefetch::PrefetcherOptions& p) {
    return std::make_unique<prefetch::LayerPrefetcher>(p, *store_, *device_, compute_.ref());
  }

  /// Enqueues, on the compute stream, a check that `span` holds layer `layer`'s bytes when the
  /// stream reaches this point (so it also proves the stream waited for the copy). Failures
  /// are collected and reported by `mismatches()`.
  void check_on_stream(std::size_t layer, cuda::DeviceSpan span) {
    ++checks_enqueued_;
    device_->enqueue_host_work(compute_, [this, layer, span] {
      std::string err = check_pattern(std::span<const std::byte>(span.data(), span.size()),
                                      static_cast<std::uint32_t>(layer), 0, kLayerGeneration);
      if (span.size() != options_.layer_bytes[layer]) {
        err = "size " + std::to_string(span.size()) +
              " != " + std::to_string(options_.layer_bytes[layer]);
      }
      std::lock_guard lock(mu_);
      ++checks_run_;
      if (!err.empty()) mismatches_.push_back("layer " + std::to_string(layer) + ": " + err);
    });
  }

  /// Waits for the compute stream and returns the failed checks (empty: every byte matched).
  std::vector<std::string> mismatches() {
    device_->synchronize(compute_);
    std::lock_guard lock(mu_);
    EXPECT_EQ(checks_run_, checks_enqueued_);
    return mismatches_;
  }

  cuda::Device& device() { return *device_; }
  cuda::StreamRef compute() { return compute_.ref(); }
  swap::SwapStore& store() { return *store_; }
  swap::IoEngine& engine() { return *engine_; }
  swap::FaultPlan& plan() { return *plan_; }
  const std::vector<std::string>& keys() const { return keys_; }
  const std::string& dir() const { return dir_.path(); }

 private:
  RigOptions options_;
  TestDir dir_;
  std::shared_ptr<swap::FaultPlan> plan_;
  std::unique_ptr<swap::IoEngine> engine_;
  std::unique_ptr<swap::SwapStore> store_;
  std::vector<std::string> keys_;
  std::unique_ptr<cuda::Device> device_;
  cuda::Stream compute_;
  std::mutex mu_;
  std::size_t checks_enqueued_ = 0;
  std::size_t checks_run_ = 0;
  std::vector<std::string> mismatches_;
};

/// One pass over `order`: acquire, check the bytes on the compute stream, release.
inline void run_order(prefetch::LayerPrefetcher& p, Rig& rig,
                      const std::vector<std::size_t>& order) {
  for (std::size_t l : order) {
    cuda::DeviceSpan span = p.acquire(l);
    rig.check_on_stream(l, span);
    p.release(l);
  }
}

/// 0, 1, ..., n-1.
inline std::vector<std::size_t> forward(std::size_t n) {
  std::vector<std::size_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = i;
  return v;
}

/// Forward then backward in reverse: 0..n-1, n-1..0.
inline std::vector<std::size_t> forward_backward(std::size_t n) {
  std::vector<std::size_t> v = forward(n);
  for (std::size_t i = n; i-- > 0;) v.push_back(i);
  return v;
}

}  // namespace zinf::test
