// SPDX-License-Identifier: Apache-2.0
// OffloadEngine: validation of a config against the layers (before any file exists), the pinned
// budget, the optimizer tiers through OffloadedOptimizer, the step bookkeeping (which layer is
// fetched, which has gradients, which step is open), checkpoints and statistics. What differs by
// parameter tier is behind ParamTier (param_tier.h); the staged step mode's gradients and loss
// scale are behind GradientStage (grad_stage.h) and LossScaler (loss_scale.h).
#include "zinf/offload/engine.h"

#include <algorithm>
#include <chrono>
#include <cfloat>
#include <cmath>
#include <condition_variable>
#include <functional>
#include <limits>
#include <mutex>
#include <optional>
#include <sstream>
#include <utility>

#include "engine_plan.h"
#include "grad_stage.h"
#include "loss_scale.h"
#include "param_tier.h"
#include "rate_watch.h"
#include "zinf/common/align.h"
#include "zinf/common/error.h"
#include "zinf/common/log.h"
#include "zinf/offload/engine_seams.h"
#include "zinf/offload/testing.h"
#include "zinf/swap/buffer_pool.h"
#include "zinf/swap/dir.h"

namespace zinf::offload {
namespace {

using Clock = std::chrono::steady_clock;
using detail::param_bytes;
constexpr const char* kManifestName = "zinf-engine-layers";
constexpr const char* kManifestHeader = "zinf engine layers v1";
// A line per layer; far more than any model's table, small enough to read whole.
constexpr std::uint64_t kMaxLayerTableBytes = std::uint64_t{64} << 20;
// The dynamic loss scale's state (a few lines), inside each optimizer checkpoint version
// (OffloadedOptimizer::set_checkpoint_file), committed with the state it belongs to.
constexpr const char* kLossScaleFile = "loss_scale";
// Where checkpoints saved before that kept it: next to the layer table, replaced before the
// optimizer's checkpoint, so a save that failed or was killed in between left a scale one
// save newer than the state. Read only for such checkpoints.
constexpr const char* kLossScaleName = "zinf-engine-loss-scale";
constexpr std::uint64_t kMaxLossScaleBytes = 4096;

std::string in_quotes(const std::string& s) { return "'" + s + "'"; }

// "" + "/" + name would be a file at the root of the file system, not in a checkpoint.
void check_checkpoint_dir(const std::string& dir, const char* function) {
  if (dir.empty()) {
    throw UsageError(std::string(function) +
                     ": the checkpoint directory is empty (\"\"); give "
                     "a directory");
  }
}

std::string manifest_text(const std::vector<LayerSpec>& layers) {
  std::ostringstream os;
  os << kManifestHeader << "\n" << layers.size() << "\n";
  for (const auto& l : layers)
    os << l.numel << " " << element_type_name(l.param_dtype) << " " << l.name << "\n";
  return os.str();
}

}  // namespace

struct OffloadEngine::Impl {
  Impl(EngineConfig c, std::vector<LayerSpec> l, cuda::Device& d, cuda::StreamRef s,
       const test_hooks::EngineFaults& faults);
  ~Impl();

  // Per layer: where it is in the iteration.
  struct Layer {
    bool fetched = false;
    bool has_grads = false;
    bool master_set = false;
  };

  void check_usable() const {
    if (failure) throw EngineFailed(*failure);
  }
  Layer& layer_at(std::size_t index, const char* op);
  void check_outside_step(const char* op) const;
  void fail(const Status& cause);
  // After a completed step: the drive-wear notice at the measured step rate, once.
  void note_wear();
  // Writes `layer`'s low-precision copy from `masters` into the parameter tier. Blocks.
  void write_low_precision(std::size_t layer, std::span<const float> masters);
  // The checks every set_gradients makes; returns the layer's state.
  Layer& check_gradients(std::size_t layer, std::size_t size, const char* unit);
  // Queues `layer`'s update through the parameter tier, opening the step if needed.
  void queue_update(std::size_t layer, adam::GradView grads, GradHooks hooks);
  // A free device-gradient staging buffer (allocated at the first call), waiting for one.
  std::size_t acquire_grad_slot();
  void release_grad_slot(std::size_t slot);
  // Staged mode, at step(): skips the step (returns its stats) or opens it with the step's
  // factor and queues every staged layer (returns nothing; the step is then open).
  std::optional<StepStats> open_staged_step();
  // Staged mode: forgets the step's gradients and the layers' has_grads.
  void drop_staged();
  // save() and save_async(): the layer table and loss scale now, then the optimizer's
  // checkpoint, written before returning or by the optimizer's save thread.
  // A save into `path` or, if it is null, into the open directory `given`.
  void save(const std::string* path, const swap::Dir* given, bool async);
  void load(const std::string* path, const swap::Dir* given);

