// SPDX-License-Identifier: Apache-2.0
// OffloadedOptimizer::save_async: a checkpoint written while the steps go on (the design is
// described below), by streaming through the state store or by reflink.
#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint_format.h"
#include "optimizer_impl.h"
#include "zinf/common/error.h"
#include "zinf/common/log.h"
#include "zinf/swap/buffer_pool.h"
#include "zinf/swap/crc32c.h"

namespace zinf::optim {

// ---------------------------------------------------------------------------------------------
// Asynchronous save
//
// save_async() captures the step, hyper-parameters and layout at once (begin_version) and
// leaves the records' bytes where they are; a saver thread then writes record after record
// into the new version's state file, and commits it as save() does. The steps that follow may
// run meanwhile: right before a step updates a record the saver has not written yet, the step
// pipeline (protect_snapshot) copies the record's bytes as they are — the snapshot's — into one
// of eight buffers of the save's own and hands them to the saver, which writes them first; a
// record the saver is reading or writing at that moment is waited for. So each record is
// written with its bytes at the save's step, whatever the steps after it do, and a step is
// held up by at most one record's copy (or the saver's records in flight, or a wait for a free
// copy buffer).
//
// Between steps the saver streams the records still in place with kOwnBuffers of them in
// flight: it reads the next record while it writes the one before, so the drive serves a read
// and a write at once rather than one after the other. It commits (syncs the state file, the
// manifest, LATEST, then removes the superseded version) only between steps too: on ext4
// behind a virtual disk that took 0.25-0.7 s, and a step it overlapped took 3-4x its time
// (`zinf bench step --checkpoint-every`), most of what the save cost the steps.
//
// Reflink: where save_async() could clone every record's blocks from the swap files into the
// state file (clone_records), the state file already is the snapshot, fixed by copy-on-write
// whatever the steps write to the swap files afterwards. The saver then only reads it back
// record by record, checks it against the swap store's unit checksums taken at the clone
// (so corrupt bytes are never saved, as on the streaming path) and computes the manifest's
// CRCs; steps copy nothing and never wait for the save.

class OffloadedOptimizer::Impl::AsyncSave {
 public:
  // Eight: with two, a step that reached the records ahead of the save waited for the save's
  // writes record by record (`zinf bench step --checkpoint-every`: 1.6 s of waits in 10 steps
  // at 32M elements); with eight it did not wait at all there.
  enum class State : std::uint8_t { kPending, kSaving, kCopied, kDone };

  static constexpr std::size_t kCopyBuffers = 8;
  // The saver's own reads, after the copy buffers: two, so that one record is read while the
  // one read before it is written. The save holds kBuffers records of host memory in all.
  static constexpr std::size_t kOwnBuffers = 2;
  static constexpr std::size_t kBuffers = kCopyBuffers + kOwnBuffers;

  // `pool` holds kBuffers records (Impl::save_pool, kept from one save to the next: a fresh
  // mapping per save cost its page faults in the first step after each save_async).
  // `cloned_sums`: the records were cloned into v's state file (clone_records), with these
  // unit checksums; empty: stream them.
  AsyncSave(Impl& opt, VersionWrite v, swap::BufferPool& pool,
            std::vector<std::vector<std::uint32_t>> cloned_sums)
      : opt_(opt),
        v_(std::move(v)),
        state_(opt.records.size(), State::kPending),
        last_close_(opt.last_step_end),
        last_idle_(opt.last_between_steps),
        cloned_(!cloned_sums.empty()),
        cloned_sums_(std::move(cloned_sums)) {
    for (std::size_t b = 0; b < kBuffers; ++b)
      buffers_.push_back(pool.acquire(opt.max_record_bytes));
    free_.assign(kCopyBuffers, true);
    thread_ = std::thread([this] { run(); });
  }
  ~AsyncSave() { (void)wait(); }
  AsyncSave(const AsyncSave&) = delete;
  AsyncSave& operator=(const AsyncSave&) = delete;

  // Joins the saver; its error (or OK). Controlling thread only.
  Status wait() {
    if (thread_.joinable()) thread_.join();
    return error_;
  }
  bool finished() const {
    std::lock_guard g(mu_);
    return finished_;
  }
  // A step opened or closed. While one is open the save writes only the copies steps hand it,
  // and reads and writes the records still in place between steps: the step's own reads and
  // write-backs then have the drive (and the shared I/O engine's queue) to themselves, and
  // the save uses the time a trainer spends in forward and backward.
  void set_step_open(bool open) {
    std::lock_guard g(mu_);
    const auto now = OptClock::now();
    if (open && last_close_ != OptClock::time_point{}) last_idle_ = now - last_close_;
    if (!open) {
      ++closes_;
      last_close_ = now;
    }
    step_open_ = open;
    cv_.notify_all();
  }

