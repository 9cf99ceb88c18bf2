// SPDX-License-Identifier: Apache-2.0
// OffloadEngine: what a trainer links. One object owns the parameter offload (layers' low-
// precision parameters on the device, in pinned host memory or on NVMe, prefetched layer by
// layer) and the optimizer offload (fp32 master weights and Adam moments in host memory or on
// NVMe, updated per layer as gradients arrive), configured from a DeepSpeed-style config.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "zinf/adam/cpu_adam.h"
#include "zinf/common/element_type.h"
#include "zinf/cuda/device.h"
#include "zinf/offload/config.h"
#include "zinf/offload/engine_types.h"

namespace zinf::offload {
namespace test_hooks {
struct EngineFaults;
class EngineAccess;  // zinf/offload/testing.h: an engine with fault plans installed
}  // namespace test_hooks
class EngineSeamsAccess;  // zinf/offload/engine_seams.h: what a layer above plugs in

/// Counters since construction (bytes, seconds) and the last step's figures.
struct EngineStats {
  std::uint64_t steps = 0;                    ///< steps completed (skipped ones not counted)
  std::uint64_t skipped_steps = 0;            ///< staged mode: steps skipped on overflow
  std::uint64_t param_bytes_read = 0;         ///< parameter bytes read from NVMe (padded)
  std::uint64_t param_bytes_written = 0;      ///< updated parameter bytes written to NVMe
  std::uint64_t param_bytes_to_device = 0;    ///< parameter bytes copied host -> device
  std::uint64_t optimizer_bytes_read = 0;     ///< optimizer state bytes read (NVMe tier)
  std::uint64_t optimizer_bytes_written = 0;  ///< optimizer state bytes written (NVMe tier)
  /// Optimizer state bytes read / the optimizer's time with a read in flight (10^9 B/s).
  /// Parameter reads have their own figure, param_read_gbps.
  double nvme_read_gbps = 0;
  double nvme_write_gbps = 0;  ///< optimizer state bytes written / time with a write in flight
  /// Parameter bytes read from NVMe / the prefetcher's time with a read in flight (nvme
  /// parameter tier; 0 otherwise).
  double param_read_gbps = 0;
  double stall_seconds = 0;         ///< compute stream waiting for parameters (prefetch stalls)
  double step_seconds = 0;          ///< total wall time inside step()
  /// Fetches whose layer was already being read or copied (cpu and nvme parameter tiers).
  std::uint64_t prefetch_hits = 0;
  std::uint64_t prefetch_on_demand = 0;  ///< fetches that had to start the read/copy themselves
  std::uint64_t grad_bytes_to_host = 0;  ///< device gradients copied to the pinned staging
  /// set_gradients (device) waiting for a free staging buffer.
  double grad_staging_wait_seconds = 0;
  std::uint64_t staged_grad_bytes_written = 0;  ///< staged mode on NVMe: gradient bytes staged
  std::uint64_t staged_grad_bytes_read = 0;     ///< ... and read back at step()
  std::uint64_t pinned_bytes = 0;        ///< pinned host memory held now (staging included)
  std::uint64_t pinned_bytes_peak = 0;   ///< the most ever held; never above the budget
  StepStats last_step;                   ///< the optimizer's figures for the last step
};

/// The offload engine for one rank.
///
/// Use, per iteration:
///   forward:  for each layer l in order: p = fetch(l); enqueue compute on the compute stream
///             reading p; release(l)
///   backward: for each layer l in reverse: p = fetch(l); compute; release(l);
///             set_gradients(l, grads of l in host memory)   (its update starts at once)
///             or set_gradients(l, grads of l in device memory, dtype)  (copied to pinned
///             staging on the engine's copy stream after the compute enqueued so far; the
///             update starts when the copy lands, so the copies overlap the rest of backward)
///   step();   (waits for the updates; the next fetch of a layer sees its new parameters)
/// Before the first iteration every layer's fp32 master weights are set once with
/// set_master_weights (or load() restores them).
///
/// Step modes (config.zinf.step_mode; step_mode() says which is in effect):
/// - on_arrival (the default unless clipping or fp16 loss scaling is set): each layer's
///   update starts in set_gradients, overlapping backward; the caller's gradients must stay
///   valid until step() returns.
/// - staged (auto picks it for gradient_clipping > 0 or fp16.enabled): set_gradients copies the
///   gradients into engine-owned staging (pinned host memory if zinf.pinned_budget_bytes can
///   hold the whole model's gradients as fp32, else a swap store in the optimizer's — or the
///   parameters', or zinf.nvme_paths' — NVMe directory with a ring of two pinned buffers of
///   the largest layer) while summing their squares and noting any inf or NaN; the caller's
///   buffer is free as soon as set_gradients returns. step() then computes the global norm of
///   the unscaled gradients, norm = sqrt(sum of squares) / loss_scale(), and either skips the
///   step (any inf or NaN: weights, moments, step count and parameter copies untouched,
///   StepStats::skipped) or runs it with grad_scale x min(1, clip / (norm + 1e-6)) /
///   loss_scale() (clip = gradient_clipping; without clipping the coefficient is 1). Then it
///   updates a dynamic loss scale (fp16.loss_scale 0; see LossScaleConfig). The trainer
///   multiplies its loss by loss_scale() before backward, read after each step.
///
/// Tiers (config.offload_param.device / offload_optimizer.device):
/// - parameters kNone: each layer's device copy is resident; fetch returns it at once and
///   step() refreshes updated layers on the compute stream. kCpu: the low-precision copy lives
///   in pinned host memory and a LayerPrefetcher copies layers to the device ahead of the
///   compute (traced order), straight from those copies. kNvme: it lives in a swap store and a
///   LayerPrefetcher reads layers ahead of the compute through pinned staging. Both prefetch
///   within config.offload_param.buffer_count device buffers, zinf.prefetch_depth layers ahead.
/// - optimizer kNone / kCpu: state in pinned host memory (OffloadedOptimizer's cpu tier; kNone
///   is the same tier, counted in the pinned budget); kNvme: an OffloadedOptimizer over the
///   NVMe paths. In every combination the update is the same
///   CpuAdam arithmetic, so the fp32 master weights after K steps are bitwise identical for
///   every tier combination (a test).
///
/// Errors. The constructor checks the config against the layers before any file is created
/// (UsageError: a layer larger than offload_param.buffer_size, a pinned budget that cannot hold
/// the optimizer ring plus the parameter staging — naming the smallest budget that works —,
/// NVMe offload without a path, staged gradients that fit neither the budget nor an NVMe
/// directory — naming what is missing) and creates the swap files (IoError kNoSpace naming the
/// directory when a drive is too small). I/O failures surface as IoError naming key, file,
/// offset and length: a failed parameter read at that layer's fetch (retried by the next
/// fetch); a failed write-back of optimizer state or parameters at step(), after which the
/// engine is failed and every call throws EngineFailed quoting the first error. With
/// config.zinf.checksums (the default) bytes read back from a swap file that do not match
/// their CRC32C are such a failed read, IoError kCorrupt (file, offset, length, both CRCs):
/// at fetch for a layer; at step() for optimizer state (failed as a read: the step did not
/// happen if nothing was written yet, else the engine is failed); at save(), which then
/// writes no checkpoint. Corrupt bytes are never handed out, trained on or saved. Staged
/// mode on NVMe: a failed staging write surfaces at step() as IoError before anything is
/// updated (the step did not happen, the engine stays usable); a failed read-back of staged
/// gradients at step() fails the engine (part of the step may have run).
///
/// Threads: one controlling thread (not thread-safe). Internal threads: the I/O engine, the
/// optimizer pipeline, the device's stream workers.
///
/// Lifetime: the device and compute stream must outlive the engine. The destructor waits for
/// work in flight, removes the swap files and never throws.
class OffloadEngine {
 public:
  /// Validates `config` against `layers` (see Errors), creates the I/O engine, swap stores,
  /// optimizer and prefetcher, and allocates the pinned buffers. Logs config.notices.
  OffloadEngine(EngineConfig config, std::vector<LayerSpec> layers, cuda::Device& device,
                cuda::StreamRef compute_stream);
  ~OffloadEngine();
  OffloadEngine(const OffloadEngine&) = delete;
  OffloadEngine& operator=(const OffloadEngine&) = delete;

