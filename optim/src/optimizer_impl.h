// SPDX-License-Identifier: Apache-2.0
// OffloadedOptimizer's private state, shared by optimizer.cc (construction, parameter access),
// optimizer_plan.cc (checks and the budget), optimizer_step.cc and optimizer_pipeline.cc (the
// step), and the checkpoint files. The records live in a StateStore (state_store.h). Private
// to zinf::optim.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "state_store.h"
#include "zinf/adam/compact_state.h"
#include "zinf/adam/cpu_adam.h"
#include "zinf/common/status.h"
#include "zinf/optim/optimizer.h"
#include "zinf/swap/buffer_pool.h"
#include "zinf/swap/dir.h"
#include "zinf/swap/file.h"
#include "zinf/swap/io_engine.h"
#include "zinf/swap/swap_store.h"
#include "zinf/swap/unit_sums.h"

namespace zinf::optim {

using OptClock = std::chrono::steady_clock;

/// One sub-group's update in the open step: the record and its slices of the caller's arrays.
struct Task {
  std::size_t record = 0;
  adam::GradView grads;
  adam::CopyOut out;
  // StoreCopyOut: the target (shared by the group's tasks); out is then set by the pipeline
  // to a staging buffer, written to the key at byte 2 x Record::offset.
  std::shared_ptr<const StoreCopyOut> store_out;
  // The group's GradHooks: `ready` on its first task (cleared once it has run), `consumed` on
  // its last.
  std::function<void()> ready;
  std::function<void()> consumed;
};

/// A copy-out staging buffer as the step pipeline sees it (guarded by Impl::mu).
struct OutSlot {
  bool writing = false;  // the swap_out_range from this buffer is in flight
  swap::IoTicket write;
};

/// A store slot as the step pipeline sees it (guarded by Impl::mu).
struct Slot {
  bool reading = false;  // a read into the slot is in flight
  bool writing = false;  // a write-back from the slot is in flight
  swap::IoTicket read;
  swap::IoTicket write;
};

/// The open step, shared by the controlling thread and the pipeline thread (guarded by mu).
struct StepRun {
  bool active = false;    // begin_step() .. end_step()
  bool closed = false;    // end_step() called: no more tasks
  bool finished = false;  // the pipeline has drained this step
  std::vector<Task> tasks;
  std::vector<bool> given;  // per group
  std::uint64_t step = 0;   // this step's number
  // Per group, copied at begin_step(): a set_hyper between steps never reaches a step in flight.
  std::vector<adam::AdamParams> hp;
  Status error;           // the first failure
  bool modified = false;  // the stored state was (or may have been) changed
  StepStats stats;
  OptClock::time_point began{};
  std::vector<std::pair<OptClock::time_point, OptClock::time_point>> reads;
  std::vector<std::pair<OptClock::time_point, OptClock::time_point>> writes;
};

/// A checkpoint version being written (optimizer_checkpoint.cc): what save() and save_async()
/// capture at the start, so that both write one format through the same code. The state file's
/// records follow `records` in order, at `offsets`.
struct VersionWrite {
  std::string name;  // the version directory's final name
  std::string tmp;   // name + ".tmp": where it is written until complete
  swap::Dir vdir;    // <dir>/<tmp>
  swap::File file;   // <tmp>/state.bin, created exclusively and preallocated
  std::uint64_t step = 0;
  adam::AdamParams hp;
  std::vector<ParamGroupSpec> groups;  // each with its own set in ParamGroupSpec::hyper
  std::vector<std::uint64_t> offsets;  // per record
  std::vector<std::uint32_t> crcs;     // per record, set as each is written
  std::uint64_t total = 0;             // bytes of state.bin
  // Files written into the version beside the state, committed with it: the run's identity
  // and the caller's (set_checkpoint_file), as they were at begin_version.
  std::vector<std::pair<std::string, std::string>> files;
  // Logged once the version is current: LATEST named another run's checkpoint before it.
  std::string superseded;
  // SupersededVersions::kKeep: the versions this one supersedes stay after the switch.
  bool keep_superseded = false;
};

struct OffloadedOptimizer::Impl {
  class AsyncSave;  // optimizer_checkpoint.cc: a save_async() in flight

  Impl(OptimizerOptions o, std::vector<ParamGroupSpec> g);
  ~Impl();

