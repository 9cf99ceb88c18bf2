// SPDX-License-Identifier: Apache-2.0
// OffloadedOptimizer's step calls on the controlling thread: opening a step, checking and
// queueing each group's sub-group tasks for the pipeline (optimizer_pipeline.cc), closing it.
#include <algorithm>
#include <string>
#include <utility>

#include "optimizer_impl.h"
#include "zinf/common/error.h"
#include "zinf/common/log.h"
#include "zinf/optim/optimizer.h"

namespace zinf::optim {
namespace {

adam::GradView slice(const adam::GradView& g, std::uint64_t offset, std::uint64_t n) {
  const auto* base = static_cast<const std::byte*>(g.data);
  return {base + offset * element_size(g.dtype), n, g.dtype};
}

adam::CopyOut slice(const adam::CopyOut& o, std::uint64_t offset, std::uint64_t n) {
  if (!o.enabled) return adam::CopyOut::none();
  auto* base = static_cast<std::byte*>(o.data);
  return {base + offset * element_size(o.dtype), n, o.dtype, true};
}
}  // namespace

StepStats OffloadedOptimizer::step(std::span<const GroupGrads> grads) {
  // Every argument is checked before the step opens, so a bad one changes nothing.
  impl_->check_usable();
  std::vector<bool> seen(impl_->groups.size(), false);
  for (const auto& g : grads) {
    impl_->validate_group_grads(g.group, g.grads, g.out);
    if (seen[g.group]) {
      throw UsageError("OffloadedOptimizer::step: group '" + impl_->groups[g.group].name +
                       "' given twice");
    }
    seen[g.group] = true;
  }
  begin_step();
  for (const auto& g : grads) step_group(g.group, g.grads, g.out);
  return end_step();
}

void OffloadedOptimizer::begin_step() { begin_step(1.0); }

void OffloadedOptimizer::begin_step(double grad_scale) {
  Impl& im = *impl_;
  im.check_usable();
  std::lock_guard lk(im.mu);
  if (im.run.active) throw UsageError("OffloadedOptimizer::begin_step: a step is already open");
  // Every group's own hyper-parameters, with this step's factor; checked before anything
  // opens, so a refused factor changes nothing.
  std::vector<adam::AdamParams> hp = im.group_hyper;
  for (std::size_t g = 0; g < hp.size(); ++g) {
    hp[g].grad_scale *= grad_scale;  // x 1.0 is exact: the plain begin_step() is unchanged
    if (auto bad = adam::check_adam_params(hp[g])) {
      throw UsageError("OffloadedOptimizer::begin_step: group '" + im.groups[g].name +
                       "': the step's grad_scale (" + std::to_string(im.group_hyper[g].grad_scale) +
                       " x " + std::to_string(grad_scale) + ") " + bad->what);
    }
  }
  im.run = StepRun{};
  im.run.active = true;
  im.run.given.assign(im.groups.size(), false);
  im.run.step = im.steps_done + 1;
  im.run.hp = std::move(hp);
  im.run.began = OptClock::now();
  if (im.last_step_end != OptClock::time_point{}) {
    im.last_between_steps = im.run.began - im.last_step_end;
  }
  im.step_snapshot = im.async_save;
  if (im.step_snapshot) Impl::snapshot_step(*im.step_snapshot, true);
  ++im.steps_done;
}

void OffloadedOptimizer::Impl::validate_group_grads(std::size_t group_index,
                                                    const adam::GradView& grads,
                                                    const adam::CopyOut& out) const {
  if (group_index >= groups.size()) {
    throw UsageError("OffloadedOptimizer: group " + std::to_string(group_index) +
                     " out of range (" + std::to_string(groups.size()) + " groups)");
  }
  const ParamGroupSpec& g = groups[group_index];
  if (grads.size != g.numel || grads.data == nullptr) {
    throw UsageError("OffloadedOptimizer::step_group: group '" + g.name + "' has " +
                     std::to_string(g.numel) + " elements, got " + std::to_string(grads.size) +
                     " gradients" + (grads.data == nullptr ? " (null)" : ""));
  }
  if (out.enabled && (out.size != g.numel || out.data == nullptr)) {
    throw UsageError("OffloadedOptimizer::step_group: group '" + g.name +
                     "' copy-out must be a non-null buffer of " + std::to_string(g.numel) +
                     " elements");
  }
  if (!initialized[group_index]) {
    throw UsageError("OffloadedOptimizer::step_group: group '" + g.name +
                     "' has no state yet (call set_params first)");
  }
}

void OffloadedOptimizer::step_group(std::size_t group_index, adam::GradView grads,
                                    adam::CopyOut out, GradHooks hooks) {
  Impl& im = *impl_;
  im.check_usable();
  im.validate_group_grads(group_index, grads, out);
  im.queue_group(group_index, grads, out, nullptr, std::move(hooks));
}

void OffloadedOptimizer::Impl::drop_tasks(std::size_t from, std::size_t to) {
  for (std::size_t i = from; i < to && i < run.tasks.size(); ++i) {
    run.tasks[i].ready = nullptr;
    if (run.tasks[i].consumed) {
      const std::function<void()> consumed = std::move(run.tasks[i].consumed);
      run.tasks[i].consumed = nullptr;
      consumed();
    }
  }
}

void OffloadedOptimizer::Impl::queue_group(std::size_t group_index, const adam::GradView& grads,
                                           const adam::CopyOut& out,
                                           const std::shared_ptr<const StoreCopyOut>& target,
                                           GradHooks hooks) {
  const ParamGroupSpec& g = groups[group_index];
  std::lock_guard lk(mu);
  if (!run.active) throw UsageError("OffloadedOptimizer::step_group: no open step (begin_step)");
  if (run.given[group_index]) {
    throw UsageError("OffloadedOptimizer::step_group: group '" + g.name +
                     "' was already given in this step");
  }
  run.given[group_index] = true;
  const std::size_t first = run.tasks.size();
  for (std::size_t ri : group_records[group_index]) {
    const Record& rec = records[ri];
    run.tasks.push_back({ri, slice(grads, rec.offset, rec.numel), slice(out, rec.offset, rec.numel),
                         target, nullptr, nullptr});
  }
  run.tasks[first].ready = std::move(hooks.ready);
  run.tasks.back().consumed = std::move(hooks.consumed);
  if (!run.error.ok()) drop_tasks(first, run.tasks.size());  // never updated: done with now
  cv.notify_all();
}

void OffloadedOptimizer::Impl::validate_store_out(std::size_t group_index,
                                                  const StoreCopyOut& out) const {
  const ParamGroupSpec& g = groups[group_index];
  const std::string where = "OffloadedOptimizer::step_group: group '" + g.name + "' copy-out";
  if (!options.store_copy_out) {
    throw UsageError(where + " into a swap store needs OptimizerOptions::store_copy_out");
  }
  if (out.store == nullptr) throw UsageError(where + ": no swap store");
  if (out.dtype != ElementType::kBF16 && out.dtype != ElementType::kF16)
    throw UsageError(where + ": dtype must be bf16 or fp16");
  if (!out.store->contains(out.key)) throw UsageError(where + ": unknown key '" + out.key + "'");
  if (out.store->size_of(out.key) != g.numel * 2) {
    throw UsageError(where + ": key '" + out.key + "' holds " +
                     std::to_string(out.store->size_of(out.key)) + " bytes, the group needs " +
                     std::to_string(g.numel * 2));
  }
  if (out.store->alignment() > alignment ||
      out.store->padded_size(std::min(options.sub_group_elements, g.numel) * 2) >
          out_staging.front().size()) {
    throw UsageError(where + ": the store's alignment " + std::to_string(out.store->alignment()) +
                     " exceeds the optimizer's " + std::to_string(alignment));
  }
  if (group_records[group_index].size() > 1) {
    const bool sums = out.store->checksums();
    const std::uint64_t unit =
        sums ? std::max<std::uint64_t>(out.store->stripe_bytes(), out.store->alignment())
             : out.store->alignment();
    const std::uint64_t bytes = options.sub_group_elements * 2;
    if (bytes % unit != 0) {
      throw UsageError(
          where + " into key '" + out.key + "': sub-group bytes (2 x " +
          std::to_string(options.sub_group_elements) + " = " + std::to_string(bytes) +
          ") must be a multiple of " + std::to_string(unit) +
          (sums ? " (the store's stripe_bytes, with checksums)" : " (the store's alignment)") +
          "; sub_group_elements " +
          std::to_string(store_copy_out_sub_group(options.sub_group_elements, *out.store)) +
          " works");
    }
  }
}

void OffloadedOptimizer::step_group(std::size_t group_index, adam::GradView grads,
                                    const StoreCopyOut& out, GradHooks hooks) {
  Impl& im = *impl_;
  im.check_usable();
  im.validate_group_grads(group_index, grads, adam::CopyOut::none());
  im.validate_store_out(group_index, out);
  im.queue_group(group_index, grads, adam::CopyOut::none(),
                 std::make_shared<const StoreCopyOut>(out), std::move(hooks));
}

StepStats OffloadedOptimizer::end_step() {
  Impl& im = *impl_;
  std::unique_lock lk(im.mu);
  if (!im.run.active) throw UsageError("OffloadedOptimizer::end_step: no open step");
  im.run.closed = true;
  im.cv.notify_all();
  im.cv.wait(lk, [&] { return im.run.finished; });
  im.run.active = false;
  im.last_step_end = OptClock::now();
  if (im.step_snapshot) Impl::snapshot_step(*im.step_snapshot, false);
  im.step_snapshot.reset();
  StepStats stats = im.run.stats;
  const Status err = im.run.error;
  const bool modified = im.run.modified;
  im.run.tasks.clear();
  lk.unlock();
  if (!err.ok()) {
    if (modified) {
      im.fail(err);
    } else {
      --im.steps_done;  // nothing was written: the step never happened
    }
    throw IoError(err);
  }
  return stats;
}

}  // namespace zinf::optim
