// SPDX-License-Identifier: Apache-2.0
// OffloadedOptimizer: construction (records, budget check, engine, pool, swap store), the
// pipelined step on its own thread, and parameter access (set_params, read_state).
// Checkpoints are in optimizer_checkpoint.cc.
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

// The Status behind the exception being handled, for the pipeline thread, which passes
// errors as values (docs/style.md section 3); one that names no operation is the step's.
Status current_exception_status() {
  Status s = status_from_current_exception();
  if (s.operation().empty()) s.with_operation("optimizer step");
  return s;
}

// Seconds covered by the union of [begin, end) intervals.
double union_seconds(std::vector<std::pair<OptClock::time_point, OptClock::time_point>> v) {
  std::sort(v.begin(), v.end());
  double total = 0;
  std::optional<std::pair<OptClock::time_point, OptClock::time_point>> cur;
  for (const auto& iv : v) {
    if (cur && iv.first <= cur->second) {
      cur->second = std::max(cur->second, iv.second);
      continue;
    }
    if (cur) total += std::chrono::duration<double>(cur->second - cur->first).count();
    cur = iv;
  }
  if (cur) total += std::chrono::duration<double>(cur->second - cur->first).count();
  return total;
}

adam::GradView slice(const adam::GradView& g, std::uint64_t offset, std::uint64_t n) {
  const auto* base = static_cast<const std::byte*>(g.data);
  return {base + offset * dtype_size(g.dtype), n, g.dtype};
}

adam::CopyOut slice(const adam::CopyOut& o, std::uint64_t offset, std::uint64_t n) {
  if (!o.enabled) return adam::CopyOut::none();
  auto* base = static_cast<std::byte*>(o.data);
  return {base + offset * dtype_size(o.dtype), n, o.dtype, true};
}

// What the pinned budget must hold, and how to say it in an error.
struct PinnedPlan {
  std::uint64_t need = 0;
  std::string what;
};

std::uint64_t copy_out_staging_bytes(std::uint64_t sub, std::uint64_t max_group_numel,
                                     std::uint32_t alignment) {
  return align_up(std::min(sub, max_group_numel) * 2, alignment);
}

// The pinned budget's need: the store's (its plan) and the copy-out staging.
PinnedPlan plan_pinned(const OptimizerOptions& o, const StateStorePlan& store,
                       const RecordSizes& sizes) {
  PinnedPlan plan{store.pinned_bytes, store.pinned_what};
  if (o.store_copy_out) {
    const std::uint64_t staging =
        copy_out_staging_bytes(sizes.sub, sizes.max_group_numel, store.alignment);
    const std::uint64_t count = copy_out_buffer_count(o);
    plan.need += count * staging;
    plan.what += ", plus the copy-out staging: " + std::to_string(count) + " x " +
                 std::to_string(staging) + " bytes";
  }
  return plan;
}

}  // namespace

std::uint32_t copy_out_buffer_count(const OptimizerOptions& options) {
  return std::max<std::uint32_t>(options.pipeline_depth, 2);
}

std::uint64_t store_copy_out_sub_group(std::uint64_t requested, const swap::SwapStore& store) {
  const std::uint64_t unit = store.checksums()
                                 ? std::max<std::uint64_t>(store.stripe_bytes(), store.alignment())
                                 : store.alignment();
  return align_up(std::max<std::uint64_t>(requested, 1) * 2, unit) / 2;
}

