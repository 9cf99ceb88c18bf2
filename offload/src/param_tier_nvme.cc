// SPDX-License-Identifier: Apache-2.0
// The nvme parameter tier (offload_param.device "nvme"): each layer's low-precision copy is a
// key of a swap store, read ahead of the compute by a LayerPrefetcher in the traced order. An
// update's copy-out is written straight into the key (StoreCopyOut), with the layer suspended
// in the prefetcher so that no read of the key overlaps the write and no copy read before it
// is handed out after it.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "param_tier.h"
#include "zinf/common/align.h"
#include "zinf/prefetch/layer_prefetcher.h"
#include "zinf/swap/buffer_pool.h"
#include "zinf/swap/file.h"
#include "zinf/swap/swap_store.h"

namespace zinf::offload::detail {
namespace {

// With checksums a range write must be whole stripes: 1 MiB keeps a layer's copy-out ranges
// (one per sub-group) few and each read a handful of engine requests.
constexpr std::uint32_t kParamStripe = 1u << 20;

class NvmeTier final : public ParamTier {
 public:
  explicit NvmeTier(const ParamTierContext& c)
      : layers_(c.layers), pinned_bytes_(c.plan.pinned_bytes),
        convert_(adam::CpuAdamOptions{1, std::nullopt}) {
    const EngineConfig& config = c.config;
    swap::IoOptions io = config.io_options();
    io.faults = c.faults;
    engine_ = swap::make_io_engine(io);
    swap::SwapStoreOptions so;
    so.directories = config.nvme_directories(config.offload_param.nvme_path);
    std::uint64_t capacity = 0;
    // A tensor of at least a stripe starts on a stripe boundary: room for that rounding.
    for (const auto& layer : layers_)
      capacity += align_up(align_up(param_bytes(layer), c.plan.alignment), kParamStripe);
    so.capacity_bytes = capacity;
    so.stripe_bytes = kParamStripe;
    so.checksums = config.zinf.checksums;
    so.direct_io = config.zinf.direct_io;
    store_ = std::make_unique<swap::SwapStore>(so, *engine_);
    if (config.zinf.precondition) store_->precondition();
    for (const auto& layer : layers_) store_->allocate(layer.name, param_bytes(layer));

    prefetch::PrefetcherOptions po;
    for (const auto& layer : layers_) po.layer_keys.push_back(layer.name);
    po.depth = config.zinf.prefetch_depth;
    po.staging_bytes = pinned_bytes_;
    po.max_bytes = pinned_bytes_ + std::uint64_t{config.offload_param.buffer_count} *
                                       align_up(config.offload_param.buffer_size * 2, 256);
    po.register_with_engine = engine_.get();
    prefetcher_ = std::make_unique<prefetch::LayerPrefetcher>(po, *store_, c.device, c.compute);
  }

  cuda::DeviceSpan fetch(std::size_t layer) override { return prefetcher_->acquire(layer); }
  void release(std::size_t layer) override { prefetcher_->release(layer); }

  void queue_update(OffloadedOptimizer& optimizer, std::size_t layer,
                    adam::GradView grads, GradHooks hooks) override {
    const LayerSpec& spec = layers_[layer];
    prefetcher_->suspend(layer);
    try {
      optimizer.step_group(layer, grads, StoreCopyOut{store_.get(), spec.name, spec.param_dtype},
                           std::move(hooks));
    } catch (...) {
      prefetcher_->resume(layer);
      throw;
    }
    suspended_.push_back(layer);
  }

  void finish_step(std::span<const std::size_t>, const StepStats& stats) override {
    resume_all();
    prefetcher_->end_iteration();
    written_ += stats.copy_out_bytes;
  }
  void abandon_step() override { resume_all(); }

