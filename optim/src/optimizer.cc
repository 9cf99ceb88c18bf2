// SPDX-License-Identifier: Apache-2.0
// OffloadedOptimizer: construction (records, budget check, engine, state store, pool), the
// public calls outside a step (parameter access: set_params, read_state; the checkpoint calls,
// which optimizer_checkpoint.cc carries out) and the ring that runs records through the
// store's slots on the calling thread. Planning is in optimizer_plan.cc, the step in
// optimizer_step.cc and optimizer_pipeline.cc.
#include "zinf/optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>

#include "optimizer_impl.h"
#include "zinf/common/align.h"
#include "zinf/common/check.h"
#include "zinf/common/error.h"
#include "zinf/common/log.h"
#include "zinf/swap/file.h"

namespace zinf::optim {
namespace {

// "" + "/LATEST" would be a path at the root of the file system, not a checkpoint.
void check_checkpoint_dir(const std::string& dir, const char* function) {
  if (dir.empty()) {
    throw UsageError(std::string(function) +
                     ": the checkpoint directory is empty (\"\"); give "
                     "a directory");
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Construction

OffloadedOptimizer::Impl::Impl(OptimizerOptions o, std::vector<ParamGroupSpec> g)
    : options(std::move(o)), groups(std::move(g)), adam(options.adam), hyper(options.hyper) {
  // From here on options.sub_group_elements is what the records use (and checkpoints name).
  options.sub_group_elements = effective_sub_group_elements(options, groups);
  const std::uint64_t record_count = check_options(options, groups);
  const StateStorePlan store_plan = plan_state_store(options, groups);
  alignment = store_plan.alignment;

  // Records: each group cut into sub-groups, the last one possibly short.
  const std::uint64_t sub = std::min(options.sub_group_elements, kMaxNumel);
  records.reserve(record_count);
  group_records.resize(groups.size());
  for (std::size_t gi = 0; gi < groups.size(); ++gi) {
    for (std::uint64_t off = 0, s = 0; off < groups[gi].numel; off += sub, ++s) {
      Record r;
      r.group = gi;
      r.sub = s;
      r.offset = off;
      r.numel = std::min(sub, groups[gi].numel - off);
      r.bytes = record_state_bytes(options.state_precision, r.numel);
      r.padded = align_up(r.bytes, alignment);
      r.key = groups[gi].name + "#" + std::to_string(s);
      max_record_bytes = std::max(max_record_bytes, r.padded);
      state_bytes += r.padded;
      group_records[gi].push_back(records.size());
      records.push_back(std::move(r));
    }
  }
  initialized.assign(groups.size(), false);
  for (const auto& grp : groups) group_hyper.push_back(grp.hyper.value_or(options.hyper));

  // The pinned-memory budget must hold the pipeline: checked before anything is created.
  const RecordSizes sizes = record_sizes(options, groups, alignment);
  const PinnedPlan plan = plan_pinned(options, store_plan, sizes);
  const std::uint64_t need = plan.need;
  const std::string& what = plan.what;
  if (options.pinned_budget_bytes < need) {
    throw UsageError(
        "OffloadedOptimizer: pinned_budget_bytes=" + std::to_string(options.pinned_budget_bytes) +
        " cannot hold " + what + "; the smallest budget that works is " + std::to_string(need));
  }

  engine = swap::make_io_engine(options.io);
  // The store first: a disk too small for the state is reported before any memory is mapped.
  store = store_plan.make({store_plan, options, records, *engine, max_record_bytes, state_bytes});

  swap::BufferPoolOptions po;
  po.budget_bytes = need;
  po.alignment = alignment;
  po.huge_pages = true;
  po.prefault = store_plan.prefault;
  pool = std::make_unique<swap::BufferPool>(po);
  store->acquire(*pool);
  slots.resize(store->depth());
  slot_expected.resize(store->depth());
  if (options.store_copy_out) {
    const std::uint64_t bytes = copy_out_staging_bytes(sizes.sub, sizes.max_group_numel, alignment);
    for (std::uint32_t i = 0; i < copy_out_buffer_count(options); ++i) {
      out_staging.push_back(pool->acquire(bytes));
    }
    out_slots.resize(out_staging.size());
  }

  pipeline = std::jthread([this] { pipeline_main(); });
}

OffloadedOptimizer::Impl::~Impl() {
  {
    std::unique_lock lk(mu);
    if (run.active) {
      // Destroyed inside a step: let the queued work finish so no I/O outlives its buffers.
      run.closed = true;
      cv.notify_all();
      cv.wait(lk, [&] { return run.finished; });
      if (!run.error.ok()) {
        log(LogLevel::kWarning,
            "OffloadedOptimizer destroyed inside a failed step: " + run.error.to_string());
      }
    }
    stop = true;
  }
  cv.notify_all();
  if (pipeline.joinable()) pipeline.join();
  if (step_snapshot) Impl::snapshot_step(*step_snapshot, false);  // a step that never ended
  // A save in flight is finished, not cancelled: its snapshot is complete in memory and on the
  // drive, and the caller asked for it. A failure is logged (nobody is left to throw to).
  try {
    wait_save();
  } catch (const std::exception& e) {
    log(LogLevel::kError,
        std::string("OffloadedOptimizer destroyed with a failed asynchronous save: ") + e.what());
  }
  if (store) {
    Status s = store->close();
    if (!s.ok())
      log(LogLevel::kWarning, "OffloadedOptimizer: closing the swap store: " + s.to_string());
  }
}

void OffloadedOptimizer::Impl::check_usable() const {
  if (failure) throw EngineFailed(*failure);
}

void OffloadedOptimizer::Impl::check_idle(const char* what) const {
  if (run.active) {
    throw UsageError(std::string("OffloadedOptimizer::") + what + " inside an open step");
  }
}

void OffloadedOptimizer::Impl::fail(const Status& cause) {
  if (!failure) {
    failure = cause;
    log(LogLevel::kError, "OffloadedOptimizer failed, refusing further work: " + cause.to_string());
  }
}

void OffloadedOptimizer::Impl::ring_pipeline(std::size_t count, const SlotIo& start,
                                             const SlotIo& finish) {
  // Items go round the store's `depth` slots: item i uses slot i % depth once item i - depth
  // has left it (both of its tickets complete). Starts run up to depth items ahead of finishes.
  const std::size_t depth = store->depth();
  std::vector<swap::IoTicket> first(depth), second(depth);
  std::size_t next = 0;
  try {
    for (std::size_t i = 0; i < count; ++i) {
      while (next < count && next < i + depth) {
        const std::size_t s = next % depth;
        second[s].wait();
        first[s] = start(next, s).value_or(swap::IoTicket{});
        ++next;
      }
      const std::size_t s = i % depth;
      first[s].wait();
      second[s] = finish(i, s).value_or(swap::IoTicket{});
    }
    for (auto& t : second) t.wait();
  } catch (...) {
    // No I/O may outlive this call: its slots are reused by the next one.
    for (auto& t : first) t.wait_status().ignore("draining after the first error");
    for (auto& t : second) t.wait_status().ignore("draining after the first error");
    throw;
  }
}

// ---------------------------------------------------------------------------------------------
// Public API

OffloadedOptimizer::OffloadedOptimizer(OptimizerOptions options, std::vector<ParamGroupSpec> groups)
    : impl_(std::make_unique<Impl>(std::move(options), std::move(groups))) {}

OffloadedOptimizer::~OffloadedOptimizer() = default;

std::size_t OffloadedOptimizer::group_count() const noexcept { return impl_->groups.size(); }

std::uint64_t OffloadedOptimizer::sub_group_elements() const noexcept {
  return impl_->options.sub_group_elements;
}

const ParamGroupSpec& OffloadedOptimizer::group(std::size_t index) const {
  if (index >= impl_->groups.size()) {
    throw UsageError("OffloadedOptimizer: group " + std::to_string(index) + " out of range (" +
                     std::to_string(impl_->groups.size()) + " groups)");
  }
  return impl_->groups[index];
}

StateTier OffloadedOptimizer::tier() const noexcept { return impl_->options.tier; }
adam::StatePrecision OffloadedOptimizer::state_precision() const noexcept {
  return impl_->options.state_precision;
}
std::uint64_t OffloadedOptimizer::step_count() const noexcept { return impl_->steps_done; }
const adam::AdamParams& OffloadedOptimizer::hyper() const noexcept { return impl_->hyper; }

const adam::AdamParams& OffloadedOptimizer::hyper(std::size_t group_index) const {
  (void)group(group_index);  // UsageError for an unknown group
  return impl_->group_hyper[group_index];
}

void OffloadedOptimizer::set_hyper(const adam::AdamParams& hyper) {
  impl_->check_idle("set_hyper");
  validate_hyper(hyper);
  impl_->hyper = hyper;
  impl_->group_hyper.assign(impl_->groups.size(), hyper);
}

void OffloadedOptimizer::set_hyper(std::size_t group_index, const adam::AdamParams& hyper) {
  impl_->check_idle("set_hyper");
  const ParamGroupSpec& g = group(group_index);
  validate_hyper(hyper, g.name);
  impl_->group_hyper[group_index] = hyper;
}

void OffloadedOptimizer::set_params(std::size_t group_index, std::span<const float> params) {
  write_state("set_params", group_index, params, {}, {});
}

void OffloadedOptimizer::set_state(std::size_t group_index, std::span<const float> params,
                                   std::span<const float> m, std::span<const float> v) {
  write_state("set_state", group_index, params, m, v);
}

void OffloadedOptimizer::set_step_count(std::uint64_t steps) {
  impl_->check_usable();
  impl_->check_idle("set_step_count");
  impl_->steps_done = steps;
}

// Writes a group's records: params, and m and v (zeros where their span is empty: set_params).
void OffloadedOptimizer::write_state(const char* what, std::size_t group_index,
                                     std::span<const float> params, std::span<const float> m,
                                     std::span<const float> v) {
  Impl& im = *impl_;
  im.check_usable();
  im.check_idle(what);
  const ParamGroupSpec& g = group(group_index);
  const bool moments = !m.empty() || !v.empty();
  for (const auto* s : {&params, &m, &v}) {
    if (s->size() != g.numel && (s == &params || moments)) {
      throw UsageError("OffloadedOptimizer::" + std::string(what) + ": group '" + g.name +
                       "' has " + std::to_string(g.numel) + " elements, got " +
                       std::to_string(s->size()));
    }
  }
  im.wait_save();  // the snapshot may still need the records this overwrites
  const auto& recs = im.group_records[group_index];
  im.initialized[group_index] = false;
  im.ring_pipeline(
      recs.size(),
      [&](std::size_t i, std::size_t slot) -> std::optional<swap::IoTicket> {
        const Record& rec = im.records[recs[i]];
        std::byte* base = im.store->data(slot, recs[i]);
        const RecordLayout lay = im.layout(rec);
        std::copy_n(params.data() + rec.offset, rec.numel, lay.params(base).data());
        if (moments) {
          adam::encode_moments(m.subspan(rec.offset, rec.numel), v.subspan(rec.offset, rec.numel),
                               lay.moments(base));
        } else {
          // Zero moments: all-zero bytes in every precision (int8: codes 0 with scale 0).
          std::memset(base + 4 * rec.numel, 0, rec.bytes - 4 * rec.numel);
        }
        // Zero the padding too, so that stored records (and checkpoints) are deterministic.
        std::memset(base + rec.bytes, 0, rec.padded - rec.bytes);
        return im.store->write_back(slot, recs[i]);
      },
      [](std::size_t, std::size_t) -> std::optional<swap::IoTicket> { return std::nullopt; });
  im.initialized[group_index] = true;
}

void OffloadedOptimizer::read_state(std::size_t group_index, std::span<float> params,
                                    std::span<float> m, std::span<float> v) {
  Impl& im = *impl_;
  im.check_usable();
  im.check_idle("read_state");
  const ParamGroupSpec& g = group(group_index);
  for (auto* s : {&params, &m, &v}) {
    if (!s->empty() && s->size() != g.numel) {
      throw UsageError("OffloadedOptimizer::read_state: group '" + g.name + "' has " +
                       std::to_string(g.numel) + " elements, got a span of " +
                       std::to_string(s->size()));
    }
  }
  if (!im.initialized[group_index]) {
    throw UsageError("OffloadedOptimizer::read_state: group '" + g.name +
                     "' has no state yet (call set_params first)");
  }
  const auto& recs = im.group_records[group_index];
  im.ring_pipeline(
      recs.size(),
      [&](std::size_t i, std::size_t slot) -> std::optional<swap::IoTicket> {
        return im.store->read(slot, recs[i]);
      },
      [&](std::size_t i, std::size_t slot) -> std::optional<swap::IoTicket> {
        const Record& rec = im.records[recs[i]];
        std::byte* base = im.store->data(slot, recs[i]);
        const RecordLayout lay = im.layout(rec);
        if (!params.empty()) std::ranges::copy(lay.params(base), params.data() + rec.offset);
        adam::decode_moments(lay.moments(base), m.empty() ? m : m.subspan(rec.offset, rec.numel),
                             v.empty() ? v : v.subspan(rec.offset, rec.numel));
        return std::nullopt;
      });
}

void OffloadedOptimizer::save(const std::string& dir) {
  check_checkpoint_dir(dir, "OffloadedOptimizer::save");
  impl_->check_usable();
  impl_->check_idle("save");
  impl_->wait_save();
  impl_->save(dir);
}

void OffloadedOptimizer::save(const swap::Dir& dir) { save(dir, SupersededVersions::kRemove); }

void OffloadedOptimizer::save(const swap::Dir& dir, SupersededVersions superseded) {
  impl_->check_usable();
  impl_->check_idle("save");
  impl_->wait_save();
  impl_->save(dir, superseded);
}

void OffloadedOptimizer::remove_superseded_versions() {
  impl_->wait_save();
  impl_->remove_superseded_versions();
}

void OffloadedOptimizer::save_async(const std::string& dir) {
  check_checkpoint_dir(dir, "OffloadedOptimizer::save_async");
  impl_->check_usable();
  impl_->check_idle("save_async");
  impl_->save_async(dir);
}

void OffloadedOptimizer::wait_save() { impl_->wait_save(); }

bool OffloadedOptimizer::save_in_flight() const { return impl_->save_running(); }

SaveSnapshot OffloadedOptimizer::last_save_snapshot() const noexcept {
  return impl_->last_snapshot;
}

void OffloadedOptimizer::load(const std::string& dir) {
  check_checkpoint_dir(dir, "OffloadedOptimizer::load");
  impl_->check_usable();
  impl_->check_idle("load");
  impl_->wait_save();
  impl_->load(dir);
}

void OffloadedOptimizer::load(const swap::Dir& dir) {
  impl_->check_usable();
  impl_->check_idle("load");
  impl_->wait_save();
  impl_->load(dir);
}

const swap::Dir& OffloadedOptimizer::checkpoint_directory(const std::string& dir, bool create) {
  return impl_->open_checkpoint_dir(dir, create);
}

const swap::Dir& OffloadedOptimizer::checkpoint_directory(const swap::Dir& dir) {
  return impl_->open_checkpoint_dir(dir, /*create=*/false);
}

void OffloadedOptimizer::set_checkpoint_file(const std::string& name,
                                             std::optional<std::string> text) {
  const bool reserved = name == "state.bin" || name == "manifest" || name == "run";
  if (name.empty() || name == "." || name == ".." || reserved ||
      name.find_first_of(std::string_view("/\0", 2)) != std::string::npos) {
    throw UsageError("OffloadedOptimizer::set_checkpoint_file: '" + name +
                     "' is not a plain file name of its own");
  }
  if (text && text->size() > (60u << 10)) {
    throw UsageError("OffloadedOptimizer::set_checkpoint_file: '" + name + "' holds " +
                     std::to_string(text->size()) + " bytes, more than 60 KiB");
  }
  if (text) {
    impl_->checkpoint_files[name] = std::move(*text);
  } else {
    impl_->checkpoint_files.erase(name);
  }
}

std::optional<std::string> OffloadedOptimizer::read_checkpoint_file(const swap::Dir& dir,
                                                                    const std::string& name,
                                                                    std::string* path) const {
  return impl_->read_checkpoint_file(dir, name, path);
}

std::string OffloadedOptimizer::checkpoint_run() { return impl_->current_run(); }

void OffloadedOptimizer::set_checkpoint_run(const std::string& run) {
  if (run.size() != 32 || run.find_first_not_of("0123456789abcdef") != std::string::npos) {
    throw UsageError("OffloadedOptimizer::set_checkpoint_run: '" + run.substr(0, 80) +
                     "' is not a run (32 lowercase hex digits)");
  }
  impl_->run_id = run;
}

std::uint64_t OffloadedOptimizer::pinned_bytes() const noexcept {
  return impl_->pool->bytes_in_use();
}
std::uint64_t OffloadedOptimizer::pinned_bytes_peak() const noexcept {
  return impl_->pool->peak_bytes_in_use();
}
std::uint64_t OffloadedOptimizer::record_bytes() const noexcept { return impl_->max_record_bytes; }
std::string_view OffloadedOptimizer::engine_name() const noexcept { return impl_->engine->name(); }
const swap::IoOptions& OffloadedOptimizer::io_options() const noexcept {
  return impl_->engine->options();
}
std::vector<std::string> OffloadedOptimizer::swap_file_paths() const {
  return impl_->store ? impl_->store->file_paths() : std::vector<std::string>{};
}
bool OffloadedOptimizer::failed() const noexcept { return impl_->failure.has_value(); }

}  // namespace zinf::optim