  std::size_t layer_count() const noexcept;
  const LayerSpec& layer(std::size_t index) const;
  const EngineConfig& config() const noexcept;

  /// Sets layer `layer`'s fp32 master weights (numel elements), zeroes its moments and writes
  /// its low-precision device-tier copy (round to nearest even). Blocks. Outside an iteration.
  void set_master_weights(std::size_t layer, std::span<const float> weights);
  /// Copies the fp32 master weights out (numel elements). Blocks. Outside an iteration.
  void read_master_weights(std::size_t layer, std::span<float> out);

  /// Makes the compute stream wait until `layer`'s parameters (numel elements of its
  /// param_dtype) are on the device and returns them; read-only for the caller, valid for work
  /// enqueued on the compute stream until release(layer). Blocks the host only while the
  /// layer's NVMe read is in flight or the window is full. IoError for a failed read of it.
  cuda::DeviceSpan fetch(std::size_t layer);
  /// The compute stream is done with `layer` once it reaches this point. Non-blocking.
  void release(std::size_t layer);
  /// Hands in `layer`'s gradients for this step (numel elements, host memory, fp32/bf16/fp16).
  /// on_arrival: starts its update on the optimizer's thread at once, and `grads` must stay
  /// valid and unchanged until step() returns. staged: copies them into the engine's staging
  /// (see Step modes) and returns; `grads` may be reused at once. Each layer at most once per
  /// step, and only while it is not fetched (released). UsageError otherwise.
  void set_gradients(std::size_t layer, adam::GradView grads);
  /// Hands in `layer`'s gradients in device memory: numel elements of `dtype` (fp32, bf16 or
  /// fp16) written by work enqueued on the compute stream before this call. The engine makes
  /// its own copy stream wait for that work (the host does not block), copies the gradients
  /// into one of zinf.grad_staging_buffers pinned buffers and queues the layer's update, which
  /// starts on the optimizer's thread once the copy has landed. Returns at once, unless every
  /// staging buffer holds gradients the optimizer has not read yet: then it waits for the
  /// oldest (grad_staging_wait_seconds). `grads` must stay valid and unchanged until step()
  /// returns. The updated weights are bitwise those of the host overload with the same
  /// gradients. Same rules as the host overload, and UsageError for a span of another device,
  /// a size other than numel x the dtype's size, or zinf.grad_staging_buffers 0. A failed copy
  /// fails step() as a failed read does (the step did not happen). The staging (the count x
  /// the largest layer's fp32 gradients) is counted in the pinned budget at construction and
  /// allocated and pinned at the first call. In the staged step mode the host waits for the
  /// copy to land, stages it as host gradients are staged and frees the buffer: the copies do
  /// not overlap backward in that mode, and `grads` may be reused once this returns.
  void set_gradients(std::size_t layer, cuda::DeviceSpan grads, ElementType dtype);
  /// Completes this step's updates (layers without gradients are not updated), makes every
  /// updated layer's new parameters what the next fetch returns, and ends the iteration for
  /// the prefetcher. Returns the optimizer's step figures, with the staged mode's norm, factor,
  /// loss scale and whether the step was skipped. Throws as described under Errors.
  StepStats step();
  /// The loss scale the trainer multiplies its loss by for the next backward: fp16 loss
  /// scaling's current scale (static, or dynamic and updated by each step()), else 1.
  double loss_scale() const noexcept;
  /// The step mode in effect (config.zinf.step_mode with "auto" resolved).
  StepMode step_mode() const noexcept;