namespace {

// 2^40 elements (12 TiB of state) per group keeps every byte count far from overflow.
constexpr std::uint64_t kMaxNumel = std::uint64_t{1} << 40;
// A bound on the bookkeeping (a key and a lease per sub-group): 2^22 sub-groups.
constexpr std::uint64_t kMaxRecords = std::uint64_t{1} << 22;

// Every check of the options and groups that needs no file and no memory, in one place: the
// constructor runs it first, and optimizer_pinned_bytes_needed runs it too, so that a caller
// (OffloadEngine) learns of any refusal before it creates files of its own. Returns the
// number of sub-group records.
std::uint64_t check_options(const OptimizerOptions& options,
                            const std::vector<ParamGroupSpec>& groups) {
  if (groups.empty()) throw UsageError("OffloadedOptimizer: no parameter groups");
  std::unordered_set<std::string> names;
  for (const auto& grp : groups) {
    if (grp.numel == 0 || grp.numel > kMaxNumel) {
      throw UsageError("OffloadedOptimizer: group '" + grp.name + "' numel " +
                       std::to_string(grp.numel) + " is out of range [1, 2^40]");
    }
    if (grp.name.empty() || grp.name.find_first_of("\r\n") != std::string::npos) {
      throw UsageError("OffloadedOptimizer: group names must be non-empty single lines");
    }
    if (!names.insert(grp.name).second) {
      throw UsageError("OffloadedOptimizer: duplicate group name '" + grp.name + "'");
    }
  }
  validate_hyper(options.hyper);
  for (const auto& grp : groups) {
    if (grp.hyper) validate_hyper(*grp.hyper, grp.name);
  }
  const std::uint64_t sub = std::min(options.sub_group_elements, kMaxNumel);
  std::uint64_t record_count = 0;
  for (const auto& grp : groups) record_count += (grp.numel + sub - 1) / sub;
  if (record_count > kMaxRecords) {
    throw UsageError("OffloadedOptimizer: " + std::to_string(record_count) +
                     " sub-groups exceed the limit of " + std::to_string(kMaxRecords) +
                     "; raise sub_group_elements");
  }
  return record_count;
}

// The most elements, at most `most`, whose record in precision `p` takes at most `limit` bytes
// (record bytes grow with the count); for int8 a multiple of its scale block where that is
// possible, so that only a group's last record has a short block.
std::uint64_t elements_within(adam::StatePrecision p, std::uint64_t limit, std::uint64_t most) {
  std::uint64_t lo = 1, hi = most;
  while (lo < hi) {
    const std::uint64_t mid = hi - (hi - lo) / 2;
    if (record_state_bytes(p, mid) <= limit) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  if (p == adam::StatePrecision::kInt8 && lo >= adam::kInt8Block) lo -= lo % adam::kInt8Block;
  return lo;
}

}  // namespace

std::uint64_t default_sub_group_elements(adam::StatePrecision precision) noexcept {
  // fp32's record at 1M elements: 12 MiB (fp32 1,048,576, bf16 1,572,864, int8 2,054,336).
  constexpr std::uint64_t kRecordBytes = std::uint64_t{12} << 20;
  return elements_within(precision, kRecordBytes, kRecordBytes);
}

std::uint64_t effective_sub_group_elements(const OptimizerOptions& options,
                                           const std::vector<ParamGroupSpec>& groups) {
  const std::uint64_t want =
      std::min(options.sub_group_elements == 0 ? default_sub_group_elements(options.state_precision)
                                               : options.sub_group_elements,
               kMaxNumel);
  if (!options.fit_sub_groups_to_stripes || options.store_copy_out) return want;
  bool splits = false;
  for (const auto& g : groups) splits = splits || g.numel > want;
  if (!splits) return want;
  // The stripe unit of the store the optimizer makes (SwapStoreOptions' default); the records'
  // 4 KiB padding is the smallest alignment a direct-I/O file system asks.
  const std::uint64_t stripe = swap::SwapStoreOptions{}.stripe_bytes;
  const adam::StatePrecision p = options.state_precision;
  const std::uint64_t bytes = align_up(record_state_bytes(p, want), 4096);
  if (bytes <= stripe || bytes % stripe == 0) return want;
  return elements_within(p, bytes / stripe * stripe, want);
}

std::uint64_t optimizer_pinned_bytes_needed(const OptimizerOptions& options,
                                            const std::vector<ParamGroupSpec>& groups) {
  OptimizerOptions o = options;
  o.sub_group_elements = effective_sub_group_elements(options, groups);
  (void)check_options(o, groups);
  const StateStorePlan store = plan_state_store(o, groups);
  return plan_pinned(o, store, record_sizes(o, groups, store.alignment)).need;
}

double clip_coefficient(double clip, double norm) noexcept {
  constexpr double kClipEpsilon = 1e-6;
  return clip > 0 ? std::min(1.0, clip / (norm + kClipEpsilon)) : 1.0;
}

std::string_view save_snapshot_name(SaveSnapshot snapshot) noexcept {
  switch (snapshot) {
    case SaveSnapshot::kReflink: return "reflink";
    case SaveSnapshot::kStreamed: return "streamed";
    case SaveSnapshot::kNone: break;
  }
  return "none";
}

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

void validate_hyper(const adam::AdamParams& hp, const std::string& group) {
  if (auto bad = adam::check_adam_params(hp)) {
    const std::string where = group.empty() ? "" : "group '" + group + "': ";
    throw UsageError("OffloadedOptimizer: " + where + std::string(bad->field) + " " + bad->what);
  }
}

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
      log(LogLevel::kWarning, "OffloadedOptimizer: closing the state store: " + s.to_string());
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
// The step pipeline
//
// One thread (pipeline_main) drives every step's sub-group tasks in the order step_group()
// queued them, over the state store's `depth` slots (state_store.h):
//   read:    task r's record is brought into slot r % depth as soon as that slot is idle
//            (no read or write-back in flight) and r < c + depth: up to depth - 1 reads ahead
//            of the update.
//   update:  task c runs CpuAdam on its slot once its read is in (CpuAdam's own pool does
//            the arithmetic; this thread waits for it).
//   write:   the slot is written back at once, asynchronously; the slot is reused only after
//            that write's completion callback has marked it idle.
// With the nvme store's ring of depth 3 the drive sees the read of c+1 and the write-back of
// c-1 while c is updated. The cpu store's slots are the records: its reads and write-backs
// need no I/O (the store says so), so its tasks are updated in place, in order.
//
// Completions arrive as callbacks on engine threads that update the slot flags under `mu` and
// notify `cv`; the thread sleeps on `cv` until some stage can move (pipeline_can_progress),
// so it never polls. Bounds: depth buffers, depth reads plus depth writes in flight.
//
// Errors: the first failure (a callback's Status, or an exception from a submit or the
// kernel) is kept in run.error; the remaining tasks are dropped, in-flight I/O drains, and
// end_step() throws it. `run.modified` records whether any state may have changed (a
// write-back submitted, or an in-place update): if so the optimizer fails for good (a mix of
// old and new sub-groups must never be trained on); if not (a read failed before any
// write-back), the step is undone and the optimizer stays usable.
// Why a dedicated thread rather than the Asio pool: the driver spends its life waiting on I/O
// completions and on CpuAdam (which has its own pool); one sequential loop keeps the ring's
// invariants in one place.

bool OffloadedOptimizer::Impl::pipeline_can_progress(std::size_t c, std::size_t r) const {
  if (!run.active || run.finished) return false;
  const std::size_t n = run.tasks.size();
  if (run.closed && c >= n && io_idle()) return true;  // finish the step
  if (!run.error.ok()) return c < n || r < n;          // drop queued tasks
  // A task with a StoreCopyOut also needs its staging buffer's previous write to be over.
  auto out_free = [&](std::size_t t) {
    return !run.tasks[t].store_out || !out_slots[t % out_slots.size()].writing;
  };
  const std::size_t depth = slots.size();
  if (r < n && r < c + depth) {
    const Slot& s = slots[r % depth];
    if (!s.reading && !s.writing) return true;  // start a read
  }
  return c < r && !slots[c % depth].reading && out_free(c);  // update the next task
}

bool OffloadedOptimizer::Impl::io_idle() const {
  return std::none_of(slots.begin(), slots.end(),
                      [](const Slot& s) { return s.reading || s.writing; }) &&
         std::none_of(out_slots.begin(), out_slots.end(),
                      [](const OutSlot& s) { return s.writing; });
}

namespace {

// The update's hooks for folded checksums: each piece of params, m and v (and, int8, the
// piece's scales) is summed right before the kernel reads it and right after it wrote it,
// while it is in the core's cache. Pieces start on int8 blocks (CpuAdam's compact step), so
// the scale ranges of different pieces never share a block.
struct FoldedPass {
  swap::UnitSums* read;
  swap::UnitSums* written;
  std::byte* base;
  std::uint64_t numel;
  adam::CompactMoments moments;  // pointers into base

