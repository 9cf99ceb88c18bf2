// SPDX-License-Identifier: Apache-2.0
#include "prefetch_worker.h"

#include <algorithm>
#include <random>
#include <span>
#include <vector>

#include "stamp.h"
#include "zinf/common/error.h"
#include "zinf/cuda/device.h"
#include "zinf/prefetch/layer_prefetcher.h"
#include "zinf/swap/buffer_pool.h"
#include "zinf/swap/io_engine.h"
#include "zinf/swap/swap_store.h"

namespace zinf::tools::stress {

// Layers of odd sizes in a SwapStore, read through a LayerPrefetcher onto the run's device (the
// host simulation or a GPU), within its share of --gpu-mem; every acquired layer is copied
// back from the device and checked. One segment is a prefetcher's life:
// two iterations of forward then backward order. A read ahead is not tied to one acquire, so
// faults are attributed per segment: hard faults injected in a segment must have surfaced as
// at least one acquire error in it, and no error may surface without one.
class PrefetchWorker::Impl {
 public:
  static constexpr std::size_t kLayers = 6;
  static constexpr std::size_t kDepth = 2;

  explicit Impl(const Shared& sh)
      : sh_(sh),
        rng_(sh.cfg->seed * 15485863 + 2),
        plan_(make_plan(sh.cfg->fault_rate, sh.cfg->seed * 15485863 + 2)) {
    engine_ = swap::make_io_engine(io_options(*sh.cfg, plan_));
    // Staging is half the pinned share; the largest layer an eighth of the smaller of the
    // pinned share and the device memory, so that the window holds depth + 2 layers in both.
    const std::uint64_t share = std::min(sh.prefetch_budget, sh.prefetch_device_bytes);
    max_layer_ = std::max<std::uint64_t>(4096, share / 8 / 4096 * 4096 - 4096);
    for (std::size_t l = 0; l < kLayers; ++l) {
      sizes_.push_back(std::uniform_int_distribution<std::uint64_t>(1, max_layer_)(rng_));
    }
    sizes_[0] = max_layer_;  // one whole-block layer, the rest odd
    store_ =
        make_store(sh, *engine_, kLayers * (max_layer_ + kStripe * (sh.store_dirs.size() + 1)));
    unit_ = store_->alignment();
    gens_.assign(kLayers, 0);
    compute_ = sh.device->create_stream();
    host_.resize(max_layer_);
    for (std::size_t l = 0; l < kLayers; ++l) store_->allocate(key(l), sizes_[l]);
  }

  void run() {
    for (std::size_t l = 0; l < kLayers; ++l) write_until_done(l);
    while (sh_.running()) {
      if (tally_.prefetch_passes > 0) write_until_done(static_cast<std::size_t>(rng_() % kLayers));
      segment();
    }
    tally_.injected = counts_of(plan_.get());
  }

  Tally& tally() { return tally_; }
  std::uint64_t staging_bytes() const { return sh_.prefetch_budget / 2; }
  std::uint64_t peak_held() const { return peak_held_; }

 private:
  static std::string key(std::size_t l) { return "layer" + std::to_string(l); }
  static std::uint32_t uid(std::size_t l) { return static_cast<std::uint32_t>(l + 1); }

  // Writes layer `l` whole with a new generation, retrying while faults fail the write.
  void write_until_done(std::size_t l) {
    const std::uint64_t padded = store_->padded_size(sizes_[l]);
    // Layer writes borrow the swap workers' pool: their memory is counted in its peak.
    swap::BufferLease lease = sh_.swap_pool->acquire(padded);
    for (int attempt = 0; attempt < 1000; ++attempt) {
      const std::uint32_t gen = ++next_gen_;
      fill(lease.span().first(padded), uid(l), gen, 0);
      const FaultCounts before = counts_of(plan_.get());
      OpError err;
      try {
        err = error_of(store_->swap_out(key(l), lease.span()).wait_status());
      } catch (const IoError& e) {
        err = error_of(e);
      }
      ++tally_.prefetch_layer_writes;
      judge_operation(tally_, "swap_out " + key(l), counts_of(plan_.get()) - before, err);
      if (!err.failed) {
        gens_[l] = gen;
        tally_.bytes_written += padded;
        return;
      }
    }
    throw Error("prefetch worker: layer " + key(l) + " not written in 1000 attempts");
  }