  EngineConfig config;
  std::vector<LayerSpec> layers;
  cuda::Device& device;
  cuda::StreamRef compute;
  std::vector<Layer> state;

  // Device gradients: zinf.grad_staging_buffers pinned buffers of grad_slot_bytes, the copy
  // stream the device-to-host copies run on, and an event marking the compute stream's work
  // before each copy. Declared before the optimizer, whose hooks use them (destroyed after).
  struct GradSlot {
    swap::BufferLease buffer;
    cuda::Event copied;  // the latest copy into `buffer`
    bool busy = false;   // holds gradients the optimizer has not read yet (grad_mu)
  };
  std::uint64_t grad_slot_bytes = 0;
  std::unique_ptr<swap::BufferPool> grad_pool;
  cuda::PinnedRegistration grad_pinned;
  std::vector<GradSlot> grad_slots;
  cuda::Stream copy_stream;
  cuda::Event grads_written;
  std::mutex grad_mu;
  std::condition_variable grad_cv;
  std::uint64_t grad_to_host = 0;
  double grad_wait_seconds = 0;

  // The tier before the optimizer (destroyed after it): the optimizer's copy-out writes into
  // the tier's buffers or store.
  std::unique_ptr<detail::ParamTier> params;
  std::unique_ptr<optim::OffloadedOptimizer> optimizer;
  optim::OptimizerOptions optimizer_options;  // what it was built with (engine_seams.h reads them)
  // Staged mode only (after the optimizer: destroyed first, while nothing reads it).
  StepMode mode = StepMode::kOnArrival;
  std::unique_ptr<detail::GradientStage> stage;
  detail::LossScaler scaler{LossScaleConfig{}};
  StepStats staged_figures;  // the open staged step's norm, factor and loss scale
  // Staged mode: turns this engine's sum of squares into the one the verdict uses (the sum
  // over every rank of a sharded engine; engine_seams.h). Empty: the local sum.
  std::function<double(double)> reduce_sum_of_squares;

  bool step_open = false;
  std::optional<Status> failure;

