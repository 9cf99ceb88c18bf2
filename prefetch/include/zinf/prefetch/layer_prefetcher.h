// SPDX-License-Identifier: Apache-2.0
// LayerPrefetcher: keeps a bounded window of layers moving NVMe -> pinned staging -> device
// ahead of the compute stream, so that a layer's parameters are on the device when its compute
// starts. Layers are tensors of a swap::SwapStore; the device side is a cuda::Device (CUDA or
// the host simulation). The core of zinf::prefetch, beneath offload/.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "zinf/cuda/device.h"
#include "zinf/swap/io_engine.h"
#include "zinf/swap/swap_store.h"

namespace zinf::prefetch {

struct PrefetcherOptions {
  /// The layers, by SwapStore key; layer i is layer_keys[i]. Each key must be allocated in the
  /// store and swapped out before its first acquire.
  std::vector<std::string> layer_keys;
  /// The order in which one iteration acquires layers (indices into layer_keys; a layer may
  /// appear more than once, e.g. forward then backward in reverse). Empty: traced on the
  /// first iteration (see LayerPrefetcher).
  std::vector<std::size_t> order;
  /// Layers read ahead of the one computing: while layer l computes, the next `depth` layers
  /// of the order are read and copied. 0 = fetch on demand only (no overlap).
  std::size_t depth = 2;
  /// The most bytes of layer data held at once: pinned staging leases plus the device memory
  /// of layers in flight, resident, or cached for reuse. Never exceeded. Must hold at least the
  /// largest layer's padded staging size plus its device size.
  std::uint64_t max_bytes = 1ull << 30;
  /// Budget of the pinned staging pool (its arena is allocated, pinned with the Device, and
  /// optionally registered with the engine once). 0: max_bytes.
  std::uint64_t staging_bytes = 0;
  /// Touch every staging page at construction (BufferPoolOptions::prefault), so that the
  /// first reads do not pay page faults (benchmarks).
  bool prefault_staging = false;
  /// Ask for 2 MiB pages for the staging arena (BufferPoolOptions::huge_pages).
  bool huge_pages = true;
  /// Allocate at construction the device memory the window will use (buffers for the first
  /// depth + 2 layers of the order, or of the layer list when tracing, within max_bytes), so
  /// that acquire and release do not call the device allocator: cudaMalloc is slow and may
  /// synchronize the device. Buffers are reused for layers of the same size.
  bool preallocate_device = true;
  /// If set, the staging arena is registered with this engine (IoEngine::register_buffers:
  /// io_uring fixed buffers), and unregistered (register_buffers with no regions) by the
  /// destructor, since the arena goes with the prefetcher. That replaces the engine's other
  /// registrations, so leave it null when the engine serves other registered buffers. Must be
  /// the store's engine, and no other request on it may be in flight at construction and
  /// destruction (register_buffers' precondition).
  swap::IoEngine* register_with_engine = nullptr;
};

/// Counters since construction. Read while the prefetcher runs, so fields may be mid-update
/// relative to each other.
struct PrefetcherStats {
  std::uint64_t acquires = 0;
  /// Acquires whose layer had already been issued (read started) before acquire was called.
  std::uint64_t hits = 0;
  /// Acquires of a layer not yet issued: fetched on demand by acquire itself.
  std::uint64_t on_demand = 0;
  /// Acquires whose copy had not completed when the compute stream reached them.
  std::uint64_t late_layers = 0;
  /// Time the compute stream spent waiting for layer data, from reaching acquire's point in
  /// the stream to the layer's copy having completed (see LayerPrefetcher: stall accounting).
  std::chrono::nanoseconds stall_time{0};
  /// Host time spent blocked inside acquire() (NVMe reads not done, or no room in the window).
  std::chrono::nanoseconds acquire_blocked_time{0};
  /// Times the trainer's order differed from the prediction (re-traces).
  std::uint64_t retraces = 0;
  /// Layers issued (NVMe reads started), and layers dropped from the window unused.
  std::uint64_t layers_issued = 0;
  std::uint64_t evictions = 0;
  std::uint64_t bytes_read = 0;       ///< NVMe -> staging (padded sizes), completed reads
  std::uint64_t bytes_to_device = 0;  ///< staging -> device, copies enqueued
  /// The most bytes held at once (staging leases + device memory), never above max_bytes.
  std::uint64_t peak_held_bytes = 0;
  std::uint64_t read_failures = 0;
  /// Time with at least one layer's NVMe read in flight: bytes_read / read_busy_time is the
  /// rate the reads ran at (they overlap compute, so wall time would understate it).
  std::chrono::nanoseconds read_busy_time{0};
};

/// A bounded window of layers in flight NVMe -> pinned staging -> device.
///
/// Use, per iteration: for each layer in order, `acquire(l)` (the compute stream will wait for
/// the layer's data), enqueue the layer's compute on the compute stream using the returned
/// device memory, `release(l)`; then `end_iteration()`.
///
/// Pipeline. Issuing a layer leases a staging buffer, takes device memory and submits the
/// NVMe read (SwapStore::swap_in). When the read completes, its completion callback (an engine
/// thread) enqueues the host->device copy on the prefetcher's own copy stream and records the
/// layer's copy event; a host function after the copy returns the staging buffer to the pool.
/// So the NVMe -> pinned -> device chain runs off the caller's thread. acquire() makes the
/// compute stream wait on the copy event. release() records an event on the compute stream;
/// the layer's device memory is recycled once that event has completed, i.e. once the compute
/// stream is past the layer, and the window then advances.
///
/// The window. Layers are issued in the predicted order, at most `depth` ahead of the next
/// acquisition, and while at most depth + 1 layers are in the window (issued and not yet
/// acquired, or released and not yet recycled: layers between acquire and release are the
/// caller's and do not count), and while the bytes held stay within max_bytes. Checked at
/// every call (acquire, release, end_iteration): the window advances when the caller calls.
///
/// Order. With PrefetcherOptions::order the prediction is that order, repeated. Without it the
/// first iteration (until end_iteration()) fetches on demand and records the acquire order,
/// which becomes the prediction. When an acquire differs from the prediction (or an iteration
/// ends early), the prefetcher re-traces: counts it in stats, fetches on demand for the rest
/// of that iteration, and predicts the order just recorded from the next iteration on.
/// Layers already in the window stay usable; unused ones are evicted when room is needed.
///
/// When acquire() blocks the calling thread (it never waits for device copies or compute):
/// - the layer's NVMe read is still in flight: until it completes (its copy is then only
///   enqueued, not waited for);
/// - the layer was not issued and the window has no room: until released layers are
///   recycled (the compute stream passes their release) or in-flight reads of evicted
///   layers finish. With depth 0 this serialises read and compute, by design.
/// Otherwise it returns at once. release() and end_iteration() never block.
///
/// Stall accounting. acquire() enqueues on the compute stream a host function that timestamps
/// when the stream reaches the layer (and whether its copy is done: a late layer), then the
/// wait on the copy event, then a host function that timestamps again; the difference is the
/// stall. On CUDA these host functions cost a few microseconds each; cudaEvent timing would
/// be cheaper, worth measuring once a GPU run shows them in a profile.
///
/// Errors. A failed NVMe read surfaces at the acquire() of that layer as the zinf::IoError of
/// the swap layer (same text: key, file, offset, length, errno); the layer is then dropped, so
/// a later acquire reads it again. Synchronous refusals of SwapStore::swap_in (EngineFailed,
/// UsageError for a key never swapped out) surface at that layer's acquire likewise. A device
/// error (a failed copy, or the compute stream failing) surfaces at the next call as
/// zinf::DeviceError; the prefetcher is then failed and every later call throws EngineFailed
/// quoting it. Misuse (bad layer index, acquiring a layer twice, releasing one not acquired)
/// throws UsageError.
///
/// Rewrites. A layer whose stored bytes change (the engine writing a step's updated
/// parameters) is suspend()ed for the rewrite and resume()d after it, so that a copy read
/// before the rewrite is never handed out again (see suspend).
///
/// Thread-safety: every member is thread-safe (one mutex); a trainer normally calls from one
/// thread. The device memory returned by acquire() is valid for work enqueued on the compute
/// stream until release(); treat it as read-only (a layer kept resident in the window is
/// handed out again without being re-read).
///
/// Lifetime: the store, the device and the compute stream must outlive the prefetcher. The
/// destructor waits for reads in flight and for the compute stream (so that no enqueued work
/// still uses the layers' memory), logs the failed reads of layers never acquired (a drive
/// error no caller saw), and never throws.
class LayerPrefetcher {
 public:
  /// Checks the options and allocates and pins the staging arena; issues no I/O (the window
  /// fills at the first call). Throws UsageError for an empty layer list, an unknown key, an
  /// order index out of range, a compute stream of another device, or a max_bytes smaller
  /// than the largest layer needs; IoError/DeviceError if the arena cannot be made or pinned.
  LayerPrefetcher(PrefetcherOptions options, swap::SwapStore& store, cuda::Device& device,
                  cuda::StreamRef compute_stream);
  ~LayerPrefetcher();
  LayerPrefetcher(const LayerPrefetcher&) = delete;
  LayerPrefetcher& operator=(const LayerPrefetcher&) = delete;

