// SPDX-License-Identifier: Apache-2.0
// OffloadedOptimizer: ZeRO-Infinity's optimizer offload. The fp32 master parameters and both
// Adam moments (12 bytes per element) live in pinned host memory (tier kCpu) or on NVMe through
// a SwapStore (tier kNvme), cut into sub-groups that a pipelined step streams through CpuAdam;
// per-group stepping overlaps backward; checkpoints are streamed, checksummed and atomic.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "zinf/adam/cpu_adam.h"
#include "zinf/common/element_type.h"
#include "zinf/swap/dir.h"
#include "zinf/swap/io_engine.h"
#include "zinf/swap/swap_store.h"

namespace zinf::optim {
namespace test_hooks {
class OptimizerAccess;  // zinf/optim/testing.h: the checkpoint hook
}  // namespace test_hooks

/// Where the optimizer state lives between steps.
enum class StateTier : std::uint8_t {
  kCpu,   ///< pinned host memory (BufferPool), updated in place
  kNvme,  ///< a SwapStore over the given directories, streamed through a ring of buffers
};

/// Parses "cpu" | "nvme"; throws UsageError naming `what` otherwise.
StateTier parse_state_tier(std::string_view text, std::string_view what);
std::string_view state_tier_name(StateTier tier) noexcept;

/// One parameter group: a name (for messages and checkpoints), its element count (> 0) and,
/// optionally, hyper-parameters of its own.
struct ParamGroupSpec {
  std::string name;
  std::uint64_t numel = 0;
  /// This group's hyper-parameters from construction on, instead of OptimizerOptions::hyper
  /// (the usual case: weight_decay 0 for biases and norms); `step` is ignored. Checked like
  /// set_hyper's. Initial values only: set_hyper(hyper) for all groups replaces them too.
  std::optional<adam::AdamParams> hyper = std::nullopt;
};

/// How an OffloadedOptimizer is built.
struct OptimizerOptions {
  StateTier tier = StateTier::kCpu;
  /// Elements per sub-group (DeepSpeed's sub_group_size): the unit of one read, one update and
  /// one write-back. The last sub-group of a group may be shorter. 0 (the default) is
  /// default_sub_group_elements(state_precision): records of 12 MiB whatever the precision,
  /// 1M elements of fp32 state. 1M fp32 elements (12 MiB of state, a 48 MiB ring at depth 4):
  /// each transfer (12 x 1 MiB engine pieces) still keeps the queue full, and filling and
  /// draining the pipeline costs 2/256 of a 256M-element step.
  /// The ring's footprint itself sets the drive's rate on virtual disks (why 1M rather than
  /// 512K or 4M: docs/benchmarks.md, "Figures behind the defaults").
  ///
  /// Unless fit_sub_groups_to_stripes is off (or store_copy_out is on), the records use
  /// effective_sub_group_elements(): this, or, where it splits a group, slightly fewer
  /// elements so that a record larger than one 1 MiB stripe unit fills a whole number of them
  /// (int8 moments: 1,027,136 instead of 1,048,576 elements, records of exactly 6 MiB instead of
  /// 6.125).
  std::uint64_t sub_group_elements = 0;
  /// Round sub_group_elements down so that each record fills whole stripe units of the swap
  /// store (1 MiB). A record that ends part-way into a unit adds a short request to every read
  /// and write of it, which costs the drive about as much as a full one (the figure:
  /// docs/benchmarks.md, "Figures behind the defaults"). fp32 and bf16 records of 1M elements
  /// are whole units already. The size is part of a checkpoint's layout: false loads a compact
  /// checkpoint saved by a build from before this rounding (it used sub_group_elements as
  /// given).
  bool fit_sub_groups_to_stripes = true;
  /// Buffers in the kNvme ring, >= 3: one being updated, one being read ahead, one being
  /// written back; more buffers read further ahead. 4: a spare buffer keeps a read queued
  /// while a write-back holds its slot (docs/benchmarks.md, "Figures behind the defaults").
  std::uint32_t pipeline_depth = 4;
  /// The most pinned host memory the optimizer may hold. kNvme: depth x padded sub-group
  /// bytes. kCpu: the whole padded state. Checked at construction (UsageError naming the
  /// smallest budget that works).
  std::uint64_t pinned_budget_bytes = std::uint64_t{1} << 30;
  /// Hyper-parameters of every group that does not bring its own (ParamGroupSpec::hyper);
  /// `step` is ignored (the optimizer counts its steps).
  adam::AdamParams hyper;
  adam::CpuAdamOptions adam;
  /// kNvme: one swap file per directory (repeat a directory for more files on it).
  std::vector<std::string> directories;
  /// The I/O engine for the state (kNvme) and for checkpoints (both tiers).
  swap::IoOptions io;
  /// kNvme: CRC32C per stripe unit of the swap files (SwapStoreOptions::checksums), verified
  /// on every read of the state: step reads, read_state, and save() (which copies the state
  /// from the store). On by default: a corrupt record fails the step (or read, or save) with
  /// IoError kCorrupt naming the file, offset, length and both CRCs before any of its bytes
  /// reach CpuAdam or a checkpoint; the failure then follows the read-failure rules (see
  /// Failures). The stripe is one padded record (at most 1 MiB), so each record is verified
  /// as a whole. Cost: one CRC32C pass over each record read and written (`zinf bench step
  /// --checksums on|off` measures it; docs/benchmarks.md, "Integrity cost"). false opts out: a
  /// changed byte is then trained on, and saved under a fresh checkpoint CRC.
  bool swap_checksums = true;
  /// kNvme: open the swap files with O_DIRECT where the file system allows it.
  bool direct_io = true;
  /// kNvme: write every block of the swap files once at construction, so that write-backs
  /// overwrite blocks rather than fill unwritten extents (faster on most drives).
  bool precondition = false;
  /// How Adam's moments are stored (zinf.state_precision): kF32 (12 bytes per element with
  /// the fp32 master parameter), kBF16 (8) or kInt8 (6 + 8/64: codes with an fp32 scale per
  /// 64 elements), see zinf/adam/compact_state.h. The master parameters stay fp32 in every
  /// mode; read_state and set_state convert the moments from and to fp32 (read_state gives
  /// what the next step will use). A checkpoint records its precision, and load() refuses one
  /// of another precision (UsageError naming both).
  adam::StatePrecision state_precision = adam::StatePrecision::kF32;
  /// Reserve the pinned staging that step_group(..., StoreCopyOut) writes through:
  /// max(pipeline_depth, 2) buffers of 2 x sub_group_elements bytes (padded to the
  /// alignment), counted in pinned_budget_bytes. Without it a StoreCopyOut is a UsageError.
  bool store_copy_out = false;
  /// save_async() with kNvme: snapshot the records by cloning them from the swap files where
  /// the file system allows it (see save_async). false always streams them, as where it does
  /// not (e.g. to keep the checkpoint's blocks unshared with the swap files, or to measure the
  /// streaming path on XFS).
  bool checkpoint_reflink = true;
};

/// How a save_async() took its snapshot of the state (OffloadedOptimizer::last_save_snapshot).
enum class SaveSnapshot : std::uint8_t {
  kNone,      ///< no save_async() yet
  kReflink,   ///< kNvme: the records were cloned from the swap files (FICLONERANGE) at the call
  kStreamed,  ///< the records are streamed, steps copying each before they overwrite it
};
/// "none", "reflink" or "streamed" (the Python bindings' spelling).
std::string_view save_snapshot_name(SaveSnapshot snapshot) noexcept;

/// What a save does with the versions it supersedes once LATEST names the new one
/// (OffloadedOptimizer::save).
enum class SupersededVersions : std::uint8_t {
  kRemove,  ///< removes them at once (a plain save)
  kKeep,    ///< keeps them until remove_superseded_versions() (a two-phase commit's first phase)
};

/// What one step did, measured between begin_step() and the end of end_step().
struct StepStats {
  std::uint64_t step = 0;        ///< the step number (from 1)
  std::uint64_t sub_groups = 0;  ///< sub-groups updated
  std::uint64_t elements = 0;    ///< elements updated
  double seconds = 0;            ///< wall time of the step
  double read_seconds = 0;       ///< time with at least one state read in flight
  double write_seconds = 0;      ///< time with at least one write-back in flight
  double compute_seconds = 0;    ///< time inside CpuAdam
  /// Time the pipeline waited for a read, a free buffer or a group's gradients (GradHooks).
  double wait_seconds = 0;
  std::uint64_t bytes_read = 0;      ///< state bytes read (padded records)
  std::uint64_t bytes_written = 0;   ///< state bytes written back (padded records)
  std::uint64_t copy_out_bytes = 0;  ///< low-precision bytes written to a StoreCopyOut key
  /// save_async(): record bytes this step copied for a save in flight before updating them,
  /// and the time it waited for that save (a record being written, or a free copy buffer).
  std::uint64_t snapshot_copy_bytes = 0;
  double snapshot_wait_seconds = 0;
  // OffloadEngine's staged step mode (zinf.step_mode); the optimizer leaves these as they are.
  /// The step was skipped: a staged gradient was inf or NaN. Nothing was updated (step is 0).
  bool skipped = false;
  /// The global L2 norm of the step's unscaled gradients (staged norm / loss_scale); inf or
  /// NaN on overflow. 0 outside the staged mode.
  double global_grad_norm = 0;
  /// What grad_scale was multiplied by for this step: min(1, clip / (norm + 1e-6)) /
  /// loss_scale; 0 for a skipped step, 1 outside the staged mode.
  double grad_scale_applied = 1;
  /// The loss scale the step's gradients were scaled by (1 without fp16 loss scaling).
  double loss_scale = 1;
  // zinf::dist's sharded engine and optimizer (0 elsewhere, and on one rank).
  /// The data-parallel collectives of gradients and parameters since the previous step (the
  /// sharded engine's fetches, set_gradients and step; the sharded optimizer's step): the bytes
  /// a ring algorithm moves into this rank, (N - 1) / N of each padded buffer, twice that for
  /// an all-reduce (a reduce-scatter then an all-gather), as `zinf plan` counts them. The few
  /// bytes of agreement (failure flags, the staged norm) are not counted.
  std::uint64_t allgather_bytes = 0;
  std::uint64_t reduce_scatter_bytes = 0;
  std::uint64_t all_reduce_bytes = 0;
};

/// A copy-out that goes straight into a parameter SwapStore key rather than a caller buffer:
/// each sub-group's updated parameters, rounded to nearest even, are written from a small
/// pinned staging buffer with swap_out_range at byte offset 2 x (the sub-group's first
/// element). The key holds the group's numel elements of `dtype` (size_of == 2 x numel).
/// The store's alignment rules for ranges apply: unless the group is one sub-group, 2 x
/// sub_group_elements must be a multiple of the store's alignment (and of its stripe_bytes
/// when it keeps checksums); store_copy_out_sub_group() gives the sub-group size that works.
/// No swap of the key may be in flight while the step writes it (SwapStore refuses overlaps).
struct StoreCopyOut {
  swap::SwapStore* store = nullptr;
  std::string key;
  ElementType dtype = ElementType::kBF16;  ///< kBF16 or kF16
};

/// The smallest sub-group size >= `requested` whose 2-byte copy-out ranges satisfy `store`'s
/// swap_out_range rules (a multiple of alignment()/2 elements, or of stripe_bytes()/2 with
/// checksums).
std::uint64_t store_copy_out_sub_group(std::uint64_t requested, const swap::SwapStore& store);

/// The sub-group of OptimizerOptions::sub_group_elements = 0: the elements whose record is
/// fp32's at 1M elements, 12 MiB (whole 1 MiB stripe units), so that the ring and every
/// transfer keep their bytes whatever the precision: fp32 1,048,576, bf16 1,572,864, int8
/// 2,054,336 (why 12 MiB: docs/benchmarks.md, "Figures behind the defaults"). A checkpoint
/// names its sub-group size: one saved with another (an earlier build's 1M default for bf16 or
/// int8, where a group was larger) loads with that size given explicitly.
std::uint64_t default_sub_group_elements(adam::StatePrecision precision) noexcept;

/// The elements per sub-group record the optimizer uses for `options` and `groups` (on both
/// tiers, so that checkpoints move between them): sub_group_elements, or, with
/// fit_sub_groups_to_stripes and without store_copy_out, where it splits at least one group
/// (a group has more elements), the largest count not above it, a multiple of
/// adam::kInt8Block for int8 moments, whose record (padded to 4 KiB) fills a whole number of
/// 1 MiB stripe units, if a record of sub_group_elements would be larger than one unit and end
/// part-way into one. Groups no larger than the sub-group keep one record each, as given (so
/// the engine's default sub_group_size, above any layer, changes nothing). OffloadedOptimizer::
/// sub_group_elements() returns it.
std::uint64_t effective_sub_group_elements(const OptimizerOptions& options,
                                           const std::vector<ParamGroupSpec>& groups);

/// The pinned bytes an OffloadedOptimizer built from `options` and `groups` holds (what its
/// constructor checks pinned_budget_bytes against): kNvme depth x padded sub-group record,
/// kCpu the whole padded state, plus the StoreCopyOut staging if options.store_copy_out.
/// kNvme probes the directories' direct-I/O alignment (creates no lasting file). Throws
/// UsageError for options the constructor would refuse.
std::uint64_t optimizer_pinned_bytes_needed(const OptimizerOptions& options,
                                            const std::vector<ParamGroupSpec>& groups);

/// When a group's gradients may be read, and when they are no longer needed: for gradients
/// that are still arriving when the group is queued (e.g. a device-to-host copy in flight).
/// Both run on the optimizer's pipeline thread. `ready` runs once, before the first of the
/// group's sub-groups is updated (the reads of its state already in flight); if it throws, the
/// step fails as if that update had failed before touching the state (a failed read: the step
/// is undone unless a write-back of it began). `consumed` runs exactly once per queued group
/// whatever happens: after its last sub-group's update, or when a failure drops the group's
/// remaining work (then possibly inside end_step(), with internal locks held); it must not
/// call into the optimizer. Either may be empty.
struct GradHooks {
  std::function<void()> ready;
  std::function<void()> consumed;
};

/// The gradients (and optional low-precision copy-out) of one group for one step.
struct GroupGrads {
  std::size_t group = 0;
  adam::GradView grads;    ///< group numel elements, host memory
  adam::CopyOut out = {};  ///< group numel elements, or none
};

/// The gradient-clipping coefficient PyTorch's clip_grad_norm_ and DeepSpeed apply: min(1,
/// clip / (norm + 1e-6)) for clip > 0, 1 otherwise. The 1e-6 keeps a zero norm finite; one
/// function so that the engine and the sharded optimizer give a trainer moving over the same
/// factor.
double clip_coefficient(double clip, double norm) noexcept;

/// The optimizer state of several parameter groups in a tier, with a pipelined step.
///
/// Layout. Each group is cut into sub-groups of `sub_group_elements`; each sub-group is one
/// record [params | m | v] of 12 x n bytes (fp32 state; fewer with a compact
/// state_precision), padded to the store's alignment: one SwapStore key
/// (kNvme, one read and one write per step) or one BufferPool lease (kCpu).
///
/// Stepping. step() updates every group once. For overlap with backward, begin_step() opens a
/// step, step_group() hands over one group's gradients as soon as they exist and returns at
/// once (the update runs on the optimizer's pipeline thread), and end_step() waits for all of
/// it. Gradient and copy-out memory must stay valid, and the gradients unchanged, until
/// end_step() returns (or throws). Each group at most once per step; groups not given are not
/// updated. The step counter and hyper-parameters belong to the step: begin_step() fixes them
/// (each group's own), so a set_hyper between steps takes effect at the next begin_step().
///
/// Hyper-parameters. Each group has its own set (weight_decay 0 for biases and norms is the
/// usual reason): OptimizerOptions::hyper, or the group's ParamGroupSpec::hyper, until
/// set_hyper() replaces them for all groups or set_hyper(group, ...) for one. A schedule that
/// must keep per-group differences (a learning rate over groups with and without decay)
/// changes each group with set_hyper(group, ...), starting from hyper(group).
///
/// Failures. A failed write-back (or any failure after a write-back of the step began) makes
/// end_step()/step() throw IoError naming the file, offset and length once; the optimizer is
/// then failed and every later call throws EngineFailed quoting that error. A failed read
/// before any write-back of the step leaves the state as it was before the step: the step
/// throws IoError, its counter is not advanced, and the optimizer stays usable. A record
/// whose checksum does not match (swap_checksums) is a failed read, IoError kCorrupt: it is
/// never updated nor written back, and as long as the file holds the bad bytes every step,
/// read_state and save() that reads it fails the same way (save() then writes nothing, so the
/// previous checkpoint stays the current one). Copy-out buffers are unspecified after a
/// failed step.
///
/// Thread-safety: one controlling thread at a time (not thread-safe); the pipeline thread is
/// internal.
class OffloadedOptimizer {
 public:
  /// Validates the options, reserves the pinned memory and (kNvme) creates the swap store.
  /// Throws UsageError for bad options (no groups, numel 0, sub_group_elements 0, depth < 3,
  /// kNvme without directories, bad hyper-parameters) or a pinned budget that cannot hold the
  /// pipeline (the message names the smallest budget that works); IoError kNoSpace naming the
  /// directory when a disk is too small for the state; IoError for other setup failures.
  OffloadedOptimizer(OptimizerOptions options, std::vector<ParamGroupSpec> groups);
  ~OffloadedOptimizer();
  OffloadedOptimizer(const OffloadedOptimizer&) = delete;
  OffloadedOptimizer& operator=(const OffloadedOptimizer&) = delete;