  // Counters.
  std::uint64_t steps = 0;
  std::uint64_t skipped = 0;
  std::uint64_t opt_read = 0;
  std::uint64_t opt_written = 0;
  double opt_read_seconds = 0;
  double opt_write_seconds = 0;
  // The drive-slowdown notice (zinf.rate_notice_*): the optimizer's NVMe writes and reads.
  std::optional<detail::RateWatch> write_watch;
  std::optional<detail::RateWatch> read_watch;
  // Drive wear (zinf.tbw_tb): the plan's estimate until the measured notice is told, and the
  // bytes written and the time at the end of the first step, from which the steps after it
  // are measured.
  std::optional<detail::WearEstimate> wear;
  std::optional<Clock::time_point> wear_since;
  std::uint64_t wear_bytes_since = 0;
  double step_seconds = 0;
  StepStats last_step;
};

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
  // Notice level, shown by default: a notice says the config means something other than what
  // it reads as (an old key name, a rounded size).
  for (const auto& notice : config.notices) log(LogLevel::kNotice, "config: " + notice);
  // Drive wear, before the first step; the measured figure follows after the first steps.
  wear = std::move(plan.wear);
  if (wear && wear->bytes_per_step > 0) {
    log(LogLevel::kNotice, detail::wear_notice(*wear, config.zinf.tbw_tb));
  } else {
    wear.reset();  // nothing on NVMe (or no rating): nothing to tell
  }
  const std::vector<std::string>& dirs = plan.optimizer.directories;
  if (!dirs.empty() && config.zinf.rate_notice_share > 0) {
    std::string where;
    for (const auto& dir : dirs) where += (where.empty() ? "" : ", ") + dir;
    write_watch.emplace("optimizer writes to " + where, config.zinf.rate_notice_share,
                        config.zinf.rate_notice_steps, config.zinf.tuned_write_gbps);
    read_watch.emplace("optimizer reads from " + where, config.zinf.rate_notice_share,
                       config.zinf.rate_notice_steps, config.zinf.tuned_read_gbps);
  }

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

// Steps measured for the wear notice, after the first (which also warms the files and
// threads): enough to average a step's ups and downs, few enough to say it early in a run.
constexpr std::uint64_t kWearSteps = 3;

void OffloadEngine::Impl::note_wear() {
  if (!wear) return;
  const std::uint64_t written = opt_written + params->stats().bytes_written;
  if (steps == 1) {
    wear_since = Clock::now();
    wear_bytes_since = written;
    return;
  }
  if (!wear_since || steps < 1 + kWearSteps) return;
  const double secs =
      std::chrono::duration<double>(Clock::now() - *wear_since).count() / kWearSteps;
  const double per_step = static_cast<double>(written - wear_bytes_since) / kWearSteps;
  if (secs > 0 && per_step > 0) {
    log(LogLevel::kNotice,
        detail::measured_wear_notice(*wear, config.zinf.tbw_tb, per_step, secs, 1 + kWearSteps));
  }
  wear.reset();  // told once
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

void OffloadEngine::Impl::drop_staged() {
  stage->clear();
  for (auto& s : state) s.has_grads = false;
}

std::optional<StepStats> OffloadEngine::Impl::open_staged_step() {
  StepStats& f = staged_figures;
  f = StepStats{};
  f.loss_scale = scaler.scale();
  const double local_sum_sq = stage->sum_of_squares();
  const double sum_sq = reduce_sum_of_squares ? reduce_sum_of_squares(local_sum_sq) : local_sum_sq;
  f.global_grad_norm = std::sqrt(sum_sq) / f.loss_scale;
  double coefficient = 1;
  if (config.gradient_clipping > 0) {
    coefficient = optim::clip_coefficient(config.gradient_clipping, f.global_grad_norm);
  }
  f.grad_scale_applied = coefficient / f.loss_scale;
  // A norm so large that a layer's grad_scale times the factor is no longer a normal fp32
  // could not be applied faithfully either: it is an overflow too (finite gradients never get
  // near it with a sane loss scale). begin_step checks every layer's product the same way.
  double smallest_scale = std::numeric_limits<double>::infinity();
  for (std::size_t l = 0; l < layers.size(); ++l) {
    smallest_scale = std::min(smallest_scale, optimizer->hyper(l).grad_scale);
  }
  const double applied = smallest_scale * f.grad_scale_applied;
  const bool overflow = !std::isfinite(sum_sq) || !(static_cast<float>(applied) >= FLT_MIN);
  if (overflow) {
    f.skipped = true;
    f.grad_scale_applied = 0;
    drop_staged();
    // The iteration ended (for the prefetcher's trace); no layer changed.
    params->finish_step({}, f);
    scaler.update(/*overflow=*/true);
    return f;
  }
  // A failed staging write: nothing has started, so the step did not happen.
  try {
    stage->flush();
  } catch (const IoError&) {
    drop_staged();
    params->abandon_step();
    throw;
  }
  optimizer->begin_step(f.grad_scale_applied);
  step_open = true;
  try {
    // `consumed` tells the staging when the optimizer is done with a layer's gradients, so the
    // NVMe staging can refill that ring buffer.
    stage->replay([this](std::size_t layer, adam::GradView g, std::function<void()> consumed) {
      params->queue_update(*optimizer, layer, g, GradHooks{{}, std::move(consumed)});
    });
  } catch (const std::exception&) {
    // A read-back failed with part of the step queued: let that drain, then refuse further
    // work (a mix of updated and stale layers must never be trained on).
    const Status cause = status_from_current_exception();
    try {
      (void)optimizer->end_step();
    } catch (const std::exception& e) {
      log(LogLevel::kDebug,
          std::string("OffloadEngine: draining a failed staged step: ") + e.what());
    }
    step_open = false;
    params->abandon_step();
    drop_staged();
    fail(cause);
    throw;
  }
  return std::nullopt;
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

OffloadEngine::Impl::Layer& OffloadEngine::Impl::check_gradients(std::size_t index,
                                                                 std::size_t size,
                                                                 const char* unit) {
  check_usable();
  Layer& st = layer_at(index, "set_gradients");
  const LayerSpec& spec = layers[index];
  if (st.fetched) {
    throw UsageError("OffloadEngine::set_gradients: layer " + in_quotes(spec.name) +
                     " is fetched (release it first)");
  }
  if (st.has_grads) {
    throw UsageError("OffloadEngine::set_gradients: layer " + in_quotes(spec.name) +
                     " already has gradients in this step");
  }
  if (!st.master_set) {
    throw UsageError("OffloadEngine::set_gradients: layer " + in_quotes(spec.name) +
                     " has no weights yet (set_master_weights or load first)");
  }
  if (size != spec.numel) {
    throw UsageError("OffloadEngine::set_gradients: layer " + in_quotes(spec.name) + " has " +
                     std::to_string(spec.numel) + " elements, got " + std::to_string(size) +
                     unit);
  }
  return st;
}

void OffloadEngine::Impl::queue_update(std::size_t index, adam::GradView grads, GradHooks hooks) {
  if (!step_open) {
    optimizer->begin_step();
    step_open = true;
  }
  params->queue_update(*optimizer, index, grads, std::move(hooks));
  state[index].has_grads = true;
}

std::size_t OffloadEngine::Impl::acquire_grad_slot() {
  if (grad_slots.empty()) {
    // First device-gradient call: the staging the budget check counted, pinned for DMA.
    swap::BufferPoolOptions bo;
    bo.budget_bytes = grad_slot_bytes * config.zinf.grad_staging_buffers;
    bo.alignment = static_cast<std::uint32_t>(detail::kHostAlign);
    bo.huge_pages = true;
    auto pool = std::make_unique<swap::BufferPool>(bo);
    cuda::PinnedRegistration pinned = device.register_host(pool->arena());
    std::vector<GradSlot> slots(config.zinf.grad_staging_buffers);
    for (auto& s : slots) {
      s.buffer = pool->acquire(grad_slot_bytes);
      s.copied = device.create_event();
    }
    copy_stream = device.create_stream();
    grads_written = device.create_event();
    grad_pool = std::move(pool);
    grad_pinned = std::move(pinned);
    grad_slots = std::move(slots);
  }
  std::unique_lock lk(grad_mu);
  const auto free_slot = [&] {
    return std::find_if(grad_slots.begin(), grad_slots.end(), [](const GradSlot& s) {
      return !s.busy;
    });
  };
  if (free_slot() == grad_slots.end()) {
    // Every buffer holds gradients the optimizer has yet to read; it reads them in order.
    const auto t0 = Clock::now();
    grad_cv.wait(lk, [&] { return free_slot() != grad_slots.end(); });
    grad_wait_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
  }
  const auto it = free_slot();
  it->busy = true;
  return static_cast<std::size_t>(it - grad_slots.begin());
}

void OffloadEngine::Impl::release_grad_slot(std::size_t slot) {
  {
    std::lock_guard lk(grad_mu);
    grad_slots[slot].busy = false;
  }
  grad_cv.notify_all();
}

void OffloadEngine::set_gradients(std::size_t index, adam::GradView grads) {
  Impl& m = *impl_;
  Impl::Layer& st = m.check_gradients(index, grads.data == nullptr ? 0 : grads.size, " gradients");
  if (m.stage) {
    m.stage->stage(index, grads);  // staged mode: a copy; the update waits for step()
    st.has_grads = true;
    return;
  }
  m.queue_update(index, grads, {});
}

void OffloadEngine::set_gradients(std::size_t index, cuda::DeviceSpan grads, ElementType dtype) {
  Impl& m = *impl_;
  const std::size_t elem = element_size(dtype);
  Impl::Layer& st = m.check_gradients(index, grads.size() / elem, " gradients in device memory");
  const LayerSpec& spec = m.layers[index];
  if (grads.size() % elem != 0 || grads.empty()) {
    throw UsageError("OffloadEngine::set_gradients: layer " + in_quotes(spec.name) + " has " +
                     std::to_string(spec.numel) + " elements, got " + std::to_string(grads.size()) +
                     " bytes of " + std::string(element_type_name(dtype)) +
                     " gradients in device memory");
  }
  if (grads.device() != &m.device) {
    throw UsageError("OffloadEngine::set_gradients: layer " + in_quotes(spec.name) +
                     ": the gradients are not in the memory of device " +
                     std::string(m.device.name()));
  }
  if (m.config.zinf.grad_staging_buffers == 0) {
    throw UsageError("OffloadEngine::set_gradients: gradients in device memory need "
                     "zinf.grad_staging_buffers >= 1 (it is 0: host gradients only)");
  }
  const std::size_t slot = m.acquire_grad_slot();
  Impl::GradSlot& s = m.grad_slots[slot];
  try {
    // After the compute that wrote the gradients, on the copy stream: backward goes on.
    m.device.record(m.grads_written, m.compute);
    m.device.wait(m.copy_stream, m.grads_written);
    m.device.copy_to_host(m.copy_stream, s.buffer.span().first(grads.size()), grads);
    m.device.record(s.copied, m.copy_stream);
    m.grad_to_host += grads.size();
    if (m.stage) {
      // Staged mode: the squares are summed from the copy, so the host waits for it to land
      // (this mode does not overlap the copies with backward), then the buffer is free.
      s.copied.synchronize();
      m.stage->stage(index, {s.buffer.data(), static_cast<std::size_t>(spec.numel), dtype});
      m.release_grad_slot(slot);
      st.has_grads = true;
      return;
    }
    cuda::Event* copied = &s.copied;
    m.queue_update(index, {s.buffer.data(), static_cast<std::size_t>(spec.numel), dtype},
                   {[copied] { copied->synchronize(); }, [&m, slot] { m.release_grad_slot(slot); }});
  } catch (...) {
    // Nothing was queued (the hooks run only for a queued update): the buffer is free once its
    // copy, if one was enqueued, is over.
    try {
      s.copied.synchronize();
    } catch (const std::exception& e) {
      // The error being thrown is the one the caller needs; this one only frees the buffer.
      log(LogLevel::kDebug, std::string("OffloadEngine::set_gradients: staging copy: ") +
                                e.what());
    }
    m.release_grad_slot(slot);
    throw;
  }
}

StepStats OffloadEngine::step() {
  Impl& m = *impl_;
  m.check_usable();
  for (std::size_t i = 0; i < m.state.size(); ++i) {
    if (m.state[i].fetched) {
      throw UsageError("OffloadEngine::step: layer " + in_quotes(m.layers[i].name) +
                       " is still fetched (release it first)");
    }
  }
  const auto t0 = Clock::now();
  if (m.stage && !m.step_open) {
    // Staged mode: clip, unscale, or skip on overflow (open_staged_step).
    if (std::optional<StepStats> skipped = m.open_staged_step()) {
      ++m.skipped;
      m.last_step = *skipped;
      m.step_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
      return *skipped;
    }
  }
  if (!m.step_open) {
    m.optimizer->begin_step();
    m.step_open = true;
  }
  StepStats st;
  try {
    st = m.optimizer->end_step();
  } catch (const IoError& e) {
    m.step_open = false;
    if (m.optimizer->failed()) {
      m.fail(e.status());
    } else {
      // Nothing was written (a state read failed first): the step did not happen, and the
      // parameter copies are as they were. Release the layers for the next attempt.
      m.params->abandon_step();
      for (auto& s : m.state) s.has_grads = false;
      if (m.stage) m.stage->clear();
    }
    throw;
  } catch (const EngineFailed& e) {
    m.step_open = false;
    m.fail(e.cause());
    throw;
  }
  m.step_open = false;
  std::vector<std::size_t> updated;
  for (std::size_t i = 0; i < m.state.size(); ++i) {
    if (!m.state[i].has_grads) continue;
    m.state[i].has_grads = false;
    updated.push_back(i);
  }
  m.params->finish_step(updated, st);
  if (m.stage) {
    m.stage->clear();
    m.scaler.update(/*overflow=*/false);
    st.global_grad_norm = m.staged_figures.global_grad_norm;
    st.grad_scale_applied = m.staged_figures.grad_scale_applied;
    st.loss_scale = m.staged_figures.loss_scale;
  }
  ++m.steps;
  m.opt_read += st.bytes_read;
  m.opt_written += st.bytes_written;
  m.opt_read_seconds += st.read_seconds;
  m.opt_write_seconds += st.write_seconds;
  // This step's rates against the reference: one notice when the drive stays slow (its write
  // cache full, or hot), not one per step. Steps that moved nothing say nothing of the drive.
  if (m.write_watch && st.bytes_written > 0 && st.write_seconds > 0) {
    if (auto line = m.write_watch->observe(static_cast<double>(st.bytes_written) /
                                           st.write_seconds / 1e9)) {
      log(LogLevel::kNotice, "OffloadEngine: " + *line);
    }
  }
  if (m.read_watch && st.bytes_read > 0 && st.read_seconds > 0) {
    if (auto line =
            m.read_watch->observe(static_cast<double>(st.bytes_read) / st.read_seconds / 1e9)) {
      log(LogLevel::kNotice, "OffloadEngine: " + *line);
    }
  }
  m.last_step = st;
  m.step_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
  m.note_wear();
  return st;
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

void OffloadEngine::save(const std::string& dir) { impl_->save(&dir, nullptr, /*async=*/false); }

void OffloadEngine::save(const swap::Dir& dir) { impl_->save(nullptr, &dir, /*async=*/false); }

void OffloadEngine::save_async(const std::string& dir) {
  impl_->save(&dir, nullptr, /*async=*/true);
}

void OffloadEngine::wait_save() { impl_->optimizer->wait_save(); }

bool OffloadEngine::save_in_flight() const { return impl_->optimizer->save_in_flight(); }

SaveSnapshot OffloadEngine::last_save_snapshot() const noexcept {
  return impl_->optimizer->last_save_snapshot();
}

void OffloadEngine::Impl::save(const std::string* path, const swap::Dir* given, bool async) {
  const char* function = async ? "OffloadEngine::save_async" : "OffloadEngine::save";
  if (path) check_checkpoint_dir(*path, function);
  Impl& m = *this;
  m.check_usable();
  m.check_outside_step(async ? "save_async" : "save");
  // A save in flight first (its error, if any, is thrown here): the files below belong to the
  // checkpoint it is about to commit.
  m.optimizer->wait_save();
  // The optimizer's directory, created if missing and locked for it: the layer table is
  // written under the same lock, through the same descriptor.
  const swap::Dir& d = path ? m.optimizer->checkpoint_directory(*path, /*create=*/true)
                            : m.optimizer->checkpoint_directory(*given);
  // The layer table first: it never changes for an engine, so a crash between it and the
  // optimizer's checkpoint leaves a table that matches the previous checkpoint too.
  swap::replace_file_durably(d, kManifestName, manifest_text(m.layers));
  // The dynamic loss scale's state goes inside the optimizer's new version, committed with
  // the state it belongs to: a save that fails or is killed leaves both as they were.
  m.optimizer->set_checkpoint_file(
      kLossScaleFile,
      m.scaler.dynamic() ? std::optional<std::string>(detail::LossScaler::to_text(m.scaler.state()))
                         : std::nullopt);
  if (async) {
    m.optimizer->save_async(*path);
  } else if (path) {
    m.optimizer->save(*path);
  } else {
    m.optimizer->save(*given);
  }
}

namespace {

// The text of the dynamic loss scale's state saved in engine checkpoint `d` and where it was
// read, or nullopt (with a notice) where the checkpoint has none: one saved without dynamic
// loss scaling. The current version's own (`<d>/<version>/loss_scale`), else, for a
// checkpoint saved before the scale moved into the version, `<d>/zinf-engine-loss-scale`.
struct ScaleText {
  std::string text;
  std::string shown;
};
std::optional<ScaleText> read_scale_text(const optim::OffloadedOptimizer& opt, const swap::Dir& d,
                                         const detail::LossScaler& scaler, std::string_view who) {
  std::string shown;
  if (auto text = opt.read_checkpoint_file(d, kLossScaleFile, &shown)) {
    return ScaleText{std::move(*text), shown};
  }
  // A version that records its run was saved with the scale inside it, if with any: an old
  // file beside it belongs to an earlier save and is not read.
  if (!opt.read_checkpoint_file(d, "run")) {
    shown = d.path_of(kLossScaleName);
    try {
      return ScaleText{swap::read_small_file(d, kLossScaleName, kMaxLossScaleBytes), shown};
    } catch (const IoError& e) {
      if (e.code() != ErrorCode::kNotFound) throw;
    }
  }
  log(LogLevel::kNotice, std::string(who) + ": " + shown +
                             " is missing (a checkpoint without dynamic loss scaling); the loss "
                             "scale stays " +
                             std::to_string(scaler.scale()));
  return std::nullopt;
}

// `text` (read from `path`) as a loss scale state this engine's config can hold: IoError
// kCorrupt if it is not one, UsageError if the config could not have produced it.
detail::LossScaleState check_scale_text(const std::string& text, const std::string& path,
                                        const detail::LossScaler& scaler, std::string_view who) {
  const std::optional<detail::LossScaleState> state = detail::LossScaler::from_text(text);
  if (!state) {
    throw IoError(Status::error(
        ErrorCode::kCorrupt, std::string(who) + ": " + path + " is not a zinf loss scale state"));
  }
  detail::LossScaler probe = scaler;
  if (!probe.restore(*state)) {
    throw UsageError(std::string(who) + ": the loss scale state in " + path +
                     " cannot come from this engine's fp16 loss scaling config "
                     "(hysteresis or scale out of its range)");
  }
  return *state;
}

}  // namespace

void OffloadEngine::load(const std::string& dir) {
  check_checkpoint_dir(dir, "OffloadEngine::load");
  impl_->load(&dir, nullptr);
}

void OffloadEngine::load(const swap::Dir& dir) { impl_->load(nullptr, &dir); }

void OffloadEngine::Impl::load(const std::string* path, const swap::Dir* given) {
  Impl& m = *this;
  m.check_usable();
  m.check_outside_step("load");
  m.optimizer->wait_save();
  const swap::Dir& d = path ? m.optimizer->checkpoint_directory(*path, /*create=*/false)
                            : m.optimizer->checkpoint_directory(*given);
  const std::string table = d.path_of(kManifestName);
  const std::string want = manifest_text(m.layers);
  if (swap::read_small_file(d, kManifestName, kMaxLayerTableBytes) != want) {
    throw UsageError("OffloadEngine::load: the checkpoint's layer table " + table +
                     " differs from this engine's layers (names, element counts, dtypes)");
  }
  // The loss scale's state is read and checked before anything changes.
  std::optional<detail::LossScaleState> scale_state;
  if (m.scaler.dynamic()) {
    if (const auto text = read_scale_text(*m.optimizer, d, m.scaler, "OffloadEngine::load")) {
      scale_state = check_scale_text(text->text, text->shown, m.scaler, "OffloadEngine::load");
    }
  }
  if (path) {
    m.optimizer->load(*path);
  } else {
    m.optimizer->load(*given);
  }
  if (scale_state) (void)m.scaler.restore(*scale_state);
  // Every layer's low-precision copy from the restored masters, one layer at a time.
  std::vector<float> masters;
  for (std::size_t i = 0; i < m.layers.size(); ++i) {
    masters.assign(static_cast<std::size_t>(m.layers[i].numel), 0.0f);
    m.optimizer->read_state(i, masters, {}, {});
    m.state[i].master_set = false;
    m.write_low_precision(i, masters);
    m.state[i].master_set = true;
  }
}

EngineStats OffloadEngine::stats() const {
  const Impl& m = *impl_;
  EngineStats s;
  s.steps = m.steps;
  s.skipped_steps = m.skipped;
  if (m.stage) {
    s.staged_grad_bytes_written = m.stage->bytes_written();
    s.staged_grad_bytes_read = m.stage->bytes_read();
  }
  const detail::ParamTierStats p = m.params->stats();
  s.param_bytes_read = p.bytes_read;
  s.param_bytes_written = p.bytes_written;
  s.param_bytes_to_device = p.bytes_to_device;
  s.stall_seconds = p.stall_seconds;
  s.prefetch_hits = p.prefetch_hits;
  s.prefetch_on_demand = p.prefetch_on_demand;
  s.param_read_gbps = p.read_gbps;
  s.optimizer_bytes_read = m.opt_read;
  s.optimizer_bytes_written = m.opt_written;
  s.step_seconds = m.step_seconds;
  if (m.opt_read_seconds > 0)
    s.nvme_read_gbps = static_cast<double>(m.opt_read) / m.opt_read_seconds / 1e9;
  if (m.opt_write_seconds > 0) {
    s.nvme_write_gbps = static_cast<double>(m.opt_written) / m.opt_write_seconds / 1e9;
  }
  const std::uint64_t grad_pinned = m.grad_pool ? m.grad_pool->budget_bytes() : 0;
  const std::uint64_t stage_pinned = m.stage ? m.stage->pinned_bytes() : 0;
  const std::uint64_t own = m.params->pinned_bytes() + grad_pinned + stage_pinned;
  s.pinned_bytes = m.optimizer->pinned_bytes() + own;
  s.pinned_bytes_peak = m.optimizer->pinned_bytes_peak() + own;
  s.grad_bytes_to_host = m.grad_to_host;
  s.grad_staging_wait_seconds = m.grad_wait_seconds;
  s.last_step = m.last_step;
  return s;
}

// ---------------------------------------------------------------------------------------------
// Seams (engine_seams.h)

class EngineSeamsAccess {
 public:
  static void set(OffloadEngine& engine, std::function<double(double)> reduce) {
    OffloadEngine::Impl& m = *engine.impl_;
    if (m.step_open) {
      throw UsageError("OffloadEngine: the sum-of-squares reducer cannot change inside a step");
    }
    m.reduce_sum_of_squares = std::move(reduce);
  }

  static optim::OptimizerOptions optimizer_options(const OffloadEngine& engine) {
    return engine.impl_->optimizer_options;
  }

  static void set_layer_state(OffloadEngine& engine, std::size_t index,
                              std::span<const float> master, std::span<const float> mo,
                              std::span<const float> v) {
    OffloadEngine::Impl& m = *engine.impl_;
    m.check_usable();
    OffloadEngine::Impl::Layer& st = m.layer_at(index, "set_layer_state");
    m.check_outside_step("set_layer_state");
    m.optimizer->set_state(index, master, mo, v);
    st.master_set = false;
    m.write_low_precision(index, master);
    st.master_set = true;
  }

  static void set_step_count(OffloadEngine& engine, std::uint64_t steps) {
    OffloadEngine::Impl& m = *engine.impl_;
    m.check_usable();
    m.check_outside_step("set_step_count");
    m.optimizer->set_step_count(steps);
  }

  static std::uint64_t step_count(const OffloadEngine& engine) {
    return engine.impl_->optimizer->step_count();
  }

  static std::optional<std::string> saved_loss_scale(const OffloadEngine& engine,
                                                     const swap::Dir& dir, std::string_view who) {
    const OffloadEngine::Impl& m = *engine.impl_;
    if (!m.scaler.dynamic()) return std::nullopt;
    auto text = read_scale_text(*m.optimizer, dir, m.scaler, who);
    if (!text) return std::nullopt;
    return std::move(text->text);
  }

  static optim::OffloadedOptimizer& optimizer(OffloadEngine& engine) {
    return *engine.impl_->optimizer;
  }

  static void restore_loss_scale(OffloadEngine& engine, const std::string& text,
                                 const std::string& shown, std::string_view who) {
    OffloadEngine::Impl& m = *engine.impl_;
    m.check_outside_step("restore_loss_scale");
    if (!m.scaler.dynamic()) return;
    (void)m.scaler.restore(check_scale_text(text, shown, m.scaler, who));
  }
};

void set_sum_of_squares_reducer(OffloadEngine& engine, std::function<double(double)> reduce) {
  EngineSeamsAccess::set(engine, std::move(reduce));
}

optim::OptimizerOptions optimizer_options(const OffloadEngine& engine) {
  return EngineSeamsAccess::optimizer_options(engine);
}

void set_layer_state(OffloadEngine& engine, std::size_t layer, std::span<const float> master,
                     std::span<const float> m, std::span<const float> v) {
  EngineSeamsAccess::set_layer_state(engine, layer, master, m, v);
}

void set_step_count(OffloadEngine& engine, std::uint64_t steps) {
  EngineSeamsAccess::set_step_count(engine, steps);
}

std::uint64_t step_count(const OffloadEngine& engine) {
  return EngineSeamsAccess::step_count(engine);
}

std::optional<std::string> saved_loss_scale(const OffloadEngine& engine, const swap::Dir& dir,
                                            std::string_view who) {
  return EngineSeamsAccess::saved_loss_scale(engine, dir, who);
}

void restore_loss_scale(OffloadEngine& engine, const std::string& text, const std::string& shown,
                        std::string_view who) {
  EngineSeamsAccess::restore_loss_scale(engine, text, shown, who);
}

std::string checkpoint_run(OffloadEngine& engine) {
  return EngineSeamsAccess::optimizer(engine).checkpoint_run();
}

void set_checkpoint_run(OffloadEngine& engine, const std::string& run) {
  EngineSeamsAccess::optimizer(engine).set_checkpoint_run(run);
}

}  // namespace zinf::offload
