// SPDX-License-Identifier: Apache-2.0
// GradientStage: where OffloadEngine's staged step mode keeps a step's gradients between
// set_gradients and step(), with each layer's sum of squares and whether any element is inf or
// NaN, so that step() can clip by the global norm and skip on overflow before any update runs.
// Gradients are held as fp32 whatever dtype they arrive in (bf16 and fp16 widen exactly, so
// the update is bitwise what the original dtype gives): in pinned host memory for the whole
// model, or, when the pinned budget cannot hold that, on NVMe through a swap store with a ring
// of two pinned buffers of the largest layer. Private to zinf::offload.
#pragma once

#include <cstdint>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "zinf/adam/cpu_adam.h"
#include "zinf/common/status.h"
#include "zinf/swap/buffer_pool.h"
#include "zinf/swap/io_engine.h"
#include "zinf/swap/swap_store.h"

namespace zinf::offload::detail {

/// Bytes a staged element takes: gradients are staged as fp32.
inline constexpr std::uint64_t kStagedBytesPerElement = 4;
/// Buffers of the NVMe staging ring: one being filled (or read back) while the other's
/// layer is written (or updated by the optimizer).
inline constexpr std::uint32_t kStageRingSlots = 2;

/// One layer to stage: its name (the swap key) and element count (> 0).
struct StagedLayer {
  std::string name;
  std::uint64_t numel = 0;
};

/// How a GradientStage is built.
struct GradStageOptions {
  std::vector<StagedLayer> layers;
  /// false: every layer's gradients in pinned host memory. true: on NVMe in `directories`.
  bool nvme = false;
  std::vector<std::string> directories;  ///< nvme: one swap file each
  swap::IoOptions io;                    ///< nvme: the store's I/O engine
  bool checksums = true;                 ///< nvme: CRC32C per stripe (SwapStoreOptions)
  bool direct_io = true;
};

/// Pinned bytes of staging every layer in host memory (each layer 4 KiB-aligned).
std::uint64_t grad_stage_pinned_bytes(const std::vector<StagedLayer>& layers);
/// Pinned bytes of the NVMe staging ring: kStageRingSlots buffers of the largest layer, padded
/// to the directories' direct-I/O alignment (probed: creates no lasting file).
std::uint64_t grad_stage_ring_bytes(const std::vector<StagedLayer>& layers,
                                    const std::vector<std::string>& directories);

/// One step's staged gradients. Called from one thread (the engine's controlling thread).
///
/// Per step: stage() each layer at most once (the engine checks), then either replay() them
/// into the optimizer or drop them, then clear(). The sums do not depend on the order layers
/// arrive in: each layer's sum of squares is accumulated in double in a fixed order of its
/// elements, and sum_of_squares() adds the layers in index order.
///
/// Failures (nvme): a failed staging write is kept and reported by flush() (and replay(),
/// which flushes first) before any layer is handed out (IoError naming key, file, offset, length), so the step can be abandoned with
/// nothing updated; a failed read-back during replay() throws that read's IoError, after
/// earlier layers were handed out.
class GradientStage {
 public:
  /// Reserves the pinned memory, and (nvme) creates the swap store: IoError kNoSpace naming a
  /// directory too small, IoError for other setup failures.
  explicit GradientStage(GradStageOptions options);
  ~GradientStage();
  GradientStage(const GradientStage&) = delete;
  GradientStage& operator=(const GradientStage&) = delete;

  /// Copies `grads` (the layer's numel elements of any dtype, host memory) as fp32 into the
  /// layer's staging while summing their squares; the caller's buffer is free again when this
  /// returns. nvme: the copy goes into a ring buffer whose write to the store starts at once;
  /// blocks only while that buffer's previous write is in flight. Does not throw for I/O (see
  /// Failures).
  void stage(std::size_t layer, adam::GradView grads);
  bool staged(std::size_t layer) const { return layers_[layer].staged; }
  /// The sum of squares of every staged element, layers added in index order; +inf or NaN if
  /// any staged element is (a finite fp32's square cannot overflow a double, nor can their
  /// sum over any model).
  double sum_of_squares() const;
  /// True if a staged element is inf or NaN.
  bool overflow() const;

  /// nvme: waits for the staging writes in flight and throws the first failed one's IoError
  /// (the step's gradients are then incomplete). Pinned: nothing to wait for.
  void flush();
  /// Hands each staged layer's fp32 gradients to `use(layer, view, consumed)` in index order.
  /// `use` must arrange for `consumed` to be called, once, from any thread, when the view is no
  /// longer read (GradHooks::consumed does), or throw without calling it. With pinned staging
  /// the views stay valid until clear() anyway. With nvme staging a view lives in a ring
  /// buffer, refilled for a later layer only after its `consumed` has run (replay blocks
  /// until then). Call clear() only once every `consumed` has run. Throws as described under
  /// Failures.
  void replay(const std::function<void(std::size_t, adam::GradView, std::function<void()>)>& use);
  /// Forgets the step's gradients (waits for staging writes still in flight).
  void clear();

  bool on_nvme() const noexcept { return store_ != nullptr; }
  std::uint64_t pinned_bytes() const noexcept;
  std::uint64_t bytes_written() const noexcept { return bytes_written_; }  ///< nvme, padded
  std::uint64_t bytes_read() const noexcept { return bytes_read_; }        ///< nvme, padded

 private:
  struct Layer {
    StagedLayer spec;
    bool staged = false;
    double sum_sq = 0;
    swap::BufferLease pinned;  // pinned staging: the layer's buffer
  };
  struct Slot {
    swap::BufferLease buffer;
    swap::IoTicket write;
    bool busy = false;  // handed out by replay, not consumed yet (guarded by mu_)
  };
  void wait_writes();

  std::unique_ptr<swap::BufferPool> pool_;  // before the leases below: outlives them
  std::vector<Layer> layers_;
  // nvme: destroyed store, then engine (the store's I/O runs on the engine).
  std::unique_ptr<swap::IoEngine> engine_;
  std::unique_ptr<swap::SwapStore> store_;
  std::vector<Slot> ring_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::size_t next_slot_ = 0;
  Status write_error_;  // the first failed staging write of this step
  std::uint64_t bytes_written_ = 0;
  std::uint64_t bytes_read_ = 0;
};

}  // namespace zinf::offload::detail