  std::uint64_t at(const void* p) const {
    return static_cast<std::uint64_t>(static_cast<const std::byte*>(p) - base);
  }
  void add(swap::UnitSums& sums, std::size_t begin, std::size_t end) const {
    sums.add(base, begin * sizeof(float), (end - begin) * sizeof(float));  // params
    const std::uint64_t elem = moments.precision == adam::StatePrecision::kF32    ? 4
                               : moments.precision == adam::StatePrecision::kBF16 ? 2
                                                                                  : 1;
    sums.add(base, at(moments.m) + begin * elem, (end - begin) * elem);
    sums.add(base, at(moments.v) + begin * elem, (end - begin) * elem);
    if (moments.precision == adam::StatePrecision::kInt8) {
      const std::uint64_t b0 = begin / adam::kInt8Block;
      const std::uint64_t b1 = (end + adam::kInt8Block - 1) / adam::kInt8Block;
      sums.add(base, at(moments.m_scale) + b0 * 4, (b1 - b0) * 4);
      sums.add(base, at(moments.v_scale) + b0 * 4, (b1 - b0) * 4);
    }
  }
  static void before(void* ctx, std::size_t begin, std::size_t end) {
    const auto* f = static_cast<const FoldedPass*>(ctx);
    f->add(*f->read, begin, end);
  }
  static void after(void* ctx, std::size_t begin, std::size_t end) {
    const auto* f = static_cast<const FoldedPass*>(ctx);
    f->add(*f->written, begin, end);
  }
};

}  // namespace

void OffloadedOptimizer::Impl::compute(const adam::AdamParams& hp, const Task& t, std::byte* base,
                                       std::size_t slot) {
  const Record& rec = records[t.record];
  const RecordLayout lay = layout(rec);
  const auto p = lay.params(base);
  const adam::CompactMoments moments = lay.moments(base);
  if (!folded_sums()) {
    adam.step(hp, p, moments, t.grads, t.out);
    return;
  }
  // The record's bytes as the store keeps them: the three arrays, then padding to the
  // store's alignment, which the update does not touch (summed once, for both sides).
  const std::uint64_t state = rec.bytes;
  swap::SwapStore& sw = *store->swap_store();  // folded sums: the records are in a swap store
  const std::uint64_t stored = sw.padded_size(state);
  const std::size_t pieces = 5 * (rec.numel / adam::kHookPieceElements + 2);
  sums_read.reset(stored, sw.stripe_bytes(), pieces);
  sums_written.reset(stored, sw.stripe_bytes(), pieces);
  if (stored > state) {
    sums_read.add(base, state, stored - state);
    sums_written.add(base, state, stored - state);
  }
  FoldedPass pass{&sums_read, &sums_written, base, rec.numel, moments};
  const adam::ChunkHooks hooks{FoldedPass::before, FoldedPass::after, &pass};
  // The caller's parameters (not a copy-out staging buffer of ours, which is only written
  // back after this returns) must not see an update made from bytes that fail the check.
  adam::CopyOut out = t.out;
  const bool hold = out.enabled && !t.store_out;
  const std::size_t out_bytes = hold ? out.size * dtype_size(out.dtype) : 0;
  if (hold) {
    if (copy_out_hold.size() < out_bytes) copy_out_hold.resize(out_bytes);
    out.data = copy_out_hold.data();
  }
  adam.step(hp, p, moments, t.grads, out, &hooks);
  // Checked before the caller writes the record back or copies the parameters out: bytes that
  // differ from what was written are never handed on (the update made from them stays in the
  // ring buffer, which the failed step drops).
  const std::span<const std::uint32_t> found = sums_read.finish();
  const std::vector<std::uint32_t>& expected = slot_expected[slot];
  std::optional<Status> corrupt;
  for (std::size_t u = 0; u < found.size(); ++u) {
    if (found[u] == expected[u]) continue;
    Status s = sw.checksum_error(rec.key, u, expected[u], found[u]);  // counts each unit
    if (!corrupt) corrupt = std::move(s);
  }
  if (corrupt) throw IoError(*corrupt);
  if (hold && out_bytes > 0) std::memcpy(t.out.data, copy_out_hold.data(), out_bytes);
}

void OffloadedOptimizer::Impl::note_error(const Status& s) {
  if (run.error.ok()) run.error = s;
}

swap::IoCallback OffloadedOptimizer::Impl::on_io_done(std::size_t slot, bool write,
                                                      std::uint64_t bytes,
                                                      OptClock::time_point at) {
  // Notifies under the lock, so nothing of this object is touched once the lock is released.
  return [this, slot, write, bytes, at](const Status& s) {
    std::lock_guard g(mu);
    const auto now = OptClock::now();
    if (write) {
      slots[slot].writing = false;
      run.writes.emplace_back(at, now);
      if (s.ok()) run.stats.bytes_written += bytes;
    } else {
      slots[slot].reading = false;
      run.reads.emplace_back(at, now);
      if (s.ok()) run.stats.bytes_read += bytes;
    }
    if (!s.ok() && run.error.ok()) run.error = s;
    cv.notify_all();
  };
}

swap::IoCallback OffloadedOptimizer::Impl::on_out_done(std::size_t out_slot, std::uint64_t bytes,
                                                       OptClock::time_point at) {
  return [this, out_slot, bytes, at](const Status& s) {
    std::lock_guard g(mu);
    out_slots[out_slot].writing = false;
    run.writes.emplace_back(at, OptClock::now());
    if (s.ok()) run.stats.copy_out_bytes += bytes;
    if (!s.ok() && run.error.ok()) run.error = s;
    cv.notify_all();
  };
}

void OffloadedOptimizer::Impl::start_reads(std::unique_lock<std::mutex>& lk, std::size_t c,
                                           std::size_t& r) {
  const std::size_t n = run.tasks.size();
  const std::size_t depth = slots.size();
  while (run.error.ok() && r < n && r < c + depth) {
    const std::size_t si = r % depth;
    Slot& s = slots[si];
    if (s.reading || s.writing) break;
    const std::size_t ri = run.tasks[r].record;
    s.reading = true;
    ++r;
    const auto at = OptClock::now();
    lk.unlock();
    std::optional<swap::IoTicket> t;
    std::optional<Status> err;
    try {
      t = store->read(si, ri, on_io_done(si, false, records[ri].padded, at),
                      folded_sums() ? &slot_expected[si] : nullptr);
    } catch (...) {
      err = current_exception_status();
    }
    lk.lock();
    if (err) {
      slots[si].reading = false;
      note_error(*err);
    } else if (!t) {
      slots[si].reading = false;  // in place already: nothing to wait for
    } else {
      slots[si].read = std::move(*t);
    }
  }
}

bool OffloadedOptimizer::Impl::run_ready_hook(std::unique_lock<std::mutex>& lk, std::size_t c) {
  if (!run.tasks[c].ready) return false;
  // The group's gradients are still arriving: wait for them (reads ahead stay in flight), then
  // look at the task again.
  const std::function<void()> ready = std::move(run.tasks[c].ready);
  run.tasks[c].ready = nullptr;
  lk.unlock();
  std::optional<Status> err;
  const auto w0 = OptClock::now();
  try {
    ready();
  } catch (...) {
    err = current_exception_status();
  }
  lk.lock();
  run.stats.wait_seconds += std::chrono::duration<double>(OptClock::now() - w0).count();
  if (err) note_error(*err);
  return true;
}

void OffloadedOptimizer::Impl::update_task(std::unique_lock<std::mutex>& lk, std::size_t& c) {
  Task task = run.tasks[c];
  const std::size_t oi = task.store_out ? c % out_slots.size() : 0;
  if (task.store_out) {
    out_slots[oi].writing = true;  // reserved until the copy-out write completes
    task.out = {out_staging[oi].data(), static_cast<std::size_t>(records[task.record].numel),
                task.store_out->dtype, true};
  }
  adam::AdamParams hp = run.hp[records[task.record].group];
  hp.step = run.step;
  const Record& rec = records[task.record];
  const std::size_t si = c % slots.size();
  ++c;
  run.modified = run.modified || store->in_place();  // the update changes the stored state
  slots[si].writing = true;                          // reserved until the write-back completes
  std::byte* base = store->data(si, task.record);
  const std::shared_ptr<AsyncSave> snapshot = step_snapshot;
  lk.unlock();
  std::optional<Status> err;
  double snapshot_wait = 0;
  std::uint64_t snapshot_copy = 0;
  if (snapshot) {
    // A save in flight may still need this record's bytes as they are: copied first.
    try {
      protect_snapshot(*snapshot, task.record, base, folded_sums() ? &slot_expected[si] : nullptr,
                       snapshot_wait, snapshot_copy);
    } catch (...) {
      err = current_exception_status();
    }
  }
  const auto t0 = OptClock::now();
  try {
    if (!err) compute(hp, task, base, si);
  } catch (...) {
    err = current_exception_status();
  }
  const auto t1 = OptClock::now();
  std::optional<swap::IoTicket> ot;
  if (!err && task.store_out) {
    const StoreCopyOut& so = *task.store_out;
    const std::uint64_t len = rec.numel * 2;
    const std::uint64_t padded = so.store->padded_size(len);
    // The range's padding (at the tensor's end) is written too: zero it, so that the stored
    // bytes are deterministic.
    std::memset(out_staging[oi].data() + len, 0, padded - len);
    try {
      ot = so.store->swap_out_range(so.key, rec.offset * 2, len,
                                    out_staging[oi].span().first(padded), on_out_done(oi, len, t1));
    } catch (...) {
      err = current_exception_status();
    }
  }
  std::optional<swap::IoTicket> wt;
  if (!err) {
    try {
      wt = store->write_back(
          si, task.record, on_io_done(si, true, rec.padded, t1),
          folded_sums() ? sums_written.finish() : std::span<const std::uint32_t>{});
    } catch (...) {
      err = current_exception_status();
    }
  }
  if (task.consumed) task.consumed();  // the kernel has read the gradients
  lk.lock();
  run.stats.compute_seconds += std::chrono::duration<double>(t1 - t0).count();
  run.stats.snapshot_wait_seconds += snapshot_wait;
  run.stats.snapshot_copy_bytes += snapshot_copy;
  if (task.store_out) {
    if (ot) {
      run.modified = true;  // the parameter store's key changed
      out_slots[oi].write = std::move(*ot);
    } else {
      out_slots[oi].writing = false;
    }
  }
  if (wt) {
    run.modified = true;
    slots[si].write = std::move(*wt);
  } else {
    slots[si].writing = false;  // failed, or in place: nothing to write back
  }
  if (err) {
    note_error(*err);
  } else {
    ++run.stats.sub_groups;
    run.stats.elements += rec.numel;
  }
}

void OffloadedOptimizer::Impl::pipeline_main() {
  std::unique_lock lk(mu);
  std::size_t c = 0;  // next task to update
  std::size_t r = 0;  // next task to read, r >= c
  for (;;) {
    const bool waiting_for_io =
        run.active && !run.finished && run.error.ok() && c < run.tasks.size();
    const auto wait_from = OptClock::now();
    cv.wait(lk, [&] { return stop || pipeline_can_progress(c, r); });
    if (waiting_for_io) {
      run.stats.wait_seconds += std::chrono::duration<double>(OptClock::now() - wait_from).count();
    }
    if (!run.active || run.finished) {
      if (stop) return;
      continue;
    }
    const std::size_t n = run.tasks.size();
    if (!run.error.ok()) {
      drop_tasks(c, n);
      c = r = n;  // drop what is queued; I/O in flight drains through its callbacks
    }

    start_reads(lk, c, r);

    // Update the next task once its record is in, then write it back.
    if (run.error.ok() && c < r && !slots[c % slots.size()].reading &&
        (!run.tasks[c].store_out || !out_slots[c % out_slots.size()].writing)) {
      if (!run_ready_hook(lk, c)) update_task(lk, c);
      continue;
    }

    // Close the step once end_step() asked, every task is done and no I/O is in flight.
    if (run.closed && c >= run.tasks.size() && io_idle()) {
      run.stats.seconds = std::chrono::duration<double>(OptClock::now() - run.began).count();
      run.stats.read_seconds = union_seconds(run.reads);
      run.stats.write_seconds = union_seconds(run.writes);
      run.stats.step = run.step;
      run.finished = true;
      for (auto& s : slots) s = Slot{};  // drop the tickets
      for (auto& s : out_slots) s = OutSlot{};
      c = r = 0;
      cv.notify_all();
    }
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
  if (out.dtype == DType::kF32) throw UsageError(where + ": dtype must be bf16 or fp16");
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

void OffloadedOptimizer::save(const std::string& dir) {
  check_checkpoint_dir(dir, "OffloadedOptimizer::save");
  impl_->check_usable();
  impl_->check_idle("save");
  impl_->wait_save();
  impl_->save(dir);
}

void OffloadedOptimizer::save(const swap::Dir& dir) {
  impl_->check_usable();
  impl_->check_idle("save");
  impl_->wait_save();
  impl_->save(dir);
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
