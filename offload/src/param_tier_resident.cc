// SPDX-License-Identifier: Apache-2.0
// The resident parameter tier (offload_param.device "none"): each layer's low-precision copy
// stays on the device. An update's copy-out goes to a host copy, which step() copies to the
// device in stream order, so compute enqueued before the step sees the old parameters and
// compute enqueued after it the new ones.
#include <vector>

#include "param_tier.h"

namespace zinf::offload::detail {
namespace {

class ResidentTier final : public ParamTier {
 public:
  explicit ResidentTier(const ParamTierContext& c)
      : layers_(c.layers),
        device_(c.device),
        compute_(c.compute),
        convert_(adam::CpuAdamOptions{.threads = 1}) {
    state_.resize(layers_.size());
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      state_[i].host.assign(layers_[i].numel, 0);
      state_[i].resident = device_.allocate(param_bytes(layers_[i]));
      state_[i].host_read = device_.create_event();
    }
  }

  cuda::DeviceSpan fetch(std::size_t layer) override { return state_[layer].resident.span(); }
  void release(std::size_t) override {}

  void queue_update(optim::OffloadedOptimizer& optimizer, std::size_t layer, adam::GradView grads,
                    GradHooks hooks) override {
    Layer& st = state_[layer];
    st.host_read.synchronize();  // the last refresh has read the host copy
    optimizer.step_group(layer, grads,
                         adam::CopyOut{st.host.data(), st.host.size(), layers_[layer].param_dtype,
                                       true},
                         std::move(hooks));
  }

  void finish_step(std::span<const std::size_t> updated, const StepStats&) override {
    for (std::size_t layer : updated) refresh(layer);
  }
  void abandon_step() override {}

  void write_from_masters(std::size_t layer, std::span<const float> masters) override {
    Layer& st = state_[layer];
    st.host_read.synchronize();  // the previous refresh no longer reads the host copy
    convert_.copy_out(masters,
                      {st.host.data(), st.host.size(), layers_[layer].param_dtype, true});
    refresh(layer);
    st.host_read.synchronize();
  }

  std::uint64_t pinned_bytes() const override { return 0; }
  ParamTierStats stats() const override {
    ParamTierStats s;
    s.bytes_to_device = to_device_;
    return s;
  }

 private:
  struct Layer {
    std::vector<std::uint16_t> host;  // what the copy-out writes
    cuda::DeviceBuffer resident;      // the device copy
    cuda::Event host_read;            // the latest copy from `host` to `resident`
  };

  // Copies the host copy to the device copy in stream order.
  void refresh(std::size_t layer) {
    Layer& st = state_[layer];
    device_.copy_to_device(compute_, st.resident.span(),
                           std::as_bytes(std::span<const std::uint16_t>(st.host)));
    device_.record(st.host_read, compute_);
    to_device_ += param_bytes(layers_[layer]);
  }

  const std::vector<LayerSpec>& layers_;
  cuda::Device& device_;
  cuda::StreamRef compute_;
  adam::CpuAdam convert_;  // the kernel's own rounding, for copies from the masters
  std::vector<Layer> state_;
  std::uint64_t to_device_ = 0;
};

}  // namespace

std::unique_ptr<ParamTier> make_resident_param_tier(const ParamTierContext& context) {
  return std::make_unique<ResidentTier>(context);
}

}  // namespace zinf::offload::detail
