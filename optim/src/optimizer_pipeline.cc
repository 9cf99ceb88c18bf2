// SPDX-License-Identifier: Apache-2.0
// OffloadedOptimizer's step pipeline: the thread that reads each queued sub-group's record
// into a state store slot, updates it with CpuAdam (folding the swap checksums into the
// update where the store has them), writes it back and copies the parameters out.
#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>

#include "optimizer_impl.h"
#include "zinf/common/error.h"
#include "zinf/optim/optimizer.h"

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
}  // namespace

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
  const std::size_t out_bytes = hold ? out.size * element_size(out.dtype) : 0;
  if (hold) {
    if (copy_out_hold.size() < out_bytes) copy_out_hold.resize(out_bytes);
    out.data = copy_out_hold.data();
  }
  adam.step(hp, p, moments, t.grads, out, &hooks);
  // Checked before the caller writes the record back or copies the parameters out: bytes that
  // differ from what was written are never handed on (the update made from them stays in the
  // store's slot, which the failed step drops).
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
}  // namespace zinf::optim