  std::size_t group_count() const noexcept;
  /// Elements per sub-group record: effective_sub_group_elements() of the options.
  std::uint64_t sub_group_elements() const noexcept;
  const ParamGroupSpec& group(std::size_t index) const;
  StateTier tier() const noexcept;
  /// How the moments are stored (OptimizerOptions::state_precision).
  adam::StatePrecision state_precision() const noexcept;
  /// Steps completed so far (the next step is step_count() + 1).
  std::uint64_t step_count() const noexcept;
  /// The hyper-parameters last set for all groups: options.hyper, then set_hyper(hyper)'s, or
  /// a loaded checkpoint's. What groups without a set of their own step with; a group with
  /// one (ParamGroupSpec::hyper, set_hyper(group, ...)) may differ: see hyper(group).
  const adam::AdamParams& hyper() const noexcept;
  /// The hyper-parameters group `group`'s next step uses. UsageError for an unknown group.
  const adam::AdamParams& hyper(std::size_t group) const;
  /// Replaces every group's hyper-parameters, per-group sets included, from the next step on
  /// (e.g. a learning-rate schedule where all groups share one set); `step` is ignored.
  /// UsageError inside a step or for values check_adam_params() refuses; a refused call
  /// changes nothing.
  void set_hyper(const adam::AdamParams& hyper);
  /// Replaces group `group`'s hyper-parameters from the next step on; the other groups and
  /// hyper() keep theirs. Same errors as set_hyper(hyper), plus UsageError for an unknown
  /// group; a refused call changes nothing.
  void set_hyper(std::size_t group, const adam::AdamParams& hyper);

