// SPDX-License-Identifier: Apache-2.0
// LayerPrefetcher: keeps a bounded window of layers moving to the device ahead of the compute
// stream, so that a layer's parameters are on the device when its compute starts. One policy
// (window, trace, on-demand fallback, suspend/resume, stall accounting), two sources: tensors
// of a swap::SwapStore (NVMe -> pinned staging -> device) or the caller's pinned host copies
// (host copy -> device, no staging). The device side is a cuda::Device (CUDA or the host
// simulation). The core of zinf::prefetch, beneath offload/.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "zinf/cuda/device.h"
#include "zinf/swap/io_engine.h"
#include "zinf/swap/swap_store.h"

namespace zinf::prefetch {

class LayerPrefetcher;
namespace test_hooks {
// Declared in zinf/prefetch/testing.h, where its contract is; a friend of LayerPrefetcher.
void set_copy_hook(LayerPrefetcher& prefetcher, std::function<void(std::size_t layer)> hook);
}  // namespace test_hooks

struct PrefetcherOptions {
  /// Store source only: the layers, by SwapStore key; layer i is layer_keys[i]. Each key must
  /// be allocated in the store and swapped out before its first acquire. Empty for the host
  /// source (its layers are the host copies given to the constructor).
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
  /// largest layer's padded staging size plus its device size. The host source has no
  /// staging: max_bytes bounds device memory only, and must hold the largest layer.
  std::uint64_t max_bytes = 1ull << 30;
  /// Store source only: budget of the pinned staging pool (its arena is allocated, pinned with
  /// the Device, and optionally registered with the engine once). 0: max_bytes.
  std::uint64_t staging_bytes = 0;
  /// Store source only: touch every staging page at construction
  /// (BufferPoolOptions::prefault), so that the first reads do not pay page faults (benchmarks).
  bool prefault_staging = false;
  /// Store source only: ask for 2 MiB pages for the staging arena
  /// (BufferPoolOptions::huge_pages).
  bool huge_pages = true;
  /// Allocate at construction the device memory the window will use (buffers for the first
  /// depth + 2 layers of the order, or of the layer list when tracing, within max_bytes), so
  /// that acquire and release do not call the device allocator: cudaMalloc is slow and may
  /// synchronize the device. Buffers are reused for layers of the same size.
  bool preallocate_device = true;
  /// Store source only. If set, the staging arena is registered with this engine
  /// (IoEngine::register_buffers: io_uring fixed buffers), and unregistered (register_buffers
  /// with no regions) by the destructor, since the arena goes with the prefetcher. That
  /// replaces the engine's other registrations, so leave it null when the engine serves other
  /// registered buffers. Must be the store's engine, and no other request on it may be in
  /// flight at construction and destruction (register_buffers' precondition).
  swap::IoEngine* register_with_engine = nullptr;
};

/// Counters since construction. Read while the prefetcher runs, so fields may be mid-update
/// relative to each other.
struct PrefetcherStats {
  std::uint64_t acquires = 0;
  /// Acquires whose layer had already been issued (read started, or for the host source copy
  /// enqueued) before acquire was called.
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
  /// Layers issued (NVMe reads started; host source: copies enqueued), and layers dropped from
  /// the window unused.
  std::uint64_t layers_issued = 0;
  std::uint64_t evictions = 0;
  std::uint64_t bytes_read = 0;  ///< NVMe -> staging (padded sizes), completed reads; 0 for host
  std::uint64_t bytes_to_device = 0;  ///< staging (or host copy) -> device, copies enqueued
  /// The most bytes held at once (staging leases + device memory), never above max_bytes.
  std::uint64_t peak_held_bytes = 0;
  std::uint64_t read_failures = 0;
  /// Time with at least one layer's NVMe read in flight: bytes_read / read_busy_time is the
  /// rate the reads ran at (they overlap compute, so wall time would understate it). 0 for the
  /// host source.
  std::chrono::nanoseconds read_busy_time{0};
};

/// A bounded window of layers in flight to the device, from one of two sources:
/// - the store source (the constructor taking a SwapStore): NVMe -> pinned staging -> device;
/// - the host source (the constructor taking host copies): each layer already sits in pinned
///   host memory the caller owns, so "reading" it is immediate and the host->device copy goes
///   straight from it, with no staging.
/// The window, the order tracing, the on-demand fallback, suspend/resume and the statistics are
/// the same for both; only how a layer reaches host memory the copy can read differs.
///
/// Use, per iteration: for each layer in order, `acquire(l)` (the compute stream will wait for
/// the layer's data), enqueue the layer's compute on the compute stream using the returned
/// device memory, `release(l)`; then `end_iteration()`.
///
/// Pipeline. Issuing a layer leases a staging buffer, takes device memory and submits the
/// NVMe read (SwapStore::swap_in). When the read completes, its completion callback (an engine
/// thread) enqueues the host->device copy on the prefetcher's own copy stream and records the
/// layer's copy event; a host function after the copy returns the staging buffer to the pool.
/// So the NVMe -> pinned -> device chain runs off the caller's thread. For the host source,
/// issuing a layer takes device memory and enqueues the copy from the host copy at once (on the
/// calling thread, inside the call that issues it). acquire() makes the
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
///   recycled (the compute stream passes their release) or in-flight reads (host source:
///   copies) of evicted layers finish. With depth 0 this serialises read and compute, by
///   design;
/// - the layer's previous copy went stale (suspend) while the compute stream still used it:
///   until the stream is past its release, so that its device memory can be reused.
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
/// parameters into its store key or its host copy) is suspend()ed for the rewrite and
/// resume()d after it, so that no read or copy of the source overlaps the rewrite and a copy
/// made before it is never handed out again (see suspend).
///
/// Thread-safety: every member is thread-safe (one mutex); a trainer normally calls from one
/// thread. The device memory returned by acquire() is valid for work enqueued on the compute
/// stream until release(); treat it as read-only (a layer kept resident in the window is
/// handed out again without being re-read).
///
/// Lifetime: the store (or the host copies), the device and the compute stream must outlive
/// the prefetcher. The
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
  /// The host source: layer i is host_layers[i] (its size is the layer's size, at least one
  /// byte). The copies should lie inside a PinnedRegistration of `device` (else each copy is a
  /// pageable one: it works, but does not overlap on CUDA; DeviceStats::pageable_copies counts
  /// them). The caller keeps ownership: the memory must outlive the prefetcher, and a layer's
  /// host copy may be written only while that layer is suspended (between suspend and resume),
  /// since the prefetcher copies from it at any other time. options.layer_keys must be empty
  /// and options.register_with_engine null (there is no staging). Throws UsageError for an
  /// empty layer list, an empty host copy, keys given, an order index out of range, a compute
  /// stream of another device, or a max_bytes smaller than the largest layer; DeviceError if
  /// device memory cannot be allocated.
  LayerPrefetcher(PrefetcherOptions options, std::vector<std::span<const std::byte>> host_layers,
                  cuda::Device& device, cuda::StreamRef compute_stream);
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