  // Setup, in construction order (members below are declared so that teardown runs in
  // reverse: the pipeline thread first, then the staging, the store, the pool, the engine).
  OptimizerOptions options;
  std::vector<ParamGroupSpec> groups;
  std::uint32_t alignment = 4096;
  std::uint64_t max_record_bytes = 0;  // the largest padded record: one ring buffer (nvme)
  std::uint64_t state_bytes = 0;       // sum of padded records
  std::vector<std::vector<std::size_t>> group_records;
  std::vector<bool> initialized;

  std::unique_ptr<swap::IoEngine> engine;
  std::unique_ptr<swap::BufferPool> pool;
  std::vector<Record> records;
  std::unique_ptr<StateStore> store;           // state_store.h: where the records live
  std::vector<swap::BufferLease> out_staging;  // options.store_copy_out
  adam::CpuAdam adam;

  adam::AdamParams hyper;                     // last set for all groups (hyper())
  std::vector<adam::AdamParams> group_hyper;  // what each group's next step uses
  std::uint64_t steps_done = 0;
  std::optional<Status> failure;  // set once: the optimizer refuses work afterwards

  // Checkpoints (optimizer_checkpoint.cc): the directory of the last save or load, open and
  // locked (flock) so that no other optimizer or process uses it meanwhile, and the versions
  // in it that this optimizer wrote or loaded from, the only versions a save removes.
  swap::Dir checkpoint_dir;
  std::vector<std::string> checkpoint_chain;
  // The run this optimizer's checkpoints belong to: 128 random bits drawn at construction,
  // the loaded checkpoint's after a load (a resumed run goes on as the same run). Each
  // version records it (file kRunFile), so that a save over another run's checkpoint and a
  // load can say whose checkpoint it is.
  std::string run_id;
  // set_checkpoint_file's texts, by name: saved inside every later version.
  std::map<std::string, std::string> checkpoint_files;
  // zinf/optim/testing.h's set_checkpoint_hook; empty outside tests.
  std::function<void(std::string_view phase, std::uint64_t bytes)> checkpoint_hook;

  // The buffers of asynchronous saves, made at the first save_async and kept (host memory,
  // not pinned); declared before every holder of an AsyncSave, so that it outlives them.
  std::unique_ptr<swap::BufferPool> save_pool;
  // The asynchronous save in flight or finished but not yet waited for (save_async). Set and
  // reset by the controlling thread outside a step; each step takes its own reference at
  // begin_step (StepRun::snapshot), so the pipeline never reads this member.
  std::shared_ptr<AsyncSave> async_save;
  // When the last step ended and how long the trainer took between the two steps before it
  // (begin_step to end_step's return; controlling thread only): a save_async starts its
  // commit's syncs early between steps, not late (AsyncSave::wait_between_steps).
  OptClock::time_point last_step_end{};
  OptClock::duration last_between_steps{};
  // How the last save_async() took its snapshot; controlling thread only.
  SaveSnapshot last_snapshot = SaveSnapshot::kNone;
  std::string last_stream_reason;  // why the last streamed save_async could not clone

  std::mutex mu;
  std::condition_variable cv;
  StepRun run;  // guarded by mu
  // The save whose snapshot the open step must not overwrite: async_save at begin_step, null
  // after end_step (guarded by mu).
  std::shared_ptr<AsyncSave> step_snapshot;
  std::vector<Slot> slots;         // guarded by mu
  std::vector<OutSlot> out_slots;  // guarded by mu; one per out_staging buffer
  // Checksums folded into the update (a swap store with checksums): per slot, the unit
  // CRCs its record was written with (from swap_in_unchecked); the sums of the bytes the
  // update read and of those it wrote. Only the pipeline thread touches these.
  std::vector<std::vector<std::uint32_t>> slot_expected;
  swap::UnitSums sums_read;
  swap::UnitSums sums_written;
  // With folded sums, a copy-out into the caller's memory is made here first and handed on
  // only once the record's checksums held (grown to the largest record's copy-out on first
  // use; pipeline thread only).
  std::vector<std::byte> copy_out_hold;
  bool stop = false;      // guarded by mu
  std::jthread pipeline;  // last: joined first