  void protect(std::size_t r, const std::byte* base, const std::vector<std::uint32_t>* expected,
               double& waited, std::uint64_t& copied) {
    if (cloned_) return;  // the clone holds the snapshot: the step may overwrite the record
    std::unique_lock lk(mu_);
    const auto t0 = OptClock::now();
    auto ready = [&] {
      if (finished_ || state_[r] == State::kDone || state_[r] == State::kCopied) return true;
      return state_[r] == State::kPending && free_slot() >= 0;
    };
    if (!ready()) {
      cv_.wait(lk, ready);
      waited += std::chrono::duration<double>(OptClock::now() - t0).count();
    }
    if (finished_ || state_[r] != State::kPending) return;
    const int b = free_slot();
    free_[static_cast<std::size_t>(b)] = false;
    state_[r] = State::kCopied;
    lk.unlock();
    const Record& rec = opt_.records[r];
    std::memcpy(buffers_[static_cast<std::size_t>(b)].data(), base, rec.padded);
    copied += rec.padded;
    lk.lock();
    queue_.push_back(
        {r, static_cast<std::size_t>(b), expected ? *expected : std::vector<std::uint32_t>{}});
    cv_.notify_all();
  }

 private:
  struct Copied {
    std::size_t record;
    std::size_t buffer;
    std::vector<std::uint32_t> expected;  // the store's unit CRCs (folded checksums), or none
  };
  // A record the saver reads into one of its own buffers and then writes from it.
  struct InFlight {
    std::size_t record;
    std::size_t buffer;
    std::byte* data;    // the record's bytes: in the buffer, or where the store keeps it
    swap::IoTicket io;  // the read, then the write
    bool writing = false;
  };

  int free_slot() const {
    for (std::size_t b = 0; b < free_.size(); ++b) {
      if (free_[b]) return static_cast<int>(b);
    }
    return -1;
  }

  // Notes record r's CRC and submits its write from `base` at its offset; written() once the
  // ticket completed.
  swap::IoTicket submit_write(swap::FileId id, std::size_t r, std::byte* base) {
    const Record& rec = opt_.records[r];
    v_.crcs[r] = swap::crc32c(std::span<const std::byte>(base, rec.bytes));
    swap::IoRequest req{swap::IoOp::kWrite, id, v_.offsets[r],
                        std::span<std::byte>(base, rec.padded)};
    return opt_.engine->submit(std::span<const swap::IoRequest>(&req, 1));
  }
  void written(std::size_t r) {
    written_ += opt_.records[r].padded;
    opt_.checkpoint_phase("data", written_);
  }
  void write_record(swap::FileId id, std::size_t r, std::byte* base) {
    submit_write(id, r, base).wait();
    written(r);
  }

  // Returns when a sync of the commit should start: at once while no step is open and the
  // time between steps has just begun (or was never seen: no steps), else at the next step's
  // close. A sync started late between steps ran into the next step: on ext4 behind a virtual
  // disk the state file's fsync took 0.3-0.45 s, and started 0.2 s into 0.3 s between steps it
  // stretched the next step from 0.17 s to 0.53 s. Bounded: if no step closes within twice
  // the last time between steps, it starts once none is open (the steps stopped, or no longer
  // pause); steps back to back (no moment without one) let it start at the first close.
  void wait_between_steps() {
    std::unique_lock lk(mu_);
    const std::uint64_t seen = closes_;
    auto open_over = [&] { return !step_open_ || closes_ != seen; };
    if (step_open_) {
      cv_.wait(lk, open_over);
      return;
    }
    if (last_idle_ <= OptClock::duration::zero()) return;
    if (OptClock::now() - last_close_ < last_idle_ / 2) return;
    if (cv_.wait_until(lk, last_close_ + 2 * last_idle_, [&] { return closes_ != seen; })) return;
    cv_.wait(lk, open_over);
  }

  // A copy made from a store slot before the update verified it: check it against the
  // store's unit CRCs here, so that corrupt bytes are never saved.
  void verify_copy(const Copied& c) const {
    verify_units(c.record, buffers_[c.buffer].data(), c.expected);
  }

