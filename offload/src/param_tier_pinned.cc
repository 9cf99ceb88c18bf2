// SPDX-License-Identifier: Apache-2.0
// The pinned parameter tier (offload_param.device "cpu"): each layer's low-precision copy lives
// in pinned host memory, which an update's copy-out writes in place; fetch copies it into one
// of offload_param.buffer_count device buffers (least recently used first), or reuses a buffer
// that still holds the layer's current bytes.
#include <algorithm>
#include <chrono>
#include <limits>
#include <vector>

#include "param_tier.h"
#include "zinf/common/align.h"
#include "zinf/common/error.h"
#include "zinf/swap/buffer_pool.h"

namespace zinf::offload::detail {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::size_t kNone = std::numeric_limits<std::size_t>::max();

class PinnedTier final : public ParamTier {
 public:
  explicit PinnedTier(const ParamTierContext& c)
      : layers_(c.layers), device_(c.device), compute_(c.compute),
        pinned_bytes_(c.plan.pinned_bytes), convert_(adam::CpuAdamOptions{1, std::nullopt}) {
    swap::BufferPoolOptions bo;
    bo.budget_bytes = pinned_bytes_;
    bo.alignment = static_cast<std::uint32_t>(kHostAlign);
    bo.huge_pages = true;
    host_pool_ = std::make_unique<swap::BufferPool>(bo);
    host_pinned_ = device_.register_host(host_pool_->arena());
    state_.resize(layers_.size());
    std::uint64_t largest = 0;
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      state_[i].pinned = host_pool_->acquire(align_up(param_bytes(layers_[i]), kHostAlign));
      state_[i].host_read = device_.create_event();
      largest = std::max(largest, param_bytes(layers_[i]));
    }
    pool_.resize(std::min<std::size_t>(c.config.offload_param.buffer_count, layers_.size()));
    for (auto& b : pool_) {
      b.buffer = device_.allocate(largest);
      b.released = device_.create_event();
    }
  }

  cuda::DeviceSpan fetch(std::size_t layer) override {
    Layer& st = state_[layer];
    const std::uint64_t bytes = param_bytes(layers_[layer]);
    const auto entered = Clock::now();
    // A buffer that still holds this layer's current bytes is reused without a copy (reads
    // only, ordered on the compute stream after its earlier use).
    std::size_t pick = kNone;
    for (std::size_t b = 0; b < pool_.size(); ++b) {
      if (!pool_[b].held && pool_[b].layer == layer && pool_[b].version == st.version) pick = b;
    }
    if (pick == kNone) {
      // Else the least recently used free buffer, once the compute stream is past its release.
      for (std::size_t b = 0; b < pool_.size(); ++b) {
        if (pool_[b].held) continue;
        if (pick == kNone || pool_[b].last_use < pool_[pick].last_use) pick = b;
      }
      if (pick == kNone) {
        throw UsageError("OffloadEngine::fetch: all " + std::to_string(pool_.size()) +
                         " parameter buffers (offload_param.buffer_count) hold fetched layers; "
                         "release some first");
      }
      DevBuf& b = pool_[pick];
      b.released.synchronize();  // blocks only while the stream still uses the buffer
      device_.copy_to_device(compute_, b.buffer.span(0, bytes), st.pinned.span().first(bytes));
      device_.record(st.host_read, compute_);
      b.layer = layer;
      b.version = st.version;
      to_device_ += bytes;
    }
    DevBuf& b = pool_[pick];
    b.held = true;
    b.last_use = ++use_clock_;
    st.buffer = pick;
    stall_seconds_ += std::chrono::duration<double>(Clock::now() - entered).count();
    return b.buffer.span(0, bytes);
  }

  void release(std::size_t layer) override {
    Layer& st = state_[layer];
    DevBuf& b = pool_[st.buffer];
    device_.record(b.released, compute_);
    b.held = false;
    st.buffer = kNone;
  }

  void queue_update(OffloadedOptimizer& optimizer, std::size_t layer,
                    adam::GradView grads, GradHooks hooks) override {
    Layer& st = state_[layer];
    st.host_read.synchronize();  // the last fetch's copy has read the pinned copy
    optimizer.step_group(layer, grads, copy_out(layer), std::move(hooks));
    ++st.version;  // device buffers holding the old bytes are stale from now on
  }
  void finish_step(std::span<const std::size_t>, const StepStats&) override {}
  void abandon_step() override {}

  void write_from_masters(std::size_t layer, std::span<const float> masters) override {
    Layer& st = state_[layer];
    st.host_read.synchronize();
    convert_.copy_out(masters, copy_out(layer));
    ++st.version;
  }

  std::uint64_t pinned_bytes() const override { return pinned_bytes_; }
  ParamTierStats stats() const override {
    ParamTierStats s;
    s.bytes_to_device = to_device_;
    s.stall_seconds = stall_seconds_;
    return s;
  }

 private:
  struct Layer {
    swap::BufferLease pinned;  // the pinned host copy
    cuda::Event host_read;     // the latest copy from it to a device buffer
    std::uint64_t version = 0;  // bumped whenever the host copy changes
    std::size_t buffer = kNone;  // the device buffer holding it while fetched
  };
  // One device buffer of the bounded pool.
  struct DevBuf {
    cuda::DeviceBuffer buffer;
    cuda::Event released;      // recorded on the compute stream by release()
    std::size_t layer = kNone;  // whose bytes it holds (valid if version matches)
    std::uint64_t version = 0;
    bool held = false;
    std::uint64_t last_use = 0;
  };

  adam::CopyOut copy_out(std::size_t layer) {
    return {state_[layer].pinned.data(), static_cast<std::size_t>(layers_[layer].numel),
            layers_[layer].param_dtype, true};
  }

  const std::vector<LayerSpec>& layers_;
  cuda::Device& device_;
  cuda::StreamRef compute_;
  std::uint64_t pinned_bytes_;
  adam::CpuAdam convert_;
  // The pool and its registration before the leases and buffers that use them (destroyed
  // after them).
  std::unique_ptr<swap::BufferPool> host_pool_;
  cuda::PinnedRegistration host_pinned_;
  std::vector<Layer> state_;
  std::vector<DevBuf> pool_;
  std::uint64_t use_clock_ = 0;
  std::uint64_t to_device_ = 0;
  double stall_seconds_ = 0;  // fetch blocked for a free device buffer
};

}  // namespace

std::unique_ptr<ParamTier> make_pinned_param_tier(const ParamTierContext& context) {
  return std::make_unique<PinnedTier>(context);
}

}  // namespace zinf::offload::detail
