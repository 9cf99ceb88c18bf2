// SPDX-License-Identifier: Apache-2.0
// OffloadEngine: construction from the plan (engine_plan.h: every check of the config against
// the layers, the pinned budget, the optimizer's options), the layer bookkeeping (which layer is
// fetched, which has gradients, which step is open), the master weights, fetch and release and
// the hyper-parameters. The engine's other parts share OffloadEngine::Impl (engine_impl.h): the
// gradients' intake (engine_grads.cc), the step (engine_step.cc), checkpoints
// (engine_checkpoint.cc), the drive notices (engine_notices.cc), the statistics
// (engine_stats.cc) and the seams (engine_seams.cc). What differs by parameter tier is behind
// ParamTier (param_tier.h); the staged step mode's gradients and loss scale are behind
// GradientStage (grad_stage.h) and LossScaler (loss_scale.h).
#include "zinf/offload/engine.h"

#include <string>
#include <utility>

#include "engine_impl.h"
#include "zinf/common/error.h"
#include "zinf/common/log.h"

namespace zinf::offload {

using detail::in_quotes;

OffloadEngine::Impl::Impl(EngineConfig c, std::vector<LayerSpec> l, cuda::Device& d,
                          cuda::StreamRef s, const test_hooks::EngineFaults& faults)
    : config(std::move(c)), layers(std::move(l)), device(d), compute(s) {
  if (compute.empty() || compute.device() != &device) {
    throw UsageError("OffloadEngine: the compute stream must be a stream of device " +
                     std::string(device.name()));
  }
  // ---- The plan: every check of the config against the layers, before any file.
  detail::EnginePlan plan = detail::plan_engine(config, layers);
  // Info, not notice: the default 1e9 is rounded on every run, by a few thousand elements.
  if (!plan.sub_group_note.empty()) log(LogLevel::kInfo, plan.sub_group_note);
  if (!plan.budget_error.empty()) throw UsageError(plan.budget_error);
  start_notices(plan);

  // ---- Construction: the tier first (its files, then the optimizer's).
  grad_slot_bytes = plan.grad_slot_bytes;
  mode = plan.mode;
  state.resize(layers.size());
  params = detail::make_param_tier({plan.params, config, layers, device, compute, faults.param});
  optimizer_options = plan.optimizer;  // a checkpoint reader (engine_seams.h) injects no faults
  optim::OptimizerOptions oo = plan.optimizer;
  oo.io.faults = faults.optimizer;
  optimizer = std::make_unique<optim::OffloadedOptimizer>(std::move(oo), plan.groups);
  if (plan.stage) {
    if (plan.stage->nvme) plan.stage->io.faults = faults.grad_stage;
    stage = std::make_unique<detail::GradientStage>(std::move(*plan.stage));
    scaler = detail::LossScaler(config.loss_scaling);
  }
}

OffloadEngine::Impl::~Impl() {
  // An open step still writes: let it finish before anything it uses goes.
  if (step_open && optimizer) {
    try {
      (void)optimizer->end_step();
    } catch (const std::exception& e) {
      log(LogLevel::kWarning, std::string("OffloadEngine destroyed inside a step: ") + e.what());
    }
  }
  // Work enqueued on the compute stream may still read the device copies and buffers.
  try {
    device.synchronize(compute);
  } catch (const std::exception& e) {
    log(LogLevel::kDebug,
        std::string("OffloadEngine: compute stream failed before destruction: ") + e.what());
  }
}

OffloadEngine::Impl::Layer& OffloadEngine::Impl::layer_at(std::size_t index, const char* op) {
  if (index >= state.size()) {
    throw UsageError(std::string("OffloadEngine::") + op + ": layer " + std::to_string(index) +
                     " out of range (" + std::to_string(state.size()) + " layers)");
  }
  return state[index];
}

void OffloadEngine::Impl::check_outside_step(const char* op) const {
  if (step_open) {
    throw UsageError(std::string("OffloadEngine::") + op +
                     " inside a step (gradients were handed in; call step() first)");
  }
  for (std::size_t i = 0; i < state.size(); ++i) {
    if (state[i].fetched) {
      throw UsageError(std::string("OffloadEngine::") + op + " while layer " +
                       in_quotes(layers[i].name) + " is fetched (release it first)");
    }
  }
}

void OffloadEngine::Impl::fail(const Status& cause) {
  if (!failure) {
    failure = cause;
    log(LogLevel::kError, "OffloadEngine failed, refusing further work: " + cause.to_string());
  }
}

void OffloadEngine::Impl::write_low_precision(std::size_t index, std::span<const float> masters) {
  params->write_from_masters(index, masters);
}

// ---------------------------------------------------------------------------------------------
// Public API

OffloadEngine::OffloadEngine(EngineConfig config, std::vector<LayerSpec> layers,
                             cuda::Device& device, cuda::StreamRef compute_stream)
    : OffloadEngine(std::move(config), std::move(layers), device, compute_stream,
                    test_hooks::EngineFaults{}) {}

OffloadEngine::OffloadEngine(EngineConfig config, std::vector<LayerSpec> layers,
                             cuda::Device& device, cuda::StreamRef compute_stream,
                             const test_hooks::EngineFaults& faults)
    : impl_(std::make_unique<Impl>(std::move(config), std::move(layers), device, compute_stream,
                                   faults)) {}

OffloadEngine::~OffloadEngine() = default;

std::size_t OffloadEngine::layer_count() const noexcept { return impl_->layers.size(); }

const LayerSpec& OffloadEngine::layer(std::size_t index) const {
  (void)impl_->layer_at(index, "layer");
  return impl_->layers[index];
}

const EngineConfig& OffloadEngine::config() const noexcept { return impl_->config; }

void OffloadEngine::set_master_weights(std::size_t index, std::span<const float> weights) {
  Impl& m = *impl_;
  m.check_usable();
  Impl::Layer& st = m.layer_at(index, "set_master_weights");
  m.check_outside_step("set_master_weights");
  const LayerSpec& spec = m.layers[index];
  if (weights.size() != spec.numel) {
    throw UsageError("OffloadEngine::set_master_weights: layer " + in_quotes(spec.name) + " has " +
                     std::to_string(spec.numel) + " elements, got " +
                     std::to_string(weights.size()));
  }
  m.optimizer->set_params(index, weights);
  st.master_set = false;
  m.write_low_precision(index, weights);
  st.master_set = true;
}

void OffloadEngine::read_master_weights(std::size_t index, std::span<float> out) {
  Impl& m = *impl_;
  m.check_usable();
  (void)m.layer_at(index, "read_master_weights");
  if (m.step_open) {
    throw UsageError("OffloadEngine::read_master_weights inside a step (call step() first)");
  }
  m.optimizer->read_state(index, out, {}, {});
}

cuda::DeviceSpan OffloadEngine::fetch(std::size_t index) {
  Impl& m = *impl_;
  m.check_usable();
  Impl::Layer& st = m.layer_at(index, "fetch");
  const std::string& name = m.layers[index].name;
  if (st.fetched)
    throw UsageError("OffloadEngine::fetch: layer " + in_quotes(name) +
                     " is already fetched (release it first)");
  if (st.has_grads) {
    throw UsageError("OffloadEngine::fetch: layer " + in_quotes(name) +
                     " has its gradients handed in for this step; fetch it after step()");
  }
  if (!st.master_set) {
    throw UsageError("OffloadEngine::fetch: layer " + in_quotes(name) +
                     " has no weights yet (set_master_weights or load first)");
  }
  const cuda::DeviceSpan span = m.params->fetch(index);  // IoError as is
  st.fetched = true;
  return span;
}

void OffloadEngine::release(std::size_t index) {
  Impl& m = *impl_;
  m.check_usable();
  Impl::Layer& st = m.layer_at(index, "release");
  if (!st.fetched) {
    throw UsageError("OffloadEngine::release: layer " + in_quotes(m.layers[index].name) +
                     " is not fetched");
  }
  m.params->release(index);
  st.fetched = false;
}

void OffloadEngine::set_hyper(const adam::AdamParams& hyper) {
  impl_->check_usable();
  if (impl_->step_open)
    throw UsageError("OffloadEngine::set_hyper inside a step (call step() first)");
  impl_->optimizer->set_hyper(hyper);
}

void OffloadEngine::set_hyper(std::size_t index, const adam::AdamParams& hyper) {
  impl_->check_usable();
  (void)impl_->layer_at(index, "set_hyper");
  const LayerSpec& spec = impl_->layers[index];
  if (impl_->step_open)
    throw UsageError("OffloadEngine::set_hyper inside a step (call step() first)");
  if (auto bad = adam::check_adam_params(hyper)) {
    throw UsageError("OffloadEngine::set_hyper: layer " + in_quotes(spec.name) + ": " +
                     std::string(bad->field) + " " + bad->what);
  }
  impl_->optimizer->set_hyper(index, hyper);  // layer i is optimizer group i
}

adam::AdamParams OffloadEngine::hyper() const { return impl_->optimizer->hyper(); }

adam::AdamParams OffloadEngine::hyper(std::size_t index) const {
  (void)impl_->layer_at(index, "hyper");
  return impl_->optimizer->hyper(index);
}

double OffloadEngine::loss_scale() const noexcept { return impl_->scaler.scale(); }

StepMode OffloadEngine::step_mode() const noexcept { return impl_->mode; }

}  // namespace zinf::offload
