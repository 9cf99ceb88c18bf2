// SPDX-License-Identifier: Apache-2.0
// ShardedEngine: the OffloadEngine of one data-parallel rank in a group of N, at the ZeRO stage
// the config names: each rank keeps 1/N of every layer's fp32 master weights and Adam moments
// (in the optimizer tier, on its own rank<R> paths) and averages gradients into its slice;
// stage 3 also keeps only 1/N of the parameters and rebuilds a layer with an all-gather at
// fetch, stages 1 and 2 keep every layer whole and all-gather the updated slices once per
// step. Part of zinf::dist (docs/distributed.md; the layering is in docs/design.md).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "zinf/adam/cpu_adam.h"
#include "zinf/common/element_type.h"
#include "zinf/cuda/device.h"
#include "zinf/dist/collectives.h"
#include "zinf/offload/config.h"
#include "zinf/offload/engine.h"

namespace zinf::offload::test_hooks {
struct EngineFaults;
}  // namespace zinf::offload::test_hooks

namespace zinf::dist {
namespace test_hooks {
class ShardedEngineAccess;  // zinf/dist/testing.h: a rank's engine with fault plans installed
}  // namespace test_hooks

/// One rank's share of a sharded OffloadEngine.
///
/// Stage (config.zero_stage, zero_optimization.stage), with N > 1 ranks:
/// - 3: as laid out below; fetch all-gathers the layer from every rank's slice (each fetch,
///   forward and backward), set_gradients reduce-scatters.
/// - 1 and 2: the parameters are not partitioned. Each rank also keeps every layer's full
///   low-precision parameters in device memory of the engine (the layer padded as below: its
///   parameter bytes x (1 + 1/N) with the slice), and fetch hands them out with no collective.
///   set_gradients averages into this rank's slice with a reduce-scatter (2) or an all-reduce
///   of the whole layer (1, twice the bytes), the update runs on the slice as at stage 3, and
///   step all-gathers every layer's updated slices once (none for a skipped step).
///   set_master_weights and load fill the full parameters too. Parameter offload needs stage 3
///   (UsageError at construction, as parse_config refuses it).
/// - 0: UsageError at construction (plain data parallelism is not offered).
/// The updates, and so the weights, are the same bitwise at every stage (where the backend's
/// average is: an exact one is, on every backend), and checkpoints are the same format: one
/// saved at one stage loads at another.
///
/// Layout. Layer l (numel n) is padded with zeros to a multiple of size() elements; rank r owns
/// elements [r * s, (r + 1) * s) of it, s = padded / size(). This rank's OffloadEngine (local())
/// manages layers of s elements with the same names, dtypes and hyper-parameters: the parameter
/// tier holds this rank's low-precision slice (resident, pinned or NVMe, prefetched as the
/// engine prefetches), the optimizer tier its fp32 master slice and moments. Every NVMe
/// directory of the config (offload_param.nvme_path, offload_optimizer.nvme_path,
/// zinf.nvme_paths) gets a `rank<R>` subfolder for this rank's files (created if missing, never
/// followed if it is a link), as DeepSpeed lays them out; with one rank the directories are used
/// as they are. The padding's master weights and
/// gradients are 0 and stay 0 through every update. offload_param.buffer_size bounds the slice.
///
/// One rank (size() 1) is an OffloadEngine over the whole layers at every stage, bitwise: the same updates,
/// fetched parameters, swap directories and checkpoints' contents (in `dir`/rank0, with the
/// manifests).
///
/// Collective calls: every rank calls the members marked "Collective" in the same order with the
/// same layers and sizes (Collectives' contract): fetch, set_master_weights,
/// read_master_weights, set_gradients, step, save, load. The others are local.
///
/// Errors. Local misuse (a size other than the layer's, an unknown layer) is a UsageError
/// thrown before any collective, so a rank that makes it should end the job. A failure of this
/// rank's own I/O (a failed parameter read at fetch, a failed write-back at step, a failed
/// checkpoint file) is all-reduced before the next collective: this rank throws its own error
/// and every other rank throws IoError "<operation> failed: K of N ranks failed (rank R); this
/// rank (Q) did not" (the engine of the failed rank follows OffloadEngine's rules, e.g. failed
/// after a write-back error; the others' engines stay as they were). A collective that fails
/// (a dead peer: the MPI adapter's timeout) throws CollectiveError naming the operation and this
/// rank; the group is then unusable and the job must end.
///
/// One rank: fetch and release are the engine's own (no host round trip).
///
/// Memory. With a host-memory backend (MPI, callbacks, local), fetch copies this rank's slice
/// to the host after the compute stream's earlier work (the host waits for it), all-gathers it
/// and copies the full layer to a device buffer of the engine on the compute stream. With a
/// device-memory backend (NCCL, whose device must be `device`), fetch waits for the compute
/// stream's earlier work and all-gathers from the slice where this rank's engine fetched it
/// straight into the engine's full device buffer, with no host copy; the backend's call
/// returns once the result is in place, whichever stream it runs on, so the caller's later
/// work on the compute stream reads it. Every other collective is on host data (gradients,
/// master weights, the failure flags, the staged step's norm, checkpoint agreement): with a
/// device-memory backend it is copied into a device buffer of the engine, run there and copied
/// back, on a stream of the engine's own (set_gradients of host gradients does not wait for
/// the compute stream). That buffer grows to the largest call: a padded layer of fp32 plus its
/// slice. Device gradients: see set_gradients' device overload.
///
/// Threads: one controlling thread per rank (not thread-safe), which also issues the
/// Collectives' calls. Lifetime: `comm`, the device and the compute stream outlive the engine.
class ShardedEngine {
 public:
  /// Builds this rank's OffloadEngine over its slices (OffloadEngine's constructor errors, with
  /// this rank's directories), after creating the rank<R> folders. Not collective. `comm` may
  /// take host or device memory (see Memory above).
  ShardedEngine(offload::EngineConfig config, std::vector<offload::LayerSpec> layers,
                cuda::Device& device, cuda::StreamRef compute_stream, Collectives& comm);
  ~ShardedEngine();
  ShardedEngine(const ShardedEngine&) = delete;
  ShardedEngine& operator=(const ShardedEngine&) = delete;