  /// Sets a group's fp32 master parameters (numel elements) and zeroes its moments. Every
  /// group needs this once before its first step. Blocks; IoError on a failed write.
  void set_params(std::size_t group, std::span<const float> params);
  /// Sets a group's whole state: the fp32 master parameters and both moments, each numel
  /// elements (e.g. restoring a torch optimizer's state_dict). Blocks; IoError on a failed
  /// write; UsageError inside a step or for a span of another size.
  void set_state(std::size_t group, std::span<const float> params, std::span<const float> m,
                 std::span<const float> v);
  /// Sets the number of steps taken, so that the next step is `steps` + 1 (its bias
  /// correction included), e.g. with set_state when restoring a state_dict. UsageError inside
  /// a step.
  void set_step_count(std::uint64_t steps);
  /// Copies a group's state out (each span numel elements, or empty to skip). Blocks.
  void read_state(std::size_t group, std::span<float> params, std::span<float> m,
                  std::span<float> v);

  /// Runs one step over the groups given (each at most once): begin_step, step_group for
  /// each, end_step. Blocks; returns the step's stats.
  StepStats step(std::span<const GroupGrads> grads);

  /// Opens a step (counter + 1, hyper-parameters fixed). UsageError if one is open.
  void begin_step();
  /// As begin_step(), with every group's grad_scale multiplied by `grad_scale` for this step
  /// (the step's clipping coefficient over its loss scale, say): hyper() and hyper(group) are
  /// unchanged, so the next step uses their grad_scale again. UsageError, before anything
  /// opens, if a product is one check_adam_params() refuses (not finite, or not > 0 once
  /// rounded to fp32).
  void begin_step(double grad_scale);
  /// Queues one group's update in the open step and returns at once. UsageError for an
  /// unknown group, a group already given in this step, a size mismatch, or no open step.
  /// `hooks` (see GradHooks) say when the gradients may be read and when they are free; if
  /// step_group throws, neither runs.
  void step_group(std::size_t group, adam::GradView grads, adam::CopyOut out = {},
                  GradHooks hooks = {});
  /// As above, with the updated low-precision parameters written into a SwapStore key (see
  /// StoreCopyOut). Also UsageError (before anything is queued) without
  /// options.store_copy_out, for an unknown key, a key whose size is not 2 x numel, a dtype
  /// other than bf16/fp16, or a sub-group size that breaks the store's range rules (the
  /// message names a sub_group_elements that works). A failed write of the copy-out follows
  /// the write-back rules: end_step() throws the store's IoError (key, file, offset, length)
  /// and the optimizer is failed.
  void step_group(std::size_t group, adam::GradView grads, const StoreCopyOut& out,
                  GradHooks hooks = {});
  /// Waits for the open step's work, closes it and returns its stats. Throws as described
  /// under Failures.
  StepStats end_step();