  /// Makes the compute stream wait until `layer`'s data is on the device and returns that
  /// memory (exactly the layer's size). Blocks only as described above. Throws as described
  /// above (IoError for the layer's failed read; DeviceError, EngineFailed, UsageError).
  cuda::DeviceSpan acquire(std::size_t layer);
  /// Marks `layer` done once the compute stream reaches this point; its memory is recycled
  /// after that. Advances the window. Non-blocking. Throws UsageError if `layer` is not
  /// acquired; DeviceError/EngineFailed as above.
  void release(std::size_t layer);
  /// Ends an iteration: adopts the traced order if tracing, re-traces if the iteration ended
  /// before the predicted order did, and starts prefetching the next iteration's first layers.
  /// Non-blocking.
  void end_iteration();

  /// Takes `layer` out of the window while its stored bytes are rewritten (e.g. the optimizer
  /// writing updated parameters into its SwapStore key): drops every copy of it the window
  /// holds (issued, resident or released-and-cached), waiting for its NVMe read, its copy to
  /// the device and the compute stream's passing of its release if those are in flight, and
  /// issues no read of it until resume(layer). So once suspend() returns, the prefetcher has
  /// no swap_in of the key in flight (SwapStore refuses a swap_out overlapping one) and will
  /// never hand out bytes read before the rewrite. Blocks only for that in-flight work.
  /// Throws UsageError for a layer that is acquired (not released) or already suspended;
  /// DeviceError/EngineFailed as acquire. acquire() of a suspended layer is a UsageError.
  void suspend(std::size_t layer);
  /// Lets `layer` be issued again; the next acquire reads it anew from the store. Non-blocking.
  /// Throws UsageError if it is not suspended.
  void resume(std::size_t layer);
  /// True between suspend(layer) and resume(layer).
  bool suspended(std::size_t layer) const;

  /// Blocks until every read issued so far has completed or failed (reads are issued ahead of
  /// the acquires, so some may be in flight when the caller is done with the prefetcher).
  /// Acquires nothing and keeps the window as it is: a failed read still surfaces at that
  /// layer's acquire. Afterwards stats().read_failures counts every failed read issued so far,
  /// including those of layers nobody has acquired; the destructor logs each of those as a
  /// warning naming the layer and the swap layer's error. Throws nothing.
  void wait_for_reads();

  std::size_t layer_count() const noexcept;
  /// Device bytes of `layer` (its SwapStore size).
  std::uint64_t layer_bytes(std::size_t layer) const;
  /// The prediction now (empty while tracing: the first iteration, or the rest of one that
  /// deviated from the prediction).
  std::vector<std::size_t> predicted_order() const;
  PrefetcherStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zinf::prefetch
