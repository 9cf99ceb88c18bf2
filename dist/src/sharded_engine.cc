// SPDX-License-Identifier: Apache-2.0
// The sharded engine wraps one OffloadEngine per rank over the rank's slices: the engine's
// tiers, prefetcher, staging and checkpoints are used as they are, and only the staged step's
// verdict reaches inside it, through engine_seams.h. The collectives, the padding, the rank<R>
// folders and the checkpoint manifests are zinf::dist's, shared with ShardedOptimizer
// (shard_common.h).
#include "zinf/dist/sharded_engine.h"

#include "host_staging.h"
#include "shard_common.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <limits>
#include <optional>
#include <utility>

#include "zinf/common/error.h"
#include "zinf/common/log.h"
#include "zinf/dist/testing.h"
#include "zinf/offload/engine_seams.h"
#include "zinf/offload/testing.h"

namespace zinf::dist {
namespace {

// One full layer being fetched: its device buffer, and, with a host-memory backend, the host
// buffer the all-gather fills (kept until the next fetch into this slot waits for the compute
// stream, which has then finished the copy out of it). A device-memory backend all-gathers
// into the device buffer itself.
struct FetchSlot {
  cuda::DeviceBuffer device;
  std::vector<std::byte> host;
  std::optional<std::size_t> layer;
};

// The compiler's IEEE half type: GCC 12 has no C++ _Float16 on aarch64, whose __fp16 is the same
// IEEE binary16 (the aarch64 cross build caught it).
#if defined(__aarch64__)
using Half = __fp16;
#else
using Half = _Float16;
#endif

// Widens `grads` to fp32 into `out` (the same size). bf16 is the top half of an fp32, and fp16
// widens exactly through the compiler's IEEE half type.
void widen(adam::GradView grads, std::span<float> out) {
  switch (grads.dtype) {
    case ElementType::kF32: std::memcpy(out.data(), grads.data, grads.size * sizeof(float)); return;
    case ElementType::kBF16: {
      const auto* in = static_cast<const std::uint16_t*>(grads.data);
      for (std::size_t i = 0; i < grads.size; ++i) {
        out[i] = std::bit_cast<float>(static_cast<std::uint32_t>(in[i]) << 16);
      }
      return;
    }
    case ElementType::kF16: {
      const auto* in = static_cast<const std::uint16_t*>(grads.data);
      for (std::size_t i = 0; i < grads.size; ++i) {
        out[i] = static_cast<float>(std::bit_cast<Half>(in[i]));
      }
      return;
    }
    default: break;
  }
  throw UsageError("ShardedEngine::set_gradients: unknown gradient dtype");
}

}  // namespace

struct ShardedEngine::Impl {
  Collectives& comm;
  cuda::Device& device;
  cuda::StreamRef compute;
  // Every collective on host data (gradients, master weights, failure flags, the norm,
  // checkpoints) goes through `host`, staged through device memory where `comm` wants it; only
  // fetch's all-gather calls `comm` itself. The staging copies have a stream of their own, so
  // that set_gradients does not wait for the compute stream's queue (the backward still
  // running); empty with a host-memory backend.
  cuda::Stream staging;
  detail::HostStaging host;
  std::vector<offload::LayerSpec> layers;  // full sizes
  std::vector<std::uint64_t> shard;        // elements per rank, per layer
  // zero_optimization.stage: 3 partitions the parameters (fetch all-gathers a layer); 1 and 2
  // keep every layer whole on every rank (`whole`), refreshed by one all-gather per step.
  int stage = 3;
  // Stages 1 and 2 on several ranks: each layer's full parameters, padded to a multiple of the
  // world size (so that a device-memory backend all-gathers into it in place), in device
  // memory of the engine. fetch hands them out as they are.
  std::vector<cuda::DeviceBuffer> whole;
  std::vector<bool> fetched_whole;
  std::vector<std::byte> host_full;  // a host-memory backend's all-gather of one layer
  // The gradient and parameter collectives since the last step (StepStats' counts), and the
  // last step's, which stats() reports in its last_step.
  detail::CollectiveTally tally;
  offload::StepStats last_collectives;
  // Declared before `local`, so destroyed after it: an empty rank folder goes once the
  // engine's swap files are gone.
  detail::RankFolders rank_folders;
  std::unique_ptr<offload::OffloadEngine> local;
  bool staged = false;
  // on_arrival: each layer's averaged slice, read by the update until step(); staged: one
  // slice at a time (the engine copies it into its staging at once).
  std::vector<std::vector<float>> shard_grads;
  std::vector<bool> has_grads;  // this step's set_gradients so far, per layer
  std::vector<float> padded;    // one full padded layer of fp32 at a time
  std::vector<std::byte> host_slice;
  // Device gradients: their host copy where they take the host path (a host-memory backend,
  // bf16/fp16, a padded layer), and the device block a device-memory backend's reduce-scatter
  // writes this rank's averaged slice into (grown to the largest slice).
  std::vector<std::byte> grads_host;
  cuda::DeviceBuffer slice_device;
  std::vector<FetchSlot> slots;
  std::vector<bool> fetched_alone;  // one rank: layers fetched straight from the engine
  // Set by the staged step's reducer once this rank has entered the step's all-reduce.
  bool reduced_this_step = false;