  /// Sets every layer's hyper-parameters, per-layer sets included, from the next step on (e.g.
  /// a learning-rate schedule where all layers share one set); `hyper.step` is ignored.
  /// UsageError inside a step or for values check_adam_params() refuses (inf, NaN, out of
  /// range); a refused call changes nothing, so the engine stays usable and its state intact.
  /// A schedule over layers with sets of their own (no decay for biases) sets each layer with
  /// set_hyper(layer, ...), starting from hyper(layer).
  void set_hyper(const adam::AdamParams& hyper);
  /// Sets layer `layer`'s hyper-parameters from the next step on; the other layers and
  /// hyper() keep theirs. UsageError for an unknown layer, inside a step, or for values
  /// check_adam_params() refuses (naming the layer and the field); a refused call changes
  /// nothing.
  void set_hyper(std::size_t layer, const adam::AdamParams& hyper);
  /// The hyper-parameters last set for all layers: the config's, then set_hyper(hyper)'s, or a
  /// loaded checkpoint's after load(). What every layer without a set of its own steps with.
  /// Works in the failed state too (for reporting).
  adam::AdamParams hyper() const;
  /// The hyper-parameters layer `layer`'s next step uses (its own set or hyper()). UsageError
  /// for an unknown layer. Works in the failed state too.
  adam::AdamParams hyper(std::size_t layer) const;