  int rank() const noexcept;
  int world_size() const noexcept;
  /// The config's zero_optimization.stage (see Stage above).
  int zero_stage() const noexcept;
  std::size_t layer_count() const noexcept;
  /// The full layer as given at construction.
  const offload::LayerSpec& layer(std::size_t index) const;
  /// Elements of layer l this rank owns (padding included) and where its slice starts.
  std::uint64_t shard_numel(std::size_t layer) const;
  std::uint64_t shard_offset(std::size_t layer) const;

  /// Collective (every rank passes the same full weights, numel elements): this rank keeps and
  /// sets its slice (OffloadEngine::set_master_weights).
  void set_master_weights(std::size_t layer, std::span<const float> weights);
  /// Collective: every rank's master slice, all-gathered into `out` (numel elements).
  void read_master_weights(std::size_t layer, std::span<float> out);

  /// Collective at stage 3: the full layer (numel elements of its param_dtype) in a device
  /// buffer of this engine, written on the compute stream (with a device-memory backend:
  /// already written when fetch returns), valid for work enqueued on it until release(layer).
  /// This rank's slice comes from its OffloadEngine (prefetched as there) and the others' from
  /// the all-gather; every rank gets the same bytes. Stages 1 and 2: local, the layer's full
  /// parameters this engine keeps (the same bytes), not written until the next step.
  cuda::DeviceSpan fetch(std::size_t layer);
  /// The compute stream is done with `layer` once it reaches this point. Local, non-blocking.
  void release(std::size_t layer);
  /// Collective: this rank's gradients of the full layer (numel elements in host memory, fp32,
  /// bf16 or fp16, the dtype the same on every rank). They are converted to fp32 and averaged
  /// over the ranks (reduce-scatter, stage 1 all-reduce; with a device-memory backend, of a
  /// device copy whose slice comes back to the host); this rank's slice of the average goes to
  /// its OffloadEngine
  /// (on_arrival: its update starts at once; staged: staged). `grads` may be reused once this
  /// returns (the engine keeps the averaged slice until step()).
  void set_gradients(std::size_t layer, adam::GradView grads);
  /// Collective: as above with this rank's gradients in device memory (OffloadEngine's device
  /// overload): numel elements of `dtype` (fp32, bf16 or fp16, the same on every rank) in
  /// memory of `device`, written by work enqueued on the compute stream before this call. The
  /// host waits for that work (the collective blocks it anyway), then:
  /// - device-memory backend, fp32, numel a multiple of world_size() (no padding), stage 2 or 3:
  ///   the
  ///   reduce-scatter reads `grads` where they are, into a device buffer of the engine (the
  ///   largest slice, kept), and only this rank's averaged slice (4 x shard_numel bytes) is
  ///   copied to the host;
  /// - otherwise (a host-memory backend; bf16/fp16, which are widened to fp32 on the host, as
  ///   OffloadEngine widens its device gradients; a layer that needs padding): `grads` are
  ///   copied to the host whole (numel x the dtype's size bytes) and take the host overload's
  ///   path from there (with a device-memory backend that path stages the padded fp32 layer
  ///   through device memory again).
  /// Lifetime: OffloadEngine's rule for device gradients, so that a trainer can move between
  /// the two engines: on_arrival, `grads` stay valid and unchanged until step() returns;
  /// staged, they may be reused once this returns. (This engine reads them only before it
  /// returns.) UsageError, on this rank and before any collective: a size other than numel x
  /// the dtype's size (an empty span included), memory of another device, an unknown dtype,
  /// a layer that already has gradients this step. A failed wait for the compute stream or
  /// failed copy is this rank's failure, told to every rank before the reduce-scatter (see
  /// Errors).
  void set_gradients(std::size_t layer, cuda::DeviceSpan grads, ElementType dtype);
  /// Collective: OffloadEngine::step on every rank. In the staged mode the sum of squares of the
  /// averaged gradients is all-reduced first (offload/engine_seams.h), so the global norm, the
  /// clipping factor, the overflow skip and the loss-scale update are the same on every rank.
  /// Stages 1 and 2 then all-gather every layer's updated parameters (see Stage). The stats'
  /// allgather_bytes, reduce_scatter_bytes and all_reduce_bytes count the gradient and
  /// parameter collectives of fetch, set_gradients and step since the previous step (0 on one
  /// rank).
  offload::StepStats step();