  // Checks record r's padded bytes at `base` against its swap stripe units' CRCs (none:
  // nothing to check).
  void verify_units(std::size_t r, const std::byte* base,
                    const std::vector<std::uint32_t>& expected) const {
    if (expected.empty()) return;
    const Record& rec = opt_.records[r];
    swap::SwapStore& sw = *opt_.store->swap_store();  // unit sums come from a swap store
    const std::uint64_t unit = sw.stripe_bytes();
    for (std::size_t u = 0; u < expected.size(); ++u) {
      const std::uint64_t begin = u * unit;
      const std::uint64_t len = std::min<std::uint64_t>(unit, rec.padded - begin);
      const std::uint32_t got = swap::crc32c(std::span<const std::byte>(base + begin, len));
      if (got != expected[u]) {
        throw IoError(sw.checksum_error(rec.key, u, expected[u], got));
      }
    }
  }

  // The reflink path: the state file holds every record already; read each back (between
  // steps, as the streaming path reads the swap store: the steps keep the drive), check it
  // and note its CRC.
  void check_clones(swap::FileId id) {
    std::byte* base = buffers_[kCopyBuffers].data();
    for (std::size_t r = 0; r < state_.size(); ++r) {
      {
        std::unique_lock lk(mu_);
        cv_.wait(lk, [&] { return !step_open_; });
      }
      const Record& rec = opt_.records[r];
      swap::IoRequest req{swap::IoOp::kRead, id, v_.offsets[r],
                          std::span<std::byte>(base, rec.padded)};
      opt_.engine->submit(std::span<const swap::IoRequest>(&req, 1)).wait();
      verify_units(r, base, cloned_sums_[r]);
      v_.crcs[r] = swap::crc32c(std::span<const std::byte>(base, rec.bytes));
      written_ += rec.padded;
      opt_.checkpoint_phase("data", written_);
    }
  }

  // The streaming path. From the last record down: a step updates records from the first up,
  // so the two meet once instead of the step finding, record after record, the one the save
  // is writing; and the records the step reaches first it copies, which saves their reads.
  // The steps' copies go first (they hold the copy buffers the next step may need); records
  // still in place are read only between steps, up to kOwnBuffers in flight.
  void stream_records(swap::FileId id) {
    std::deque<InFlight> own;  // oldest first
    std::vector<std::size_t> own_free;
    for (std::size_t b = kCopyBuffers; b < kBuffers; ++b) own_free.push_back(b);
    std::size_t left = state_.size();  // records at or after it are not pending
    try {
      for (;;) {
        std::unique_lock lk(mu_);
        while (left > 0 && state_[left - 1] != State::kPending) --left;
        if (queue_.empty() && left == 0 && own.empty()) {
          // Every record is copied or done: wait for the copies still queued to be written.
          if (std::all_of(state_.begin(), state_.end(),
                          [](State st) { return st == State::kDone; })) {
            break;
          }
          cv_.wait(lk, [&] { return !queue_.empty(); });
        }
        if (!queue_.empty()) {
          Copied c = std::move(queue_.front());
          queue_.pop_front();
          lk.unlock();
          verify_copy(c);
          write_record(id, c.record, buffers_[c.buffer].data());
          lk.lock();
          state_[c.record] = State::kDone;
          free_[c.buffer] = true;
          cv_.notify_all();
          continue;
        }
        if (left > 0 && !step_open_ && !own_free.empty()) {
          const std::size_t r = left - 1;
          state_[r] = State::kSaving;
          lk.unlock();
          const std::size_t b = own_free.back();
          own_free.pop_back();
          // The store reads it into the buffer (checked: with swap checksums a corrupt
          // record fails at its wait, unsaved), or it is in memory and written from there.
          StateStore::Copy got = opt_.store->read_copy(r, buffers_[b].span());
          if (got.io) {
            own.push_back({r, b, got.data, std::move(*got.io), false});
          } else {
            own.push_back({r, b, got.data, submit_write(id, r, got.data), true});
          }
          continue;
        }
        if (!own.empty()) {
          lk.unlock();
          InFlight& f = own.front();
          f.io.wait();
          if (!f.writing) {
            f.io = submit_write(id, f.record, f.data);
            f.writing = true;
            continue;
          }
          written(f.record);
          own_free.push_back(f.buffer);
          const std::size_t r = f.record;
          own.pop_front();
          lk.lock();
          state_[r] = State::kDone;
          cv_.notify_all();
          continue;
        }
        // Records are pending but a step is open: wait for its copies or its end.
        cv_.wait(lk, [&] { return !queue_.empty() || !step_open_; });
      }
    } catch (...) {
      // The buffers and the state file outlive this call, not the I/O still in flight on them.
      for (InFlight& f : own) f.io.wait_status().ignore("the save failed already");
      throw;
    }
  }