  /// Checkpoint of the optimizer state (master weights, moments, step count, hyper-parameters:
  /// hyper() and every layer's) and the layer table under `dir`, atomically
  /// (OffloadedOptimizer::save); with dynamic loss scaling also its state (`loss_scale` inside
  /// the optimizer's new version, OffloadedOptimizer::set_checkpoint_file: committed with the
  /// state, so a failed or killed save never pairs a new scale with old weights; a checkpoint
  /// saved before keeps it in `dir/zinf-engine-loss-scale`, which load() still reads). Outside
  /// a step.
  /// UsageError for an empty `dir` (before anything is written). The directory's rules are
  /// OffloadedOptimizer::save's: the first save or load locks it for this engine until it is
  /// destroyed (another engine or process fails at once, naming the directory and the
  /// holder's pid); the layer table `dir/zinf-engine-layers` is replaced atomically, never
  /// written through a link.
  void save(const std::string& dir);
  /// save() into a directory the caller holds open (ShardedEngine's rank folder, opened
  /// without following a link): used through a descriptor of its own, never reopened by its
  /// path (OffloadedOptimizer::save(const swap::Dir&)). Same contract otherwise.
  void save(const swap::Dir& dir);
  /// save()'s checkpoint, written while training goes on (OffloadedOptimizer::save_async):
  /// the layer table and loss scale are written before this returns, the optimizer's version
  /// directory is created, and its records are written by a thread of the save's own, which
  /// then commits the version exactly as save() does. The checkpoint is the state at this
  /// call, bitwise (the same files save() writes here would hold). Steps may run meanwhile:
  /// before a step's update overwrites a record the save has not written yet, the step copies
  /// that record (one sub-group; at most 8 copies not yet written) for the save; StepStats'
  /// snapshot_copy_bytes and snapshot_wait_seconds report the cost. Where the checkpoint
  /// directory shares an XFS or btrfs file system with the swap files, the records are
  /// cloned from them instead (reflink) and steps copy nothing (last_save_snapshot()). A
  /// kill -9 at any point leaves the previous checkpoint loadable.
  /// Contract: outside a step (UsageError, as save()). A save in flight is waited for first
  /// and its error thrown here (no new save starts). save(), load() and set_master_weights()
  /// wait for a save in flight likewise. Failures (IoError naming file, offset, length) are
  /// thrown by wait_save(); the half-written version is removed, the previous checkpoint
  /// stays current. The destructor finishes a save in flight (a failure is logged).
  void save_async(const std::string& dir);
  /// Waits for the save_async() in flight, if any, to be committed; throws its failure once.
  /// Also inside a step and on a failed engine (the save does not depend on later steps).
  void wait_save();
  /// True while a save_async() is still writing or committing.
  bool save_in_flight() const;
  /// How the last save_async() took its snapshot of the optimizer state: kReflink where the
  /// records were cloned from the swap files (XFS, btrfs; steps then copy nothing), kStreamed
  /// elsewhere; kNone before the first (OffloadedOptimizer::save_async).
  SaveSnapshot last_save_snapshot() const noexcept;
  /// Restores what save() wrote and rewrites every layer's low-precision copy from the
  /// restored master weights. The checkpoint's hyper-parameters replace the engine's, per-layer
  /// sets given at construction included; a checkpoint written before per-layer sets existed
  /// gives its one set to every layer. With dynamic loss scaling it also restores the loss
  /// scale's state (a checkpoint without one keeps the current state, with a notice; one this
  /// config cannot reach is a UsageError, one that does not parse IoError kCorrupt, both
  /// before anything changes). UsageError if the layer table differs or `dir` is empty;
  /// IoError naming the layer table if it is missing, a link or anything but a regular file (a
  /// FIFO without blocking); the optimizer's load errors otherwise.
  void load(const std::string& dir);
  /// load() from a directory the caller holds open, used as save(const swap::Dir&) uses it.
  void load(const swap::Dir& dir);

  EngineStats stats() const;

 private:
  friend class test_hooks::EngineAccess;
  friend class EngineSeamsAccess;
  OffloadEngine(EngineConfig config, std::vector<LayerSpec> layers, cuda::Device& device,
                cuda::StreamRef compute_stream, const test_hooks::EngineFaults& faults);

  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zinf::offload