  /// Takes `layer` out of the window while its source bytes are rewritten (e.g. the optimizer
  /// writing updated parameters into its SwapStore key or its host copy): issues no read or
  /// copy of it until resume(layer), and drops every copy of it the window holds (issued,
  /// resident or released-and-cached), so that bytes read before the rewrite are never handed
  /// out again. Before returning it waits until nothing reads the layer's source any more:
  /// - store source: the layer's NVMe read, if one is in flight (SwapStore refuses a swap_out
  ///   overlapping a swap_in of the key);
  /// - host source: the layer's host->device copy, if one is in flight or queued (it reads the
  ///   very memory the caller is about to rewrite: returning earlier would let it copy torn
  ///   parameters).
  /// It does not wait for the compute stream: a copy of the layer the stream may still use
  /// (released, its release not yet passed) is marked stale and its device memory recycled once
  /// the stream is past it. Blocks only for that in-flight read or copy.
  /// Throws UsageError for a layer that is acquired (not released) or already suspended;
  /// DeviceError/EngineFailed as acquire. acquire() of a suspended layer is a UsageError.
  void suspend(std::size_t layer);
  /// Lets `layer` be issued again; the next acquire reads it anew from its source.
  /// Non-blocking.
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
  /// Device bytes of `layer` (its SwapStore size, or its host copy's).
  std::uint64_t layer_bytes(std::size_t layer) const;
  /// The prediction now (empty while tracing: the first iteration, or the rest of one that
  /// deviated from the prediction).
  std::vector<std::size_t> predicted_order() const;
  PrefetcherStats stats() const;

 private:
  friend void test_hooks::set_copy_hook(LayerPrefetcher&, std::function<void(std::size_t)>);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zinf::prefetch
