// SPDX-License-Identifier: Apache-2.0
// ActivationStore: activations saved in forward leave the device for pinned host memory or
// NVMe, and come back in backward, read ahead in reverse order. Part of zinf::offload.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "zinf/cuda/device.h"
#include "zinf/swap/io_engine.h"

namespace zinf::offload {

/// Where saved activations wait for backward.
enum class ActivationTier : std::uint8_t {
  kCpu,   ///< in pinned host memory (the budget holds them all)
  kNvme,  ///< in swap files; pinned memory only stages them on the way out and back
};

struct ActivationStoreOptions {
  ActivationTier tier = ActivationTier::kCpu;
  /// kNvme: one swap file per directory (normally one per drive), created without a name.
  std::vector<std::string> directories;
  /// kNvme: the most bytes of activations held on NVMe at once (the swap files' size,
  /// preallocated and checked against the free space at construction).
  std::uint64_t capacity_bytes = 0;
  /// Pinned host memory, reserved at construction: kCpu holds the saved tensors in it (a save
  /// that does not fit is an error, see save()); kNvme stages each tensor through it on its
  /// way to the drive and back (a save waits for a write-back to free room). At least the
  /// largest tensor, padded to 4096 bytes.
  std::uint64_t pinned_budget_bytes = 256ull << 20;
  /// kNvme: tensors read back ahead of backward: after load(h), the `prefetch_depth` tensors
  /// saved just before h (the next ones backward needs) are read into staging if it has room.
  /// 0 reads each tensor when it is loaded.
  std::size_t prefetch_depth = 2;
  /// kNvme: the I/O engine (io_uring or threads) and its settings.
  swap::IoOptions io;
  /// kNvme: CRC32C per stripe unit, verified when a tensor is read back (see SwapStore).
  bool checksums = true;
};

/// Counters since construction.
struct ActivationStats {
  std::uint64_t saved = 0;         ///< save() calls
  std::uint64_t loaded = 0;        ///< load() calls that returned
  std::uint64_t bytes_saved = 0;   ///< tensor bytes saved
  std::uint64_t bytes_written = 0; ///< kNvme: bytes written to the drive (padded)
  std::uint64_t bytes_read = 0;    ///< kNvme: bytes read back (padded)
  /// kNvme: loads whose tensor was still in staging (its write-back not over) or already read
  /// ahead, and loads that had to read it themselves.
  std::uint64_t hits = 0;
  std::uint64_t on_demand = 0;
  std::uint64_t held_tensors = 0;     ///< tensors saved and not yet loaded, now
  std::uint64_t held_bytes = 0;       ///< their bytes, now
  std::uint64_t pinned_bytes_peak = 0;  ///< the most pinned memory in use at once
};

/// Activations out of device memory in forward and back in backward.
///
/// Use: in forward, `h = save(name, tensor, stream)` after the work that produces the tensor
/// was enqueued on `stream`, and `wait_saved(h, stream)` before the tensor's memory may be
/// reused by later work on that stream; in backward, `load(h, dst, stream)` gives the bytes
/// back in `dst`, ordered before the work enqueued on `stream` afterwards. Each tensor is
/// loaded once and its memory (pinned, NVMe) freed after that copy.
///
/// Copies run on the store's own stream, so they overlap the trainer's compute: save()
/// makes that stream wait for the trainer's stream, copies device -> pinned, and (kNvme)
/// hands the bytes to the swap store on a host function of that stream; load() makes the
/// copy stream wait for the trainer's stream, copies pinned -> device, and makes the trainer's
/// stream wait for the copy. kNvme reads back in reverse save order ahead of the loads.
///
/// Blocking: save() blocks (kNvme) while staging is full until a write-back frees room;
/// load() blocks while its tensor's read (ahead or on demand) is in flight. Neither waits for
/// device work.
///
/// Errors. A failed write-back or read surfaces at the load() of that tensor as the swap
/// store's IoError (the key is "<name>#<handle>": it names the tensor, the file, offset,
/// length and errno, or both CRCs for corruption); the tensor is then gone. A failed copy
/// surfaces at the next call that waits on it, as DeviceError. Misuse (an unknown or
/// already-loaded handle, sizes that differ, an empty tensor, a kCpu budget too small for the
/// tensors held) throws UsageError naming the tensor, before anything is enqueued.
///
/// Threads: one thread (the trainer's) calls save/load/wait_saved/clear; stats() may be
/// called from any thread. The Device must outlive the store; the destructor waits for the
/// copies and I/O in flight.
class ActivationStore {
 public:
  using Handle = std::uint64_t;

  /// Reserves the pinned budget (registered with `device` for asynchronous copies) and, for
  /// kNvme, creates the swap files. Throws UsageError for bad options (kNvme without
  /// directories or capacity, a zero budget) and IoError for a directory that cannot be used
  /// or lacks room (from SwapStore).
  ActivationStore(cuda::Device& device, ActivationStoreOptions options);
  ~ActivationStore();
  ActivationStore(const ActivationStore&) = delete;
  ActivationStore& operator=(const ActivationStore&) = delete;

  /// Saves the bytes of `src` as they are once the work enqueued on `stream` so far is done.
  /// `name` (not empty) names the tensor in errors. Returns its handle (increasing with each
  /// save). `src` must not change until wait_saved(handle, s) has been called for the stream
  /// s that may change it.
  Handle save(const std::string& name, cuda::DeviceSpan src, cuda::StreamRef stream);
  /// Makes `stream` wait (on the device, not the host) until the copy out of the tensor's
  /// source is done. UsageError for a handle not held.
  void wait_saved(Handle handle, cuda::StreamRef stream);
  /// Copies the tensor into `dst` (the same size), ordered after the work enqueued on `stream`
  /// so far and before the work enqueued on it afterwards; then forgets it.
  void load(Handle handle, cuda::DeviceSpan dst, cuda::StreamRef stream);
  /// Forgets every tensor not loaded (an iteration cut short), after the copies and I/O in
  /// flight end. Failures of those are dropped with them.
  void clear();

  ActivationStats stats() const;
  ActivationTier tier() const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zinf::offload