  void run() {
    try {
      if (cloned_) {
        Attached att(*opt_.engine, v_.file);
        check_clones(att.id());
      } else {
        Attached att(*opt_.engine, v_.file);
        stream_records(att.id());
      }
      // Each of the commit's syncs (and the removal of the version it supersedes) starts
      // between steps, so that a step overlaps at most one of them.
      opt_.commit_version(v_, [this] { wait_between_steps(); });
    } catch (...) {
      error_ = naming_checkpoint(status_from_current_exception(), opt_.checkpoint_dir.path());
      if (!renamed_into_place(opt_.checkpoint_dir, v_.name)) opt_.abandon_version(v_);
    }
    std::lock_guard g(mu_);
    finished_ = true;  // the steps no longer wait for records of this save
    cv_.notify_all();
  }

  Impl& opt_;
  VersionWrite v_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<State> state_;  // guarded by mu_
  std::deque<Copied> queue_;  // guarded by mu_
  std::vector<bool> free_;    // guarded by mu_: copy buffers not holding a queued copy
  bool finished_ = false;     // guarded by mu_
  bool step_open_ = false;    // guarded by mu_
  // Guarded by mu_, for wait_between_steps: set_step_open(false) calls, the last one's time
  // (at first, the end of the step before the save), and the time from a close to the open
  // after it (at first, the optimizer's last).
  std::uint64_t closes_ = 0;
  OptClock::time_point last_close_;
  OptClock::duration last_idle_;
  const bool cloned_;                                          // the reflink path: see check_clones
  const std::vector<std::vector<std::uint32_t>> cloned_sums_;  // per record, at the clone
  std::vector<swap::BufferLease> buffers_;
  std::uint64_t written_ = 0;  // saver thread only
  Status error_;               // set by the saver before it ends; read after join
  std::thread thread_;         // last: started once everything above exists
};

void OffloadedOptimizer::Impl::protect_snapshot(AsyncSave& save, std::size_t record,
                                                const std::byte* base,
                                                const std::vector<std::uint32_t>* expected,
                                                double& waited, std::uint64_t& copied) {
  save.protect(record, base, expected, waited, copied);
}

void OffloadedOptimizer::Impl::snapshot_step(AsyncSave& save, bool open) {
  save.set_step_open(open);
}

void OffloadedOptimizer::Impl::save_async(const CheckpointPlace& dir) {
  wait_save();  // the previous one's error, if any, is thrown here and nothing new starts
  if (!save_pool) {
    save_pool = std::make_unique<swap::BufferPool>(
        swap::BufferPoolOptions{.budget_bytes = AsyncSave::kBuffers * max_record_bytes,
                                .alignment = std::max<std::uint32_t>(alignment, 4096)});
  }
  VersionWrite v = begin_version(dir);
  std::vector<std::vector<std::uint32_t>> sums;
  std::string why;
  bool cloned = false;
  try {
    cloned = store->clone_records(options.checkpoint_reflink, v.file, v.offsets, sums, why,
                                  checkpoint_dir.path());
    if (cloned) checkpoint_phase("cloned", v.total);
  } catch (...) {
    abandon_version(v);
    rethrow_naming_checkpoint(checkpoint_dir);
  }
  // A notice when the path (or the reason to stream) changes, not at every save: a run saving
  // every few steps would otherwise repeat the same line all along.
  if (cloned) {
    const bool again = last_snapshot == SaveSnapshot::kReflink;
    log(again ? LogLevel::kInfo : LogLevel::kNotice,
        "checkpoint: snapshot by reflink (" + std::to_string(records.size()) + " records, " +
            std::to_string(v.total) + " bytes) into " + v.vdir.path());
    last_stream_reason.clear();
  } else {
    sums.clear();
    const bool again = last_snapshot == SaveSnapshot::kStreamed && why == last_stream_reason;
    log(again ? LogLevel::kDebug : LogLevel::kNotice,
        "checkpoint: streamed, not snapshot by reflink: " + why);
    last_stream_reason = why;
  }
  last_snapshot = cloned ? SaveSnapshot::kReflink : SaveSnapshot::kStreamed;
  async_save = std::make_shared<AsyncSave>(*this, std::move(v), *save_pool, std::move(sums));
}

bool OffloadedOptimizer::Impl::save_running() const {
  return async_save && !async_save->finished();
}

void OffloadedOptimizer::Impl::wait_save() {
  if (!async_save) return;
  // Called inside a step, the save must not wait for that step to close: it goes on at once.
  async_save->set_step_open(false);
  const Status s = async_save->wait();
  async_save.reset();
  throw_if_error(s);
}

}  // namespace zinf::optim
