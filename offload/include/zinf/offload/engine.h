// SPDX-License-Identifier: Apache-2.0
// OffloadEngine: what a trainer links. One object owns the parameter offload (layers' low-
// precision parameters on the device, in pinned host memory or on NVMe, prefetched layer by
// layer) and the optimizer offload (fp32 master weights and Adam moments in host memory or on
// NVMe, updated per layer as gradients arrive), configured from a DeepSpeed-style config.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "zinf/adam/cpu_adam.h"
#include "zinf/common/dtype.h"
#include "zinf/cuda/device.h"
#include "zinf/offload/config.h"
#include "zinf/offload/optimizer.h"

namespace zinf::offload {

/// One layer (or parameter shard) the engine manages: its element count and the dtype of its
/// parameters on the device. The fp32 master copy and both moments live in the optimizer tier.
struct LayerSpec {
  std::string name;                  ///< for messages and checkpoints; unique, not empty
  std::uint64_t numel = 0;           ///< > 0
  DType param_dtype = DType::kBF16;  ///< kBF16 or kF16 (the device copy; fp32 is the master)
};

/// Counters since construction (bytes, seconds) and the last step's figures.
struct EngineStats {
  std::uint64_t steps = 0;                    ///< steps completed
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
  std::uint64_t pinned_bytes = 0;        ///< pinned host memory held now
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
/// NVMe offload without a path) and creates the swap files (IoError kNoSpace naming the
/// directory when a drive is too small). I/O failures surface as IoError naming key, file,
/// offset and length: a failed parameter read at that layer's fetch (retried by the next
/// fetch); a failed write-back of optimizer state or parameters at step(), after which the
/// engine is failed and every call throws EngineFailed quoting the first error. With
/// config.zinf.checksums (the default) bytes read back from a swap file that do not match
/// their CRC32C are such a failed read, IoError kCorrupt (file, offset, length, both CRCs):
/// at fetch for a layer; at step() for optimizer state (failed as a read: the step did not
/// happen if nothing was written yet, else the engine is failed); at save(), which then
/// writes no checkpoint. Corrupt bytes are never handed out, trained on or saved.
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
  /// Hands in `layer`'s gradients for this step (numel elements, host memory, fp32/bf16/fp16)
  /// and starts its update on the optimizer's thread at once. `grads` must stay valid and
  /// unchanged until step() returns. Each layer at most once per step, and only while it is not
  /// fetched (released). UsageError otherwise.
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
  /// allocated and pinned at the first call.
  void set_gradients(std::size_t layer, cuda::DeviceSpan grads, DType dtype);
  /// Completes this step's updates (layers without gradients are not updated), makes every
  /// updated layer's new parameters what the next fetch returns, and ends the iteration for
  /// the prefetcher. Returns the optimizer's step figures. Throws as described under Errors.
  StepStats step();

  /// Sets the hyper-parameters from the next step on (e.g. a learning-rate schedule);
  /// `hyper.step` is ignored. UsageError inside a step or for values check_adam_params()
  /// refuses (inf, NaN, out of range); a refused call changes nothing, so the engine stays
  /// usable and its state intact.
  void set_hyper(const adam::AdamParams& hyper);
  /// The hyper-parameters the next step uses: the config's, then set_hyper's, or a loaded
  /// checkpoint's after load(). Works in the failed state too (for reporting).
  adam::AdamParams hyper() const;

  /// Checkpoint of the optimizer state (master weights, moments, step count, hyper-parameters)
  /// and the layer table under `dir`, atomically (OffloadedOptimizer::save). Outside a step.
  /// UsageError for an empty `dir` (before anything is written). The directory's rules are
  /// OffloadedOptimizer::save's: the first save or load locks it for this engine until it is
  /// destroyed (another engine or process fails at once, naming the directory and the
  /// holder's pid); the layer table `dir/zinf-engine-layers` is replaced atomically, never
  /// written through a link.
  void save(const std::string& dir);
  /// Restores what save() wrote and rewrites every layer's low-precision copy from the
  /// restored master weights. UsageError if the layer table differs or `dir` is empty;
  /// IoError naming the layer table if it is missing, a link or anything but a regular file (a
  /// FIFO without blocking); the optimizer's load errors otherwise.
  void load(const std::string& dir);

  EngineStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zinf::offload
