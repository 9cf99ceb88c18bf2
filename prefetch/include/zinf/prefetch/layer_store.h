// SPDX-License-Identifier: Apache-2.0
// LayerStore: a model's layers on NVMe, read ahead in the traced order and rewritten while
// suspended. It owns the I/O engine, the swap store holding one key per layer and the
// LayerPrefetcher over them; OffloadEngine's nvme parameter tier and zinf.torch's
// offload_parameters both run on it, so there is one implementation of that path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "zinf/cuda/device.h"
#include "zinf/prefetch/layer_prefetcher.h"
#include "zinf/swap/io_engine.h"
#include "zinf/swap/swap_store.h"

namespace zinf::prefetch {

struct LayerStoreOptions {
  /// One entry per layer: its store key (unique, non-empty) and its size in bytes (> 0).
  std::vector<std::string> keys;
  std::vector<std::uint64_t> bytes;
  /// Where the swap files go (SwapStoreOptions::directories); at least one.
  std::vector<std::string> directories;
  /// The I/O engine's settings (block size, queue depth, threads, backend).
  swap::IoOptions io;
  /// The directories' direct-I/O alignment, where the caller has probed it already
  /// (swap::store_alignment); 0: probed here.
  std::uint32_t alignment = 0;
  bool checksums = true;  ///< SwapStoreOptions::checksums
  bool direct_io = true;  ///< SwapStoreOptions::direct_io
  /// Write the whole swap space once before use (SwapStore::precondition).
  bool precondition = false;
  /// Layers read ahead of the one in use (PrefetcherOptions::depth).
  std::size_t depth = 2;
  /// Pinned staging for the reads. 0: depth + 2 of the largest layer's padded size, what the
  /// window can have in flight.
  std::uint64_t staging_bytes = 0;
  /// Device memory the window may hold beyond the staging. 0: depth + 2 of the largest layer.
  std::uint64_t device_bytes = 0;
  /// Ask for 2 MiB pages for the staging arena.
  bool huge_pages = true;
};

/// The layers of LayerStoreOptions, each a key of a swap store (striped over the
/// directories, 1 MiB stripe units, a CRC32C per unit unless checksums is off), read ahead by
/// a LayerPrefetcher onto `device` in the order the caller acquires them.
///
/// Use: write() every layer once, then per iteration acquire()/release() each layer in use
/// and end_iteration(). write() may rewrite a layer at any time it is not acquired; an update
/// written by someone else through store() must be bracketed by suspend()/resume() (as the
/// engine's optimizer does with its copy-out).
///
/// Errors: the constructor throws as SwapStore's (UsageError for bad options, IoError naming
/// the directory: missing, not writable, too small) and LayerPrefetcher's; acquire throws as
/// LayerPrefetcher::acquire (IoError naming key, file, offset, length; kCorrupt for a checksum
/// mismatch); write and read throw IoError for a failed transfer and UsageError for a layer
/// out of range, a size that differs from the layer's, or a read of a layer never written
/// (the store's).
///
/// Threads: one calling thread at a time (the prefetcher itself is thread-safe; the staging
/// buffer of write/read is not shared across concurrent calls).
///
/// Lifetime: the device and the compute stream must outlive the store. The destructor waits
/// for reads in flight and for the compute stream, then closes the (unnamed) swap files,
/// which returns their space.
class LayerStore {
 public:
  LayerStore(const LayerStoreOptions& options, cuda::Device& device, cuda::StreamRef compute);
  ~LayerStore();
  LayerStore(const LayerStore&) = delete;
  LayerStore& operator=(const LayerStore&) = delete;

  std::size_t layer_count() const noexcept { return bytes_.size(); }
  std::uint64_t layer_bytes(std::size_t layer) const;

  /// LayerPrefetcher::acquire/release/end_iteration (an acquire of a layer never written
  /// throws the store's UsageError).
  cuda::DeviceSpan acquire(std::size_t layer);
  void release(std::size_t layer);
  void end_iteration();

  /// Acquires `layer`, enqueues a copy of it into `dst` (device memory of the store's device,
  /// exactly the layer's size) on the compute stream and releases it: the compute stream then
  /// holds the layer in `dst`, with no host copy; the window recycles its own memory once the
  /// stream is past the copy. Does not wait for the stream.
  void fetch_into(std::size_t layer, cuda::DeviceSpan dst);

  /// Writes `layer`'s bytes (blocking): `fill` is given the layer's padded span of staging
  /// memory (aligned for the store) and fills its first layer_bytes(layer) bytes; the padding
  /// is zeroed. The layer is suspended in the prefetcher meanwhile, so no copy read before
  /// the write is handed out after it.
  void write(std::size_t layer, const std::function<void(std::span<std::byte>)>& fill);
  /// write() of `bytes` (exactly the layer's size).
  void write(std::size_t layer, std::span<const std::byte> bytes);
  /// Reads `layer` into `out` (exactly its size) straight from the store, outside the traced
  /// order (the prefetcher neither counts nor learns it; a copy of the layer in its window is
  /// dropped). Blocking.
  void read(std::size_t layer, std::span<std::byte> out);

  /// Takes `layer` out of the window while its key is rewritten through store() (see
  /// LayerPrefetcher::suspend); resume() lets it be read again.
  void suspend(std::size_t layer);
  void resume(std::size_t layer);

  swap::SwapStore& store() noexcept { return *store_; }
  const swap::IoEngine& engine() const noexcept { return *engine_; }
  PrefetcherStats prefetch_stats() const;
  /// Bytes written by write() (layer sizes, not padded).
  std::uint64_t bytes_written() const noexcept { return written_bytes_; }

 private:
  // Reads and writes of the key outside the window hold it suspended, resumed whatever happens
  // (a layer left suspended could never be acquired again).
  class Suspension;

  void check_layer(std::size_t layer, const char* op) const;
  void check_size(std::size_t layer, std::uint64_t bytes, const char* op) const;
  std::span<std::byte> staging(std::uint64_t padded);

  std::vector<std::string> keys_;
  std::vector<std::uint64_t> bytes_;
  std::uint64_t written_bytes_ = 0;
  // Destroyed in reverse: the prefetcher reads through the store, the store through the engine.
  std::unique_ptr<swap::IoEngine> engine_;
  std::unique_ptr<swap::SwapStore> store_;
  std::unique_ptr<LayerPrefetcher> prefetcher_;
  cuda::Device& device_;
  cuda::StreamRef compute_;
  // write()/read()'s aligned buffer, ordinary memory, kept once made (a loop rewriting its
  // layers every step must not fault in fresh pages each time).
  struct FreeBytes {
    void operator()(std::byte* p) const noexcept;
  };
  std::unique_ptr<std::byte, FreeBytes> staging_;
  std::uint64_t staging_size_ = 0;
};

}  // namespace zinf::prefetch