  bool io_idle() const;  // no read, write-back or copy-out write in flight (mu held)
  void validate_store_out(std::size_t group, const StoreCopyOut& out) const;
  void check_usable() const;                // EngineFailed once failed
  void check_idle(const char* what) const;  // UsageError inside a step
  void fail(const Status& cause);

  RecordLayout layout(const Record& r) const noexcept { return {options.state_precision, r.numel}; }

  // Runs `count` items through the store's slots on the calling thread (no step open):
  // start(i, slot) submits item i's first I/O into `slot` (store->data(slot, record)) and
  // returns its ticket, or nullopt for none; once that has completed, finish(i, slot) may
  // submit a second I/O from the slot that completes before the slot is reused. Up to
  // store->depth() items are in flight. Every ticket is waited for before this returns or
  // throws (the first error).
  using SlotIo = std::function<std::optional<swap::IoTicket>(std::size_t, std::size_t)>;
  void ring_pipeline(std::size_t count, const SlotIo& start, const SlotIo& finish);

  // The step pipeline (optimizer_pipeline.cc); c is the next task to update, r the next to
  // read (r >= c). Every piece but pipeline_main runs with `lk` (on mu) held on entry and exit.
  void pipeline_main();
  bool pipeline_can_progress(std::size_t c, std::size_t r) const;
  void note_error(const Status& s);  // keeps the step's first error (mu held)
  // Completion callbacks of a slot's read (write = false) or write-back, and of a copy-out
  // write: they mark the slot idle, count `bytes` and note the interval from `at`.
  swap::IoCallback on_io_done(std::size_t slot, bool write, std::uint64_t bytes,
                              OptClock::time_point at);
  swap::IoCallback on_out_done(std::size_t out_slot, std::uint64_t bytes, OptClock::time_point at);
  // Starts the reads of tasks r.. into idle slots, up to depth ahead of c.
  void start_reads(std::unique_lock<std::mutex>& lk, std::size_t c, std::size_t& r);
  // Runs task c's `ready` hook if it has one (then true: look at the task again).
  bool run_ready_hook(std::unique_lock<std::mutex>& lk, std::size_t c);
  // Updates task c (read in, its copy-out slot free), submits its copy-out and write-back, ++c.
  void update_task(std::unique_lock<std::mutex>& lk, std::size_t& c);
  bool folded_sums() const noexcept {
    return store && store->swap_store() && store->swap_store()->checksums();
  }
  // Runs the update of task t on `base`. With folded_sums(), `slot` is the store slot it was
  // read into: the update sums what it reads and writes, and the record's bytes are checked
  // against slot_expected before this returns (IoError kCorrupt, nothing written anywhere: a
  // copy-out into the caller's memory waits in copy_out_hold until the check held).
  void compute(const adam::AdamParams& hp, const Task& t, std::byte* base, std::size_t slot);
  // UsageError unless `grads` and `out` fit the group and the group has state.
  void validate_group_grads(std::size_t group, const adam::GradView& grads,
                            const adam::CopyOut& out) const;
  // Queues a validated group's sub-group tasks in the open step (UsageError if none is open or
  // the group was given already), with either a caller-buffer copy-out or a store target.
  void queue_group(std::size_t group, const adam::GradView& grads, const adam::CopyOut& out,
                   const std::shared_ptr<const StoreCopyOut>& target, GradHooks hooks);
  // Runs the `consumed` hooks of tasks [from, to) that will never be updated (under mu).
  void drop_tasks(std::size_t from, std::size_t to);