  /// Writes a checkpoint of the state, step counter and hyper-parameters (hyper() and each
  /// group's) under `dir` (created if missing): a new version directory is written, synced and
  /// renamed into place, then the `LATEST` pointer is replaced atomically, so a crash at any
  /// point leaves the previous checkpoint loadable. Streams through bounded buffers. UsageError inside a step or for an
  /// empty `dir`; IoError on failure (the optimizer state itself is untouched by a failed
  /// save).
  ///
  /// One owner per directory: the first save or load into `dir` locks it (flock) until this
  /// optimizer is destroyed or saves/loads into another directory; a save or load of another
  /// optimizer, in this process or another, fails at once with an IoError naming the
  /// directory and the holder's pid. Nothing in `dir` is trusted: every file is created
  /// exclusively under a name nobody can predict (version directories are "v<step, 12
  /// digits>-<pid>-<64 random bits>") or replaces its name atomically (LATEST), and no link
  /// at any name is followed. After the switch of LATEST a save removes only (a) the versions
  /// this optimizer wrote or loaded in `dir` before, and (b) what interrupted saves left
  /// ("v...*.tmp" directories, ".zinf-tmp-*" files: safe under the lock, as nobody else is
  /// writing), with a notice naming what it reclaimed. Every other entry stays, versions of
  /// other runs included (e.g. another optimizer's last checkpoint, even if LATEST now names
  /// ours); a failed removal is only logged.
  void save(const std::string& dir);
  /// save() into a directory the caller holds open (e.g. opened without following a link): it
  /// is used through a descriptor of its own (Dir::reopen), never reopened by its path, so a
  /// link swapped in at its path meanwhile redirects nothing. Same contract otherwise.
  void save(const swap::Dir& dir);
  /// save(dir) for a caller that commits a checkpoint of several optimizers in two phases
  /// (ShardedOptimizer, ShardedEngine: every rank's folder, then the job's commit record):
  /// with kKeep, the versions the new one supersedes stay in `dir` after LATEST switched
  /// (what interrupted saves left still goes), so that the caller can point LATEST back at
  /// the previous one while its commit record still names that one; they stay this
  /// optimizer's and go at remove_superseded_versions() or the next save with kRemove.
  void save(const swap::Dir& dir, SupersededVersions superseded);
  /// The second phase's end: removes from the checkpoint directory this optimizer holds every
  /// version but the one LATEST names that this optimizer wrote or loaded there or that
  /// records its run (a version a killed job of this run renamed into place but never
  /// committed), and what interrupted saves left, with the same notices as a save's cleanup.
  /// Versions of other runs stay. Failures only cost space and are logged; nothing to do
  /// before the first save or load.
  void remove_superseded_versions();
  /// Starts a checkpoint of the state as it is now (the same files and format as save()) and
  /// returns once the new version's directory and state file exist; a thread of the save's own
  /// then writes the records and commits the version exactly as save() does (manifest, fsync,
  /// rename, LATEST), while steps go on. The checkpoint holds the state at this call, bitwise:
  /// before a step updates a record the save has not written yet, the step copies the
  /// record's bytes into one of the save's eight buffers (a bounded copy: one record,
  /// record_bytes(); the step waits only while all eight hold copies not yet written) and the
  /// save writes that copy; a record the save is reading or writing at that moment (two at
  /// most) is waited for. StepStats::snapshot_copy_bytes and snapshot_wait_seconds say what
  /// that cost. The save holds 10 x record_bytes() of host memory (not pinned, outside
  /// pinned_budget_bytes) and, kNvme, reads the records not yet updated from the swap store
  /// (checked against its checksums), between steps only, one while it writes another. Its
  /// commit's syncs start between steps too, preferably right after a step closes. A kill at
  /// any point leaves the previous checkpoint loadable (the version is renamed into place
  /// only when complete and synced).
  ///
  /// Reflink. With kNvme, where the checkpoint directory is on the file system of every swap
  /// file and that file system clones ranges (FICLONERANGE: XFS, btrfs), this call clones every
  /// record's blocks from the swap files into the new state file before it returns (time in
  /// the number of extents, not in bytes; the drive copies nothing): that clone is the
  /// snapshot. Steps then make no copies (snapshot_copy_bytes stays 0, nothing waits); the
  /// save's thread only reads the state file back, checks each record against the swap
  /// store's unit checksums taken at this call and computes the manifest's CRCs. Where a
  /// clone fails (another file system, ext4, tmpfs, kCpu, blocks not aligned to the file
  /// system's) the save streams as above, after one log line saying why. Either way the
  /// files and format are save()'s. last_save_snapshot() says which path was taken. The
  /// clone shares blocks with the swap files: the next step's write-backs go to fresh blocks
  /// (copy-on-write), taking then the space the state file's preallocation gave back, so a
  /// file system filled by something else meanwhile fails that step (ENOSPC) rather than
  /// the save; checkpoint_reflink = false avoids it.
  ///
  /// Contract: UsageError inside a step or for an empty `dir` (nothing starts). A save still
  /// in flight is waited for first, and if it failed its error is thrown here and no new save
  /// starts. save(), load(), set_params() and set_state() also wait for a save in flight
  /// first (and throw its error the same way). The save's failure (IoError naming the file,
  /// offset and length; kCorrupt for a record whose swap checksum does not match) removes
  /// the half-written version and is reported by wait_save() (or by the next call that waits,
  /// as above); the destructor finishes a save in flight and logs its failure. One
  /// controlling thread, as for every other call.
  void save_async(const std::string& dir);
  /// Waits until the save_async() in flight (if any) is complete and committed, and throws
  /// its error once (IoError, the optimizer state untouched); returns at once if none.
  /// Allowed inside a step and in the failed state.
  void wait_save();
  /// True while a save_async() is still writing or committing.
  bool save_in_flight() const;
  /// How the last save_async() took its snapshot (kNone before the first).
  SaveSnapshot last_save_snapshot() const noexcept;
  /// Restores what save() wrote: the version `LATEST` names, hyper-parameters included (the
  /// checkpoint's replace this optimizer's, per-group sets from construction too). A
  /// checkpoint written before per-group hyper-parameters (manifest format 1) has one set,
  /// which every group gets. Takes the directory's lock as save() does (same errors), and the
  /// version loaded joins this optimizer's versions (the next save removes it). LATEST, the
  /// version directory, its manifest and state.bin are opened without following a link, and
  /// anything but a directory or regular file there (a FIFO included, without blocking) is an
  /// IoError naming it. Throws IoError kNotFound naming the missing directory or file;
  /// UsageError for an empty `dir`, if the checkpoint's groups or sub-group size differ from
  /// this optimizer's or if its hyper-parameters are out of range (all before any state
  /// changes); IoError (kCorrupt naming file and offset) on a checksum mismatch, IoError on a
  /// read failure. A load that fails after it began to overwrite the state leaves the
  /// optimizer failed (EngineFailed afterwards).
  void load(const std::string& dir);
  /// load() from a directory the caller holds open, used as save(const swap::Dir&) uses it.
  void load(const swap::Dir& dir);
  /// The checkpoint directory `dir` as save() and load() hold it: opened (created first, as
  /// save() does, if `create`), locked for this optimizer (same errors as save), and kept
  /// until this optimizer is destroyed or moves to another directory. For OffloadEngine, which
  /// keeps its layer table next to the checkpoint under the same lock.
  const swap::Dir& checkpoint_directory(const std::string& dir, bool create);
  /// As above for a directory the caller holds open (reopened through its descriptor).
  const swap::Dir& checkpoint_directory(const swap::Dir& dir);