  Impl(Collectives& c, cuda::Device& d, cuda::StreamRef s)
      : comm(c),
        device(d),
        compute(s),
        staging(c.memory() == MemoryKind::kDevice ? d.create_stream() : cuda::Stream()),
        host(c, d, staging) {}
  // The compute stream may still be copying a fetched layer out of a slot's host buffer (or
  // reading its device buffer): they are freed only once it is done.
  ~Impl() {
    if (slots.empty()) return;
    try {
      device.synchronize(compute);
    } catch (const std::exception& e) {
      log(LogLevel::kDebug, std::string("ShardedEngine: closing: ") + e.what());
    }
  }

  std::uint64_t padded_numel(std::size_t l) const {
    return shard[l] * static_cast<std::uint64_t>(comm.size());
  }
  const offload::LayerSpec& at(std::size_t l, const char* op) const {
    if (l >= layers.size()) {
      throw UsageError(std::string("ShardedEngine::") + op + ": layer " + std::to_string(l) +
                       " out of range (" + std::to_string(layers.size()) + " layers)");
    }
    return layers[l];
  }
  void check_no_grads(std::size_t l) const {
    if (has_grads[l]) {
      throw UsageError("ShardedEngine::set_gradients: layer '" + layers[l].name +
                       "' already has gradients for this step");
    }
  }
  // Widens and pads `grads` (host memory, numel elements), averages them over the ranks and
  // hands this rank's slice to its engine.
  void average_host_grads(std::size_t l, adam::GradView grads);
  // Where layer l's averaged slice goes (sized), then handing it to the rank's engine: the
  // last part of either set_gradients path.
  std::span<float> grad_slice(std::size_t l) {
    std::vector<float>& slice = shard_grads[staged ? 0 : l];
    slice.resize(shard[l]);
    return slice;
  }
  void hand_over(std::size_t l, std::span<const float> slice) {
    has_grads[l] = true;  // the update may read the slice from here on (on_arrival)
    local->set_gradients(l, adam::GradView::f32(slice));
  }
  void reshard(const std::string& dir, int saved_world,
               const std::vector<detail::SavedRank>& folders);
  bool keeps_whole() const noexcept { return !whole.empty(); }
  // Stages 1 and 2: all-gathers every rank's low-precision slice of layer l (its engine's
  // parameters, as fetch reads them) into whole[l]. Collective; `what` names the operation in
  // a rank's failure. Counted in `tally` if `count`.
  void refresh_whole(std::size_t l, std::string_view what, bool count);
  void check_size(std::size_t l, std::size_t got, const char* op) const {
    if (got != layers[l].numel) {
      throw UsageError(std::string("ShardedEngine::") + op + ": layer '" + layers[l].name +
                       "' has " + std::to_string(layers[l].numel) + " elements, got " +
                       std::to_string(got) + " (rank " + std::to_string(comm.rank()) + ")");
    }
  }
};

ShardedEngine::ShardedEngine(offload::EngineConfig config, std::vector<offload::LayerSpec> layers,
                             cuda::Device& device, cuda::StreamRef compute_stream,
                             Collectives& comm)
    : ShardedEngine(std::move(config), std::move(layers), device, compute_stream, comm, nullptr) {}

ShardedEngine::ShardedEngine(offload::EngineConfig config, std::vector<offload::LayerSpec> layers,
                             cuda::Device& device, cuda::StreamRef compute_stream,
                             Collectives& comm, const offload::test_hooks::EngineFaults* faults)
    : impl_(std::make_unique<Impl>(comm, device, compute_stream)) {
  Impl& s = *impl_;
  s.layers = std::move(layers);
  s.stage = config.zero_stage;
  if (comm.size() > 1 && s.stage == 0) {
    // Plain data parallelism (every rank its whole optimizer state) is not built: say so
    // rather than partition anyway.
    throw UsageError("ShardedEngine: zero_optimization.stage 0 on " + std::to_string(comm.size()) +
                     " ranks: plain data parallelism is not offered; set zero_optimization.stage "
                     "to 1 or 2 (each rank keeps 1/N of the optimizer state) or 3 (and of the "
                     "parameters)");
  }
  if (comm.size() > 1 && s.stage < 3 &&
      config.offload_param.device != offload::OffloadDevice::kNone) {
    // parse_config refuses this too; a config built in code reaches here.
    throw UsageError("ShardedEngine: zero_optimization.offload_param (\"" +
                     std::string(offload::offload_device_name(config.offload_param.device)) +
                     "\") needs zero_optimization.stage 3, but stage is " +
                     std::to_string(s.stage));
  }
  std::vector<offload::LayerSpec> mine;
  std::uint64_t largest = 0;
  for (const auto& l : s.layers) {
    s.shard.push_back(detail::shard_numel(l.numel, comm.size()));
    offload::LayerSpec spec = l;
    spec.numel = s.shard.back();
    mine.push_back(std::move(spec));
    largest = std::max(largest, s.shard.back() * static_cast<std::uint64_t>(comm.size()));
  }
  // This rank's files in rank<R> under every NVMe directory the config names; one rank keeps
  // the directories as they are, as the plain engine does.
  auto into_rank = [&](std::string& dir) {
    if (!dir.empty() && comm.size() > 1) dir = s.rank_folders.add(dir, comm.rank());
  };
  into_rank(config.offload_param.nvme_path);
  into_rank(config.offload_optimizer.nvme_path);
  for (auto& d : config.zinf.nvme_paths) into_rank(d);
  s.local = faults ? offload::test_hooks::make_engine_with_faults(
                         std::move(config), std::move(mine), device, compute_stream, *faults)
                   : std::make_unique<offload::OffloadEngine>(std::move(config), std::move(mine),
                                                              device, compute_stream);
  s.staged = s.local->step_mode() == offload::StepMode::kStaged;
  s.shard_grads.resize(s.staged ? 1 : s.layers.size());
  s.has_grads.assign(s.layers.size(), false);
  s.fetched_alone.assign(s.layers.size(), false);
  s.fetched_whole.assign(s.layers.size(), false);
  s.padded.resize(largest);
  if (comm.size() > 1 && s.stage < 3) {
    // Written by set_master_weights or load, as the engine's parameters are.
    for (std::size_t l = 0; l < s.layers.size(); ++l) {
      s.whole.push_back(device.allocate(s.padded_numel(l) * element_size(s.layers[l].param_dtype)));
    }
  }
  if (comm.size() > 1 && s.staged) {
    offload::set_sum_of_squares_reducer(*s.local, [&s](double local_sum) {
      s.reduced_this_step = true;  // before the call: a failed all-reduce must not be retried
      double sum = local_sum;
      all_reduce<double>(s.host, std::span<double>(&sum, 1), ReduceOp::kSum);
      return sum;
    });
  }
}

ShardedEngine::~ShardedEngine() = default;

int ShardedEngine::rank() const noexcept { return impl_->comm.rank(); }
int ShardedEngine::world_size() const noexcept { return impl_->comm.size(); }
int ShardedEngine::zero_stage() const noexcept { return impl_->stage; }
std::size_t ShardedEngine::layer_count() const noexcept { return impl_->layers.size(); }

const offload::LayerSpec& ShardedEngine::layer(std::size_t index) const {
  return impl_->at(index, "layer");
}

std::uint64_t ShardedEngine::shard_numel(std::size_t layer) const {
  impl_->at(layer, "shard_numel");
  return impl_->shard[layer];
}

std::uint64_t ShardedEngine::shard_offset(std::size_t layer) const {
  impl_->at(layer, "shard_offset");
  return impl_->shard[layer] * static_cast<std::uint64_t>(impl_->comm.rank());
}

void ShardedEngine::set_master_weights(std::size_t layer, std::span<const float> weights) {
  Impl& s = *impl_;
  s.at(layer, "set_master_weights");
  s.check_size(layer, weights.size(), "set_master_weights");
  detail::on_every_rank(s.host, "ShardedEngine::set_master_weights", [&] {
    std::vector<float> slice(s.shard[layer]);
    detail::copy_slice(weights, s.comm.rank(), slice);
    s.local->set_master_weights(layer, slice);
  });
  if (s.keeps_whole()) s.refresh_whole(layer, "ShardedEngine::set_master_weights", false);
}

void ShardedEngine::read_master_weights(std::size_t layer, std::span<float> out) {
  Impl& s = *impl_;
  s.at(layer, "read_master_weights");
  s.check_size(layer, out.size(), "read_master_weights");
  std::vector<float> slice(s.shard[layer]);
  detail::on_every_rank(s.host, "ShardedEngine::read_master_weights",
                        [&] { s.local->read_master_weights(layer, slice); });
  const std::span<float> full(s.padded.data(), s.padded_numel(layer));
  all_gather<float>(s.host, slice, full);
  std::copy_n(full.begin(), out.size(), out.begin());
}

cuda::DeviceSpan ShardedEngine::fetch(std::size_t layer) {
  Impl& s = *impl_;
  const offload::LayerSpec& spec = s.at(layer, "fetch");
  bool fetched = s.fetched_alone[layer] || s.fetched_whole[layer];
  for (const FetchSlot& slot : s.slots) fetched = fetched || slot.layer == layer;
  if (fetched) {
    throw UsageError("ShardedEngine::fetch: layer '" + spec.name +
                     "' is already fetched (release it first)");
  }
  if (s.comm.size() == 1) {
    // One rank: the engine's own fetch, with no host round trip (the same bytes).
    const cuda::DeviceSpan own = s.local->fetch(layer);
    s.fetched_alone[layer] = true;
    return own;
  }
  if (s.keeps_whole()) {
    // Stages 1 and 2: the layer is whole here already (refreshed after the last step).
    s.fetched_whole[layer] = true;
    return s.whole[layer].span(0, spec.numel * element_size(spec.param_dtype));
  }
  const std::size_t elem = element_size(spec.param_dtype);
  const std::size_t slice_bytes = s.shard[layer] * elem;
  const std::size_t full_bytes = s.padded_numel(layer) * elem;
  // This rank's slice is read after the compute stream's earlier work, for which the host
  // waits: a host-memory backend gets a host copy of it, a device-memory one reads it where the
  // engine fetched it. A failed read is this rank's, told to every rank.
  const bool on_device = s.comm.memory() == MemoryKind::kDevice;
  if (!on_device) s.host_slice.resize(slice_bytes);
  cuda::DeviceSpan own;
  fetched = false;
  try {
    detail::on_every_rank(s.host, "ShardedEngine::fetch", [&] {
      own = s.local->fetch(layer);
      fetched = true;
      if (!on_device) s.device.copy_to_host(s.compute, s.host_slice, own);
      s.device.synchronize(s.compute);
    });
  } catch (...) {
    // Whichever rank failed, none keeps the layer: a retried fetch starts afresh everywhere.
    if (fetched) s.local->release(layer);
    throw;
  }
  FetchSlot* slot = nullptr;
  for (FetchSlot& f : s.slots) {
    if (!f.layer) slot = &f;
  }
  if (!slot) slot = &s.slots.emplace_back();
  // The compute stream is idle here (synchronized above), so the slot's earlier copy out of
  // its host buffer is over and its device buffer is no longer read.
  if (slot->device.size() < full_bytes) slot->device = s.device.allocate(full_bytes);
  const cuda::DeviceSpan full = slot->device.span(0, spec.numel * elem);
  if (on_device) {
    // Slice to full layer on the device, no host round trip. The backend returns once the
    // result is in place (on whichever stream it runs), so what the caller then enqueues on
    // the compute stream reads it.
    s.comm.all_gather(std::span<const std::byte>(own.data(), own.size()),
                      std::span(slot->device.data(), full_bytes));
  } else {
    slot->host.resize(full_bytes);
    s.comm.all_gather(s.host_slice, slot->host);
    s.device.copy_to_device(s.compute, full, std::span(slot->host).first(spec.numel * elem));
  }
  s.tally.gathered(full_bytes, s.comm.size());
  slot->layer = layer;
  return full;
}

void ShardedEngine::release(std::size_t layer) {
  Impl& s = *impl_;
  s.at(layer, "release");
  if (s.fetched_alone[layer]) {
    s.fetched_alone[layer] = false;
    s.local->release(layer);
    return;
  }
  if (s.fetched_whole[layer]) {
    s.fetched_whole[layer] = false;  // the next step's refresh waits for the compute stream
    return;
  }
  for (FetchSlot& f : s.slots) {
    if (f.layer == layer) {
      f.layer.reset();
      s.local->release(layer);
      return;
    }
  }
  throw UsageError("ShardedEngine::release: layer '" + s.layers[layer].name + "' is not fetched");
}

void ShardedEngine::Impl::average_host_grads(std::size_t l, adam::GradView grads) {
  const std::uint64_t n = layers[l].numel;
  const std::span<float> full(padded.data(), padded_numel(l));
  widen(grads, full.first(n));
  std::fill(full.begin() + static_cast<std::ptrdiff_t>(n), full.end(), 0.0f);
  const std::span<float> slice = grad_slice(l);
  detail::average_into_slice(host, stage, full, slice, tally);
  hand_over(l, slice);
}

void ShardedEngine::Impl::refresh_whole(std::size_t l, std::string_view what, bool count) {
  const offload::LayerSpec& spec = layers[l];
  const std::size_t elem = element_size(spec.param_dtype);
  const std::size_t slice_bytes = shard[l] * elem;
  const std::size_t full_bytes = padded_numel(l) * elem;
  const bool on_device = comm.memory() == MemoryKind::kDevice;
  // The compute stream may still read whole[l] (work enqueued before release) and is idle
  // once this rank's slice is on the host: the buffers are then free to overwrite.
  if (!on_device) host_slice.resize(slice_bytes);
  cuda::DeviceSpan own;
  bool fetched = false;
  try {
    detail::on_every_rank(host, what, [&] {
      own = local->fetch(l);
      fetched = true;
      if (!on_device) device.copy_to_host(compute, host_slice, own);
      device.synchronize(compute);
    });
  } catch (...) {
    if (fetched) local->release(l);
    throw;
  }
  if (on_device) {
    // In place on the device: the backend returns once the result is there.
    comm.all_gather(std::span<const std::byte>(own.data(), own.size()),
                    std::span(whole[l].data(), full_bytes));
    local->release(l);
  } else {
    local->release(l);
    host_full.resize(full_bytes);
    comm.all_gather(host_slice, host_full);
    device.copy_to_device(compute, whole[l].span(0, full_bytes), host_full);
    device.synchronize(compute);  // host_full is reused by the next layer
  }
  if (count) tally.gathered(full_bytes, comm.size());
}

void ShardedEngine::set_gradients(std::size_t layer, adam::GradView grads) {
  Impl& s = *impl_;
  s.at(layer, "set_gradients");
  check_buffer_type(grads.dtype, "ShardedEngine::set_gradients: gradients");
  s.check_size(layer, grads.size, "set_gradients");
  s.check_no_grads(layer);
  if (grads.data == nullptr) {
    throw UsageError("ShardedEngine::set_gradients: null gradients for layer '" +
                     s.layers[layer].name + "'");
  }
  s.average_host_grads(layer, grads);
}

void ShardedEngine::set_gradients(std::size_t layer, cuda::DeviceSpan grads, ElementType dtype) {
  Impl& s = *impl_;
  const offload::LayerSpec& spec = s.at(layer, "set_gradients");
  const std::string rank = " (rank " + std::to_string(s.comm.rank()) + ")";
  if (!is_buffer_type(dtype)) {
    throw UsageError("ShardedEngine::set_gradients: unknown gradient dtype for layer '" +
                     spec.name + "'" + rank);
  }
  if (grads.size() != spec.numel * element_size(dtype)) {
    throw UsageError("ShardedEngine::set_gradients: layer '" + spec.name + "' has " +
                     std::to_string(spec.numel) + " elements, got " + std::to_string(grads.size()) +
                     " bytes of " + std::string(element_type_name(dtype)) +
                     " gradients in device memory" + rank);
  }
  if (grads.device() != &s.device) {
    throw UsageError("ShardedEngine::set_gradients: layer '" + spec.name +
                     "': the gradients are not in the memory of device " +
                     std::string(s.device.name()) + rank);
  }
  s.check_no_grads(layer);
  // fp32 gradients of a layer that needs no padding are reduce-scattered where they are, by a
  // device-memory backend; anything else (a host-memory backend, bf16/fp16 to widen, padding
  // to add: zinf::cuda has no device-side copy or conversion) is copied to the host whole and
  // takes the host path.
  const std::size_t slice_bytes = s.shard[layer] * sizeof(float);
  // Stage 1 all-reduces the whole layer: the host path's.
  const bool in_place = s.comm.memory() == MemoryKind::kDevice && dtype == ElementType::kF32 &&
                        s.stage != 1 && s.padded_numel(layer) == spec.numel &&
                        reinterpret_cast<std::uintptr_t>(grads.data()) % alignof(float) == 0;
  // The gradients are read after the compute stream's work enqueued so far (which wrote them),
  // for which the host waits: the collective that follows blocks it anyway. A failed wait or
  // copy is this rank's, told to every rank before the reduce-scatter.
  detail::on_every_rank(s.host, "ShardedEngine::set_gradients", [&] {
    if (in_place) {
      if (s.slice_device.size() < slice_bytes) {
        s.slice_device.reset();
        s.slice_device = s.device.allocate(slice_bytes);
      }
    } else {
      s.grads_host.resize(grads.size());
      s.device.copy_to_host(s.compute, s.grads_host, grads);
    }
    s.device.synchronize(s.compute);
  });
  if (!in_place) {
    s.average_host_grads(layer, {s.grads_host.data(), static_cast<std::size_t>(spec.numel), dtype});
    return;
  }
  s.comm.reduce_scatter(std::span<const std::byte>(grads.data(), grads.size()),
                        std::span(s.slice_device.data(), slice_bytes), ElementType::kF32,
                        ReduceOp::kAvg);
  s.tally.scattered(grads.size(), s.comm.size());
  // Only this rank's slice of the average crosses to the host (the backend's call returned
  // with it in place).
  const std::span<float> slice = s.grad_slice(layer);
  s.device.copy_to_host(s.staging, std::as_writable_bytes(slice),
                        s.slice_device.span(0, slice_bytes));
  s.device.synchronize(s.staging);
  s.hand_over(layer, slice);
}

offload::StepStats ShardedEngine::step() {
  Impl& s = *impl_;
  s.reduced_this_step = false;
  std::fill(s.has_grads.begin(), s.has_grads.end(), false);
  std::exception_ptr mine;
  offload::StepStats stats;
  try {
    stats = s.local->step();
  } catch (...) {
    mine = std::current_exception();
  }
  // A staged step that failed on this rank before its norm's all-reduce: the other ranks wait
  // in that all-reduce, so this rank joins it with a NaN (they skip their step) and then tells
  // them below that it failed.
  if (mine && s.staged && s.comm.size() > 1 && !s.reduced_this_step) {
    double nan = std::numeric_limits<double>::quiet_NaN();
    try {
      all_reduce<double>(s.host, std::span<double>(&nan, 1), ReduceOp::kSum);
    } catch (...) {
      mine = std::current_exception();
    }
  }
  detail::all_reduce_failures(s.host, "ShardedEngine::step", mine);
  // Stages 1 and 2: the updated slices make every rank's layers whole again, once per step.
  // A skipped step (every rank's verdict is the same) changed nothing.
  if (s.keeps_whole() && !stats.skipped) {
    for (std::size_t l = 0; l < s.layers.size(); ++l) {
      s.refresh_whole(l, "ShardedEngine::step", true);
    }
  }
  s.tally.report(stats);
  s.last_collectives = stats;
  return stats;
}

double ShardedEngine::loss_scale() const noexcept { return impl_->local->loss_scale(); }
offload::StepMode ShardedEngine::step_mode() const noexcept { return impl_->local->step_mode(); }

void ShardedEngine::set_hyper(const adam::AdamParams& hyper) { impl_->local->set_hyper(hyper); }

void ShardedEngine::set_hyper(std::size_t layer, const adam::AdamParams& hyper) {
  impl_->local->set_hyper(layer, hyper);
}

void ShardedEngine::save(const std::string& dir) {
  detail::save_sharded(
      impl_->host, "ShardedEngine::save", dir,
      detail::manifest_of("zinf-sharded-engine 1", "layer", impl_->layers),
      offload::step_count(*impl_->local),
      [this](const swap::Dir& mine) {
        offload::save(*impl_->local, mine, optim::SupersededVersions::kKeep);
      },
      [this] { offload::remove_superseded_versions(*impl_->local); },
      {[this] { return offload::checkpoint_run(*impl_->local); },
       [this](const std::string& run) { offload::set_checkpoint_run(*impl_->local, run); }});
}

void ShardedEngine::load(const std::string& dir) {
  Impl& s = *impl_;
  const detail::ShardManifest manifest =
      detail::manifest_of("zinf-sharded-engine 1", "layer", s.layers);
  detail::load_sharded(
      s.host, "ShardedEngine::load", dir, manifest,
      [&s](const swap::Dir& mine) { s.local->load(mine); },
      [&s](const std::string& top, int saved_world,
           const std::vector<detail::SavedRank>& folders) {
        s.reshard(top, saved_world, folders);
      });
  // Stages 1 and 2: the loaded parameters, whichever stage saved them (the checkpoint holds
  // slices at every stage).
  if (s.keeps_whole()) {
    for (std::size_t l = 0; l < s.layers.size(); ++l) {
      s.refresh_whole(l, "ShardedEngine::load", false);
    }
  }
}

// Another world size's checkpoint: the optimizer state moves as the ShardedOptimizer's does
// (detail::reshard), each saved rank's engine checkpoint read as an optimizer over its slices;
// the low-precision parameters are written from the new masters, as OffloadEngine::load does,
// and the loss scale's state is saved rank 0's.
void ShardedEngine::Impl::reshard(const std::string& dir, int saved_world,
                                  const std::vector<detail::SavedRank>& folders) {
  constexpr std::string_view who = "ShardedEngine::load";
  detail::ReshardTarget t;
  for (const auto& l : layers) t.groups.push_back({l.name, l.numel, l.hyper});
  t.shard = shard;
  t.options = offload::optimizer_options(*local);
  t.extra = [this, who](const swap::Dir& folder) {
    return offload::saved_loss_scale(*local, folder, who);
  };
  t.progress = [this, &dir, who](std::uint64_t steps, std::span<const adam::AdamParams> hypers,
                                 const std::optional<std::string>& scale) {
    offload::set_step_count(*local, steps);
    local->set_hyper(hypers[0]);
    for (std::size_t l = 0; l < layers.size(); ++l) local->set_hyper(l, hypers[l + 1]);
    if (scale) offload::restore_loss_scale(*local, *scale, dir + "/rank0", who);
  };
  t.put = [this](std::size_t l, std::span<const float> p, std::span<const float> m,
                 std::span<const float> v) { offload::set_layer_state(*local, l, p, m, v); };
  t.run = [this](const std::string& run) { offload::set_checkpoint_run(*local, run); };
  detail::reshard(host, who, saved_world, folders, t);
}

offload::OffloadEngine& ShardedEngine::local() noexcept { return *impl_->local; }
offload::EngineStats ShardedEngine::stats() const {
  offload::EngineStats st = impl_->local->stats();
  st.last_step.allgather_bytes = impl_->last_collectives.allgather_bytes;
  st.last_step.reduce_scatter_bytes = impl_->last_collectives.reduce_scatter_bytes;
  st.last_step.all_reduce_bytes = impl_->last_collectives.all_reduce_bytes;
  return st;
}

}  // namespace zinf::dist

namespace zinf::dist::test_hooks {

class ShardedEngineAccess {
 public:
  static std::unique_ptr<ShardedEngine> make(offload::EngineConfig config,
                                             std::vector<offload::LayerSpec> layers,
                                             cuda::Device& device, cuda::StreamRef compute,
                                             Collectives& comm,
                                             const offload::test_hooks::EngineFaults& faults) {
    return std::unique_ptr<ShardedEngine>(
        new ShardedEngine(std::move(config), std::move(layers), device, compute, comm, &faults));
  }
};

std::unique_ptr<ShardedEngine> make_sharded_engine_with_faults(
    offload::EngineConfig config, std::vector<offload::LayerSpec> layers, cuda::Device& device,
    cuda::StreamRef compute_stream, Collectives& comm, offload::test_hooks::EngineFaults faults) {
  return ShardedEngineAccess::make(std::move(config), std::move(layers), device, compute_stream,
                                   comm, faults);
}

}  // namespace zinf::dist::test_hooks