  void write_from_masters(std::size_t layer, std::span<const float> masters) override {
    const LayerSpec& spec = layers_[layer];
    const std::uint64_t bytes = param_bytes(spec);
    // One layer's padded bytes of ordinary (not pinned) aligned memory, for this call only.
    swap::BufferPoolOptions bo;
    bo.budget_bytes = store_->padded_size(bytes);
    bo.alignment = store_->alignment();
    bo.huge_pages = false;
    swap::BufferPool tmp(bo);
    swap::BufferLease buf = tmp.acquire(store_->padded_size(bytes));
    convert_.copy_out(masters, {buf.data(), static_cast<std::size_t>(spec.numel),
                                spec.param_dtype, true});
    std::memset(buf.data() + bytes, 0, buf.size() - bytes);
    prefetcher_->suspend(layer);
    try {
      store_->swap_out(spec.name, buf.span()).wait();
    } catch (...) {
      prefetcher_->resume(layer);
      throw;
    }
    prefetcher_->resume(layer);
    written_ += bytes;
  }

  std::uint64_t pinned_bytes() const override { return pinned_bytes_; }
  ParamTierStats stats() const override {
    const prefetch::PrefetcherStats p = prefetcher_->stats();
    ParamTierStats s;
    s.bytes_read = p.bytes_read;
    s.bytes_written = written_;
    s.bytes_to_device = p.bytes_to_device;
    s.stall_seconds = std::chrono::duration<double>(p.stall_time).count();
    s.prefetch_hits = p.hits;
    s.prefetch_on_demand = p.on_demand;
    const double busy = std::chrono::duration<double>(p.read_busy_time).count();
    if (busy > 0) s.read_gbps = static_cast<double>(p.bytes_read) / busy / 1e9;
    return s;
  }

 private:
  void resume_all() {
    for (std::size_t l : suspended_) prefetcher_->resume(l);
    suspended_.clear();
  }

  const std::vector<LayerSpec>& layers_;
  std::uint64_t pinned_bytes_;
  adam::CpuAdam convert_;
  // Destroyed prefetcher, store, engine: the prefetcher reads through the store, the store
  // through the engine. (The optimizer's copy-out writes go through the store too: the engine
  // destroys the optimizer before this tier.)
  std::unique_ptr<swap::IoEngine> engine_;
  std::unique_ptr<swap::SwapStore> store_;
  std::unique_ptr<prefetch::LayerPrefetcher> prefetcher_;
  std::vector<std::size_t> suspended_;  // layers whose key the open step rewrites
  std::uint64_t written_ = 0;
};

}  // namespace

ParamTierPlan plan_nvme_param_tier(const EngineConfig& config,
                                   const std::vector<LayerSpec>& layers) {
  ParamTierPlan plan;
  plan.kind = OffloadDevice::kNvme;
  plan.pinned_what = "the parameter staging";
  plan.store_copy_out = true;
  // Each sub-group's copy-out is a range write into the layer's key: 2 x sub_group must be a
  // multiple of the store's alignment (and of its stripe with checksums).
  std::uint32_t align = static_cast<std::uint32_t>(kHostAlign);
  for (const auto& dir : config.nvme_directories(config.offload_param.nvme_path)) {
    align = std::max(align, swap::probe_direct_io_alignment(dir));
  }
  plan.alignment = align;
  plan.copy_out_unit =
      config.zinf.checksums ? std::max<std::uint64_t>(kParamStripe, align) : align;
  std::uint64_t largest_padded = 0;
  for (const auto& layer : layers) {
    largest_padded = std::max(largest_padded, align_up(param_bytes(layer), align));
  }
  // Staging for the prefetch window: depth + 2 layers in flight, as the prefetcher sizes its
  // device buffers.
  plan.pinned_bytes = (std::uint64_t{config.zinf.prefetch_depth} + 2) * largest_padded;
  return plan;
}

std::unique_ptr<ParamTier> make_nvme_param_tier(const ParamTierContext& context) {
  return std::make_unique<NvmeTier>(context);
}

}  // namespace zinf::offload::detail