  /// Local: OffloadEngine's, for this rank (every rank sees the same values).
  double loss_scale() const noexcept;
  offload::StepMode step_mode() const noexcept;
  /// Local: every rank must make the same calls (the updates must stay the same).
  void set_hyper(const adam::AdamParams& hyper);
  void set_hyper(std::size_t layer, const adam::AdamParams& hyper);

  /// Collective: rank R saves its engine's checkpoint (OffloadEngine::save) in `dir`/rank<R>
  /// with a manifest naming the world size, the rank and the layers; rank 0 then writes the
  /// global manifest `dir`/zinf-sharded (ShardedOptimizer's format, "zinf-sharded-engine 1").
  /// If any rank fails, every rank throws. Two-phase as ShardedOptimizer::save: the previous
  /// checkpoint stays loadable until the new one is committed by every rank.
  void save(const std::string& dir);
  /// Collective: loads what save() wrote. A checkpoint of another world size is resharded as
  /// ShardedOptimizer::load does (its contract: each saved rank's folder read by one rank into
  /// a temporary optimizer over the saved slices, scratch swap files in this rank's first NVMe
  /// optimizer folder or the system's temporary directory, the slices redistributed bit for bit
  /// by a reduce-scatter of the floats' bit patterns, a failure on any rank thrown on every
  /// rank); the low-precision parameters are written from the new masters, and the step
  /// count, hyper-parameters and dynamic loss scale are saved rank 0's. The layers must have
  /// the checkpoint's names and full sizes (UsageError otherwise, before anything is read), and
  /// the config its state precision and sub-group size.
  void load(const std::string& dir);

  /// This rank's engine over its slices: its statistics (this rank's I/O), hyper-parameters.
  offload::OffloadEngine& local() noexcept;
  /// local()'s statistics, with last_step's allgather_bytes, reduce_scatter_bytes and
  /// all_reduce_bytes those of the last step() (as it returned them; 0 before the first).
  offload::EngineStats stats() const;

 private:
  friend class test_hooks::ShardedEngineAccess;
  ShardedEngine(offload::EngineConfig config, std::vector<offload::LayerSpec> layers,
                cuda::Device& device, cuda::StreamRef compute_stream, Collectives& comm,
                const offload::test_hooks::EngineFaults* faults);

  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zinf::dist
