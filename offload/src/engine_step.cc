// SPDX-License-Identifier: Apache-2.0
// OffloadEngine's step: the optimizer's end of the step over the layers queued, what a failed
// step leaves, and in the staged mode the step's opening (the norm, clipping and unscaling
// factor, every staged layer replayed into the optimizer) or its skip on overflow.
#include <algorithm>
#include <cfloat>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine_impl.h"
#include "zinf/common/error.h"
#include "zinf/common/log.h"

namespace zinf::offload {

using detail::in_quotes;
using Clock = detail::EngineClock;

void OffloadEngine::Impl::drop_staged() {
  stage->clear();
  for (auto& s : state) s.has_grads = false;
}

StepStats OffloadEngine::Impl::skip_staged_step() {
  StepStats& f = staged_figures;
  f.skipped = true;
  f.grad_scale_applied = 0;
  drop_staged();
  // The iteration ended (for the prefetcher's trace); no layer changed.
  params->finish_step({}, f);
  scaler.update(/*overflow=*/true);
  return f;
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
  if (overflow) return skip_staged_step();
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
  m.count_step(st);
  m.note_rates(st);
  m.last_step = st;
  m.step_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
  m.note_wear();
  return st;
}

}  // namespace zinf::offload