  /// Small text files saved inside every later checkpoint's version directory, beside its
  /// state (OffloadEngine keeps its dynamic loss scale there): each written with a CRC32C line
  /// and synced before the version is renamed into place, so it is committed with the state
  /// and never pairs with the state of another save. save_async() takes the texts as they are
  /// at its call. `name`: a plain file name, not "state.bin", "manifest" or "run" (the
  /// checkpoint's own); `text` at most 60 KiB; nullopt stops saving it. UsageError otherwise.
  void set_checkpoint_file(const std::string& name, std::optional<std::string> text);
  /// The text of file `name` (set_checkpoint_file) in the version LATEST names in `dir`, a
  /// directory checkpoint_directory() returned: what load() would restore beside the state
  /// now. nullopt where that version has none (saved without it, or before zinf kept such
  /// files in the version). IoError as load() for LATEST and the version directory, kCorrupt
  /// naming the file if its CRC32C does not match. `path`, if given, is set to the file's path
  /// (found or not), for messages. "run" reads the version's record of the run that saved it.
  std::optional<std::string> read_checkpoint_file(const swap::Dir& dir, const std::string& name,
                                                  std::string* path = nullptr) const;

  /// The run this optimizer's checkpoints record (`<version>/run`): 32 hex digits, drawn at
  /// the first call or save, replaced by a load with the run of the checkpoint it loads.
  std::string checkpoint_run();
  /// Goes on as run `run` (32 lowercase hex digits, as checkpoint_run() returns), as a load
  /// does: for the sharded classes, whose ranks record rank 0's run and adopt the saved run
  /// when a resharding load moves the state in without load(). UsageError otherwise.
  void set_checkpoint_run(const std::string& run);

  /// Pinned bytes the optimizer holds (ring or state) and the most ever held.
  std::uint64_t pinned_bytes() const noexcept;
  std::uint64_t pinned_bytes_peak() const noexcept;
  /// Bytes of one sub-group buffer (12 x sub_group_elements with fp32 state, padded).
  std::uint64_t record_bytes() const noexcept;
  /// The I/O engine's name ("uring", "threads", ...).
  std::string_view engine_name() const noexcept;
  /// The I/O engine's settings (OptimizerOptions::io as the engine took them).
  const swap::IoOptions& io_options() const noexcept;
  /// The swap files (kNvme; empty for kCpu), in stripe order.
  std::vector<std::string> swap_file_paths() const;
  /// True once a failure has put the optimizer in the failed state.
  bool failed() const noexcept;

 private:
  friend class test_hooks::OptimizerAccess;
  void write_state(const char* what, std::size_t group, std::span<const float> params,
                   std::span<const float> m, std::span<const float> v);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zinf::optim