  // Where a save or load goes: a path the caller named, or a directory the caller already
  // holds open (ShardedOptimizer's rank folder, opened without following a link), which is
  // then used through a descriptor of its own and never reopened by its path.
  struct CheckpointPlace {
    const std::string* path = nullptr;
    const swap::Dir* dir = nullptr;
    CheckpointPlace(const std::string& p) : path(&p) {}  // NOLINT: implicit by design
    CheckpointPlace(const swap::Dir& d) : dir(&d) {}     // NOLINT: implicit by design
  };
  // The checkpoint directory, opened (a path created first if `create`) and locked, or the one
  // already held if it is the same directory (a second open would conflict with our own lock).
  const swap::Dir& open_checkpoint_dir(const CheckpointPlace& where, bool create);
  void save(const CheckpointPlace& where,
            SupersededVersions superseded = SupersededVersions::kRemove);
  void load(const CheckpointPlace& where);
  // Removes from checkpoint_dir what interrupted saves left and, but for version `current`,
  // this optimizer's versions (checkpoint_chain) if `chain`, and those that record run_id if
  // `own_run`; logs what it reclaimed and what it could not remove. Afterwards
  // checkpoint_chain holds `current` and what could not be removed, plus, if not `chain`,
  // the chain as it was.
  void remove_versions_but(const std::string& current, bool chain, bool own_run);
  void remove_superseded_versions();
  // File `name` of the version LATEST names in `root` (set_checkpoint_file's text, its CRC32C
  // checked), nullopt where that version has none.
  std::optional<std::string> read_checkpoint_file(const swap::Dir& root, const std::string& name,
                                                  std::string* path) const;
  // run_id, drawn first if there is none yet.
  const std::string& current_run();
  // "step N of run <id> (<version>)" where a save into `root` replaces another run's
  // checkpoint as the one LATEST names, "" otherwise.
  std::string superseded_run(const swap::Dir& root) const;
  // The pieces of a save, shared by save() and save_async(). begin_version() opens (and
  // locks) `dir`, captures the step, hyper-parameters and layout, and creates the temporary
  // version with its state file. commit_version() syncs and closes the file, writes the
  // manifest, renames the version into place, switches LATEST and removes what the new version
  // supersedes; `between`, if set, is called before each of those syncs and the removal
  // (save_async: to start them between steps). abandon_version() removes a temporary version
  // after a failure (never throws).
  VersionWrite begin_version(const CheckpointPlace& dir);
  void commit_version(VersionWrite& v, const std::function<void()>& between = {});
  void abandon_version(VersionWrite& v) noexcept;
  void checkpoint_phase(std::string_view phase, std::uint64_t bytes) const {
    if (checkpoint_hook) checkpoint_hook(phase, bytes);
  }
  void save_async(const CheckpointPlace& dir);
  // Waits for the asynchronous save (if any) and forgets it; throws its error.
  void wait_save();
  bool save_running() const;
  // The step pipeline, right before record `record`'s update (bytes at `base`; `expected`,
  // with folded sums, the store's unit CRCs): returns once the snapshot no longer needs the
  // bytes in place.
  // Returns the seconds it waited and the bytes it copied.
  // A step opened (begin_step) or closed (end_step) while `save` is in flight.
  static void snapshot_step(AsyncSave& save, bool open);
  static void protect_snapshot(AsyncSave& save, std::size_t record, const std::byte* base,
                               const std::vector<std::uint32_t>* expected, double& waited,
                               std::uint64_t& copied);
};

// Planning (optimizer_plan.cc).

/// 2^40 elements (12 TiB of state) per group keeps every byte count far from overflow.
inline constexpr std::uint64_t kMaxNumel = std::uint64_t{1} << 40;

/// Every check of the options and groups that needs no file and no memory, in one place: the
/// constructor runs it first, and optimizer_pinned_bytes_needed runs it too, so that a caller
/// (OffloadEngine) learns of any refusal before it creates files of its own. Returns the
/// number of sub-group records. The state store's own checks are its plan's.
std::uint64_t check_options(const OptimizerOptions& options,
                            const std::vector<ParamGroupSpec>& groups);

/// What the pinned budget must hold, and how to say it in an error.
struct PinnedPlan {
  std::uint64_t need = 0;
  std::string what;
};
/// The pinned budget's need: the store's (its plan) and the copy-out staging.
PinnedPlan plan_pinned(const OptimizerOptions& options, const StateStorePlan& store,
                       const RecordSizes& sizes);

/// The copy-out staging buffers options.store_copy_out reserves, and the bytes of each.
std::uint32_t copy_out_buffer_count(const OptimizerOptions& options);
std::uint64_t copy_out_staging_bytes(std::uint64_t sub, std::uint64_t max_group_numel,
                                     std::uint32_t alignment);

/// Validates hyper-parameters as CpuAdam::step would, so that a bad value is a UsageError at
/// the call that sets it, never inside the pipeline. `group`, if not empty, names the group
/// whose set it is in the message.
void validate_hyper(const adam::AdamParams& hp, const std::string& group = {});

}  // namespace zinf::optim
