// SPDX-License-Identifier: Apache-2.0
// The seams of OffloadEngine for a layer built above it (zinf/offload/engine_seams.h): the
// sum-of-squares reducer of the staged step, and what resharding a checkpoint needs (the
// optimizer's options, a layer's whole state, the step count, the loss scale's state, the
// checkpoint's run).
#include "zinf/offload/engine_seams.h"

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "engine_impl.h"
#include "zinf/common/error.h"

namespace zinf::offload {

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
    auto text = m.read_scale_text(dir, who);
    if (!text) return std::nullopt;
    return std::move(text->text);
  }

  static optim::OffloadedOptimizer& optimizer(OffloadEngine& engine) {
    return *engine.impl_->optimizer;
  }

  static void save(OffloadEngine& engine, const swap::Dir& dir,
                   optim::SupersededVersions superseded) {
    engine.impl_->save(nullptr, &dir, /*async=*/false, superseded);
  }

  static void restore_loss_scale(OffloadEngine& engine, const std::string& text,
                                 const std::string& shown, std::string_view who) {
    OffloadEngine::Impl& m = *engine.impl_;
    m.check_outside_step("restore_loss_scale");
    if (!m.scaler.dynamic()) return;
    (void)m.scaler.restore(m.check_scale_text(text, shown, who));
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

void save(OffloadEngine& engine, const swap::Dir& dir, optim::SupersededVersions superseded) {
  EngineSeamsAccess::save(engine, dir, superseded);
}

void remove_superseded_versions(OffloadEngine& engine) {
  EngineSeamsAccess::optimizer(engine).remove_superseded_versions();
}

}  // namespace zinf::offload
