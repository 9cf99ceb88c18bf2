// SPDX-License-Identifier: Apache-2.0
// OffloadEngine::Impl: the engine's state and the helpers its parts share, private to
// zinf::offload. Its members are defined by part: construction, the layer bookkeeping and
// the weights (engine.cc), the gradients' intake (engine_grads.cc), the step and its skipped
// path (engine_step.cc), checkpoints (engine_checkpoint.cc), the drive's rate and wear notices
// (engine_notices.cc), the statistics (engine_stats.cc) and the seams a layer above plugs
// into (engine_seams.cc).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine_plan.h"
#include "grad_stage.h"
#include "loss_scale.h"
#include "param_tier.h"
#include "rate_watch.h"
#include "zinf/common/error.h"
#include "zinf/common/status.h"
#include "zinf/offload/engine.h"
#include "zinf/offload/testing.h"
#include "zinf/swap/buffer_pool.h"
#include "zinf/swap/dir.h"

namespace zinf::offload {
namespace detail {

using EngineClock = std::chrono::steady_clock;

inline std::string in_quotes(const std::string& s) { return "'" + s + "'"; }

}  // namespace detail

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
  // Writes `layer`'s low-precision copy from `masters` into the parameter tier. Blocks.
  void write_low_precision(std::size_t layer, std::span<const float> masters);

  // ---- Gradients (engine_grads.cc)
  // The checks every set_gradients makes; returns the layer's state.
  Layer& check_gradients(std::size_t layer, std::size_t size, const char* unit);
  // Queues `layer`'s update through the parameter tier, opening the step if needed.
  void queue_update(std::size_t layer, adam::GradView grads, GradHooks hooks);
  // A free device-gradient staging buffer (allocated at the first call), waiting for one.
  std::size_t acquire_grad_slot();
  void release_grad_slot(std::size_t slot);

  // ---- The step (engine_step.cc)
  // Staged mode, at step(): skips the step (returns its stats) or opens it with the step's
  // factor and queues every staged layer (returns nothing; the step is then open).
  std::optional<StepStats> open_staged_step();
  // Staged mode: the overflow path of open_staged_step; returns the skipped step's stats.
  StepStats skip_staged_step();
  // Staged mode: forgets the step's gradients and the layers' has_grads.
  void drop_staged();

  // ---- Checkpoints (engine_checkpoint.cc)
  // save() and save_async(): the layer table and loss scale now, then the optimizer's
  // checkpoint, written before returning or by the optimizer's save thread.
  // A save into `path` or, if it is null, into the open directory `given`.
  void save(const std::string* path, const swap::Dir* given, bool async,
            optim::SupersededVersions superseded = optim::SupersededVersions::kRemove);
  void load(const std::string* path, const swap::Dir* given);
  // The text of the dynamic loss scale's state saved in engine checkpoint `d` and where it was
  // read, or nullopt (with a notice) where the checkpoint has none.
  struct ScaleText {
    std::string text;
    std::string shown;
  };
  std::optional<ScaleText> read_scale_text(const swap::Dir& d, std::string_view who) const;
  // `text` (read from `path`) as a loss scale state this engine's config can hold: IoError
  // kCorrupt if it is not one, UsageError if the config could not have produced it.
  detail::LossScaleState check_scale_text(const std::string& text, const std::string& path,
                                          std::string_view who) const;

  // ---- Notices (engine_notices.cc)
  // At construction: the plan's notices, and the rate watches and wear estimate kept for the
  // notices after the steps.
  void start_notices(const detail::EnginePlan& plan);
  // After a completed step: the drive-slowdown notices at this step's rates.
  void note_rates(const StepStats& st);
  // After a completed step: the drive-wear notice at the measured step rate, once.
  void note_wear();

  // ---- Statistics (engine_stats.cc)
  // After a completed step: its bytes and seconds added to the counters.
  void count_step(const StepStats& st);

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
  std::optional<detail::EngineClock::time_point> wear_since;
  std::uint64_t wear_bytes_since = 0;
  double step_seconds = 0;
  StepStats last_step;
};

}  // namespace zinf::offload
