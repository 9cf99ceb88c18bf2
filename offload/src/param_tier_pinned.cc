// SPDX-License-Identifier: Apache-2.0
// The pinned parameter tier (offload_param.device "cpu"): each layer's low-precision copy lives
// in pinned host memory, which an update's copy-out writes in place. A LayerPrefetcher with the
// host source brings layers to the device ahead of use, with the nvme tier's window, traced
// order and on-demand fallback, within offload_param.buffer_count device buffers; the copies go
// straight from the pinned copies (no staging). A layer is suspended in the prefetcher while
// its copy is rewritten, and suspend waits for any copy still reading it, so a copy never reads
// a half-written layer and a copy made before the rewrite is never handed out after it.
#include <algorithm>
#include <chrono>
#include <vector>

#include "param_tier.h"
#include "zinf/common/align.h"
#include "zinf/prefetch/layer_prefetcher.h"
#include "zinf/swap/buffer_pool.h"

namespace zinf::offload::detail {
namespace {


class PinnedTier final : public ParamTier {
 public:
  explicit PinnedTier(const ParamTierContext& c)
      : layers_(c.layers),
        pinned_bytes_(c.plan.pinned_bytes),
        convert_(adam::CpuAdamOptions{1, std::nullopt}) {
    const EngineConfig& config = c.config;
    swap::BufferPoolOptions bo;
    bo.budget_bytes = pinned_bytes_;
    bo.alignment = static_cast<std::uint32_t>(kHostAlign);
    bo.huge_pages = true;
    host_pool_ = std::make_unique<swap::BufferPool>(bo);
    host_pinned_ = c.device.register_host(host_pool_->arena());
    std::vector<std::span<const std::byte>> host_layers;
    for (const auto& layer : layers_) {
      copies_.push_back(host_pool_->acquire(align_up(param_bytes(layer), kHostAlign)));
      host_layers.push_back(copies_.back().span().first(param_bytes(layer)));
    }

    prefetch::PrefetcherOptions po;
    po.depth = config.zinf.prefetch_depth;
    // The device-side pool: buffer_count buffers of buffer_size elements, as the nvme tier's
    // device share; there is no staging to count.
    po.max_bytes = std::uint64_t{config.offload_param.buffer_count} *
                   align_up(config.offload_param.buffer_size * 2, 256);
    prefetcher_ = std::make_unique<prefetch::LayerPrefetcher>(po, std::move(host_layers), c.device,
                                                              c.compute);
  }

  cuda::DeviceSpan fetch(std::size_t layer) override { return prefetcher_->acquire(layer); }
  void release(std::size_t layer) override { prefetcher_->release(layer); }

  void queue_update(optim::OffloadedOptimizer& optimizer, std::size_t layer, adam::GradView grads,
                    GradHooks hooks) override {
    // The copy-out writes the pinned copy in place while the step runs: no copy may read it
    // meanwhile (suspend waits for one in flight), and none made before may be handed out.
    prefetcher_->suspend(layer);
    try {
      optimizer.step_group(layer, grads, copy_out(layer), std::move(hooks));
    } catch (...) {
      prefetcher_->resume(layer);
      throw;
    }
    suspended_.push_back(layer);
  }

  void finish_step(std::span<const std::size_t>, const StepStats&) override {
    resume_all();
    prefetcher_->end_iteration();
  }
  void abandon_step() override { resume_all(); }

  void write_from_masters(std::size_t layer, std::span<const float> masters) override {
    prefetcher_->suspend(layer);
    try {
      convert_.copy_out(masters, copy_out(layer));
    } catch (...) {
      prefetcher_->resume(layer);
      throw;
    }
    prefetcher_->resume(layer);
  }

  std::uint64_t pinned_bytes() const override { return pinned_bytes_; }
  ParamTierStats stats() const override {
    const prefetch::PrefetcherStats p = prefetcher_->stats();
    ParamTierStats s;
    s.bytes_to_device = p.bytes_to_device;
    s.stall_seconds = std::chrono::duration<double>(p.stall_time).count();
    s.prefetch_hits = p.hits;
    s.prefetch_on_demand = p.on_demand;
    return s;
  }

 private:
  void resume_all() {
    for (std::size_t l : suspended_) prefetcher_->resume(l);
    suspended_.clear();
  }

  adam::CopyOut copy_out(std::size_t layer) {
    return {copies_[layer].data(), static_cast<std::size_t>(layers_[layer].numel),
            layers_[layer].param_dtype, true};
  }

  const std::vector<LayerSpec>& layers_;
  std::uint64_t pinned_bytes_;
  adam::CpuAdam convert_;
  // The pool and its registration before the copies that use them, and the prefetcher, which
  // copies from them, last (destroyed first: it waits for its copies and the compute stream).
  std::unique_ptr<swap::BufferPool> host_pool_;
  cuda::PinnedRegistration host_pinned_;
  std::vector<swap::BufferLease> copies_;
  std::unique_ptr<prefetch::LayerPrefetcher> prefetcher_;
  std::vector<std::size_t> suspended_;  // layers whose pinned copy the open step rewrites
};

}  // namespace

std::unique_ptr<ParamTier> make_pinned_param_tier(const ParamTierContext& context) {
  return std::make_unique<PinnedTier>(context);
}

}  // namespace zinf::offload::detail