  void segment() {
    prefetch::PrefetcherOptions po;
    for (std::size_t l = 0; l < kLayers; ++l) po.layer_keys.push_back(key(l));
    for (std::size_t l = 0; l < kLayers; ++l) po.order.push_back(l);
    for (std::size_t l = kLayers; l-- > 0;) po.order.push_back(l);
    po.depth = kDepth;
    po.max_bytes = sh_.prefetch_device_bytes;
    po.staging_bytes = staging_bytes();
    const FaultCounts before = counts_of(plan_.get());
    std::uint64_t errors = 0;
    std::string first_error;
    OpError other;
    std::uint64_t dropped = 0;
    {
      prefetch::LayerPrefetcher p(po, *store_, *sh_.device, compute_.ref());
      try {
        for (int iter = 0; iter < 2; ++iter) {
          for (std::size_t l : po.order) acquire_and_check(p, l, errors, first_error);
          if (iter == 0) p.end_iteration();
        }
      } catch (const Error& e) {
        other = error_of(e);  // not a read failure of a layer: judged below
      }
      // The window has read ahead into the next iteration: let those reads finish, so that
      // the counts are final. A failed read nobody acquired is then in read_failures but in
      // no acquire's error; the destructor logs it (a warning naming file, offset, length).
      p.wait_for_reads();
      const prefetch::PrefetcherStats st = p.stats();
      if (st.read_failures > errors) dropped = st.read_failures - errors;
      peak_held_ = std::max(peak_held_, st.peak_held_bytes);
    }  // the destructor waits for every read in flight, so the plan's counts are final
    ++tally_.prefetch_passes;
    tally_.prefetch_reads_dropped += dropped;
    const FaultCounts delta = counts_of(plan_.get()) - before;
    if (other.failed) {
      judge_operation(tally_, "prefetch segment", FaultCounts{}, other);
      return;
    }
    const std::string what = "prefetch segment " + std::to_string(tally_.prefetch_passes);
    if (errors == 0 && dropped > 0 && delta.hard() > 0) {
      // Surfaced as the prefetcher's warning: the only failed reads were of layers read
      // ahead and never acquired (nothing was handed out from them).
      ++tally_.failed_ops;
      tally_.hard_surfaced += delta.hard();
      return;
    }
    OpError seg;
    if (errors > 0) seg = {true, ErrorCode::kIo, first_error};
    if (errors > 0 && delta.hard() > 0) tally_.failed_ops += errors - 1;  // judge adds one
    judge_operation(tally_, what, delta, seg);
  }

  void acquire_and_check(prefetch::LayerPrefetcher& p, std::size_t l, std::uint64_t& errors,
                         std::string& first_error) {
    cuda::DeviceSpan span;
    for (int attempt = 0;; ++attempt) {
      try {
        span = p.acquire(l);
        break;
      } catch (const IoError& e) {
        // The layer is dropped; acquiring it again reads it again.
        ++errors;
        if (first_error.empty()) first_error = e.what();
        if (e.code() == ErrorCode::kCorrupt || attempt >= 100) throw;
      }
    }
    ++tally_.prefetch_acquires;
    std::span<std::byte> out(host_.data(), sizes_[l]);
    sh_.device->copy_to_host(compute_.ref(), out, span);
    p.release(l);
    sh_.device->synchronize(compute_.ref());
    const std::uint32_t gen = gens_[l];
    const std::string bad = check(out, uid(l), 0, unit_, [gen](std::uint64_t) { return gen; });
    if (!bad.empty()) {
      ++tally_.mismatches;
      tally_.problem("prefetch " + key(l) + ": mismatch at " + bad);
      return;
    }
    tally_.bytes_verified += sizes_[l];
    sh_.verified(sizes_[l]);
  }

  const Shared& sh_;
  std::mt19937_64 rng_;
  std::shared_ptr<swap::FaultPlan> plan_;
  std::unique_ptr<swap::IoEngine> engine_;
  std::uint64_t max_layer_ = 0;
  std::vector<std::uint64_t> sizes_;
  std::unique_ptr<swap::SwapStore> store_;
  std::uint64_t unit_ = 4096;
  std::vector<std::uint32_t> gens_;
  std::uint32_t next_gen_ = 0;
  cuda::Stream compute_;
  std::vector<std::byte> host_;
  std::uint64_t peak_held_ = 0;
  Tally tally_;
};

PrefetchWorker::PrefetchWorker(const Shared& sh) : impl_(std::make_unique<Impl>(sh)) {}
PrefetchWorker::~PrefetchWorker() = default;
void PrefetchWorker::run() { return impl_->run(); }
Tally& PrefetchWorker::tally() { return impl_->tally(); }
std::uint64_t PrefetchWorker::staging_bytes() const { return impl_->staging_bytes(); }
std::uint64_t PrefetchWorker::peak_held() const { return impl_->peak_held(); }

}  // namespace zinf::tools::stress
