// SPDX-License-Identifier: Apache-2.0
// The nvme parameter tier (offload_param.device "nvme"): each layer's low-precision copy is a
// layer of a prefetch::LayerStore (a swap store key read ahead in the traced order; the same
// store zinf.torch's offload_parameters runs on). An update's copy-out is written straight
// into the key (StoreCopyOut), with the layer suspended so that no read of the key overlaps
// the write and no copy read before it is handed out after it.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "param_tier.h"
#include "zinf/common/align.h"
#include "zinf/prefetch/layer_store.h"
#include "zinf/swap/swap_store.h"

namespace zinf::offload::detail {
namespace {

// With checksums a range write must be whole stripes: the store's default stripe (1 MiB)
// keeps a layer's copy-out ranges (one per sub-group) few and each read a handful of engine
// requests.
constexpr std::uint32_t kParamStripe = swap::SwapStoreOptions{}.stripe_bytes;

class NvmeTier final : public ParamTier {
 public:
  explicit NvmeTier(const ParamTierContext& c)
      : layers_(c.layers), pinned_bytes_(c.plan.pinned_bytes),
        convert_(adam::CpuAdamOptions{1, std::nullopt}) {
    const EngineConfig& config = c.config;
    prefetch::LayerStoreOptions o;
    for (const auto& layer : layers_) {
      o.keys.push_back(layer.name);
      o.bytes.push_back(param_bytes(layer));
    }
    o.directories = config.nvme_directories(config.offload_param.nvme_path);
    o.io = config.io_options();
    o.io.faults = c.faults;
    o.alignment = c.plan.alignment;  // probed by plan_nvme_param_tier
    o.checksums = config.zinf.checksums;
    o.direct_io = config.zinf.direct_io;
    o.precondition = config.zinf.precondition;
    o.depth = config.zinf.prefetch_depth;
    o.staging_bytes = pinned_bytes_;
    o.device_bytes = std::uint64_t{config.offload_param.buffer_count} *
                     align_up(config.offload_param.buffer_size * 2, 256);
    layers_store_ = std::make_unique<prefetch::LayerStore>(o, c.device, c.compute);
  }

  cuda::DeviceSpan fetch(std::size_t layer) override { return layers_store_->acquire(layer); }
  void release(std::size_t layer) override { layers_store_->release(layer); }

  void queue_update(optim::OffloadedOptimizer& optimizer, std::size_t layer, adam::GradView grads,
                    GradHooks hooks) override {
    const LayerSpec& spec = layers_[layer];
    layers_store_->suspend(layer);
    try {
      optimizer.step_group(
          layer, grads, optim::StoreCopyOut{&layers_store_->store(), spec.name, spec.param_dtype},
          std::move(hooks));
    } catch (...) {
      layers_store_->resume(layer);
      throw;
    }
    suspended_.push_back(layer);
  }

  void finish_step(std::span<const std::size_t>, const StepStats& stats) override {
    resume_all();
    layers_store_->end_iteration();
    copied_out_ += stats.copy_out_bytes;
  }
  void abandon_step() override { resume_all(); }

  void write_from_masters(std::size_t layer, std::span<const float> masters) override {
    const LayerSpec& spec = layers_[layer];
    layers_store_->write(layer, [&](std::span<std::byte> buf) {
      convert_.copy_out(masters, {buf.data(), static_cast<std::size_t>(spec.numel),
                                  spec.param_dtype, true});
    });
  }

  std::uint64_t pinned_bytes() const override { return pinned_bytes_; }
  ParamTierStats stats() const override {
    const prefetch::PrefetcherStats p = layers_store_->prefetch_stats();
    ParamTierStats s;
    s.bytes_read = p.bytes_read;
    s.bytes_written = copied_out_ + layers_store_->bytes_written();
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
    for (std::size_t l : suspended_) layers_store_->resume(l);
    suspended_.clear();
  }

  const std::vector<LayerSpec>& layers_;
  std::uint64_t pinned_bytes_;
  adam::CpuAdam convert_;
  // The optimizer's copy-out writes go through the store too: the engine destroys the
  // optimizer before this tier.
  std::unique_ptr<prefetch::LayerStore> layers_store_;
  std::vector<std::size_t> suspended_;  // layers whose key the open step rewrites
  std::uint64_t copied_out_ = 0;
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
  const std::uint32_t align =
      swap::store_alignment(config.nvme_directories(config.offload_param.nvme_path));
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
