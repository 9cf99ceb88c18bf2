// SPDX-License-Identifier: Apache-2.0
// The sharded engine wraps one OffloadEngine per rank over the rank's slices: the engine's
// tiers, prefetcher, staging and checkpoints are used as they are, and only the staged step's
// verdict reaches inside it, through engine_seams.h. The collectives, the padding, the rank<R>
// folders and the checkpoint manifests are zinf::dist's, shared with ShardedOptimizer
// (shard_common.h).
#include "zinf/dist/sharded_engine.h"

#include "shard_common.h"

#include <algorithm>
#include <bit>
#include <cmath>
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

// One full layer being fetched: its device buffer, and the host buffer the all-gather fills
// (kept until the next fetch into this slot waits for the compute stream, which has then
// finished the copy out of it).
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
    case DType::kF32: std::memcpy(out.data(), grads.data, grads.size * sizeof(float)); return;
    case DType::kBF16: {
      const auto* in = static_cast<const std::uint16_t*>(grads.data);
      for (std::size_t i = 0; i < grads.size; ++i) {
        out[i] = std::bit_cast<float>(static_cast<std::uint32_t>(in[i]) << 16);
      }
      return;
    }
    case DType::kF16: {
      const auto* in = static_cast<const std::uint16_t*>(grads.data);
      for (std::size_t i = 0; i < grads.size; ++i) {
        out[i] = static_cast<float>(std::bit_cast<Half>(in[i]));
      }
      return;
    }
  }
  throw UsageError("ShardedEngine::set_gradients: unknown gradient dtype");
}

}  // namespace

struct ShardedEngine::Impl {
  Collectives& comm;
  cuda::Device& device;
  cuda::StreamRef compute;
  std::vector<offload::LayerSpec> layers;  // full sizes
  std::vector<std::uint64_t> shard;        // elements per rank, per layer
  std::unique_ptr<offload::OffloadEngine> local;
  bool staged = false;
  // on_arrival: each layer's averaged slice, read by the update until step(); staged: one
  // slice at a time (the engine copies it into its staging at once).
  std::vector<std::vector<float>> shard_grads;
  std::vector<bool> has_grads;  // this step's set_gradients so far, per layer
  std::vector<float> padded;    // one full padded layer of fp32 at a time
  std::vector<std::byte> host_slice;
  std::vector<FetchSlot> slots;
  std::vector<bool> fetched_alone;  // one rank: layers fetched straight from the engine
  // Set by the staged step's reducer once this rank has entered the step's all-reduce.
  bool reduced_this_step = false;

  Impl(Collectives& c, cuda::Device& d, cuda::StreamRef s) : comm(c), device(d), compute(s) {}
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
  if (comm.memory() != MemoryKind::kHost) {
    throw UsageError("ShardedEngine: the collectives '" + std::string(comm.name()) +
                     "' work on device memory; the sharded engine all-gathers through host "
                     "memory");
  }
  s.layers = std::move(layers);
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
    if (!dir.empty() && comm.size() > 1) dir = rank_directory(dir, comm.rank());
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
  s.padded.resize(largest);
  if (comm.size() > 1 && s.staged) {
    offload::set_sum_of_squares_reducer(*s.local, [&s](double local_sum) {
      s.reduced_this_step = true;  // before the call: a failed all-reduce must not be retried
      double sum = local_sum;
      all_reduce<double>(s.comm, std::span<double>(&sum, 1), ReduceOp::kSum);
      return sum;
    });
  }
}

ShardedEngine::~ShardedEngine() = default;

int ShardedEngine::rank() const noexcept { return impl_->comm.rank(); }
int ShardedEngine::world_size() const noexcept { return impl_->comm.size(); }
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
  detail::on_every_rank(s.comm, "ShardedEngine::set_master_weights", [&] {
    std::vector<float> slice(s.shard[layer]);
    detail::copy_slice(weights, s.comm.rank(), slice);
    s.local->set_master_weights(layer, slice);
  });
}

void ShardedEngine::read_master_weights(std::size_t layer, std::span<float> out) {
  Impl& s = *impl_;
  s.at(layer, "read_master_weights");
  s.check_size(layer, out.size(), "read_master_weights");
  std::vector<float> slice(s.shard[layer]);
  detail::on_every_rank(s.comm, "ShardedEngine::read_master_weights",
                        [&] { s.local->read_master_weights(layer, slice); });
  const std::span<float> full(s.padded.data(), s.padded_numel(layer));
  all_gather<float>(s.comm, slice, full);
  std::copy_n(full.begin(), out.size(), out.begin());
}

cuda::DeviceSpan ShardedEngine::fetch(std::size_t layer) {
  Impl& s = *impl_;
  const offload::LayerSpec& spec = s.at(layer, "fetch");
  bool fetched = s.fetched_alone[layer];
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
  const std::size_t elem = dtype_size(spec.param_dtype);
  const std::size_t slice_bytes = s.shard[layer] * elem;
  const std::size_t full_bytes = s.padded_numel(layer) * elem;
  // This rank's slice reaches the host after the compute stream's earlier work (the
  // collectives read host memory); a failed read is this rank's, told to every rank.
  s.host_slice.resize(slice_bytes);
  fetched = false;
  try {
    detail::on_every_rank(s.comm, "ShardedEngine::fetch", [&] {
      const cuda::DeviceSpan own = s.local->fetch(layer);
      fetched = true;
      s.device.copy_to_host(s.compute, s.host_slice, own);
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
  slot->host.resize(full_bytes);
  s.comm.all_gather(s.host_slice, slot->host);
  const cuda::DeviceSpan full = slot->device.span(0, spec.numel * elem);
  s.device.copy_to_device(s.compute, full, std::span(slot->host).first(spec.numel * elem));
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
  for (FetchSlot& f : s.slots) {
    if (f.layer == layer) {
      f.layer.reset();
      s.local->release(layer);
      return;
    }
  }
  throw UsageError("ShardedEngine::release: layer '" + s.layers[layer].name + "' is not fetched");
}

void ShardedEngine::set_gradients(std::size_t layer, adam::GradView grads) {
  Impl& s = *impl_;
  s.at(layer, "set_gradients");
  s.check_size(layer, grads.size, "set_gradients");
  if (s.has_grads[layer]) {
    throw UsageError("ShardedEngine::set_gradients: layer '" + s.layers[layer].name +
                     "' already has gradients for this step");
  }
  if (grads.data == nullptr) {
    throw UsageError("ShardedEngine::set_gradients: null gradients for layer '" +
                     s.layers[layer].name + "'");
  }
  const std::uint64_t n = s.layers[layer].numel;
  const std::span<float> full(s.padded.data(), s.padded_numel(layer));
  widen(grads, full.first(n));
  std::fill(full.begin() + static_cast<std::ptrdiff_t>(n), full.end(), 0.0f);
  std::vector<float>& slice = s.shard_grads[s.staged ? 0 : layer];
  slice.resize(s.shard[layer]);
  reduce_scatter<float>(s.comm, full, slice, ReduceOp::kAvg);
  s.has_grads[layer] = true;  // the update may read the slice from here on (on_arrival)
  s.local->set_gradients(layer, adam::GradView::f32(slice));
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
      all_reduce<double>(s.comm, std::span<double>(&nan, 1), ReduceOp::kSum);
    } catch (...) {
      mine = std::current_exception();
    }
  }
  detail::all_reduce_failures(s.comm, "ShardedEngine::step", mine);
  return stats;
}

double ShardedEngine::loss_scale() const noexcept { return impl_->local->loss_scale(); }
offload::StepMode ShardedEngine::step_mode() const noexcept { return impl_->local->step_mode(); }

void ShardedEngine::set_hyper(const adam::AdamParams& hyper) { impl_->local->set_hyper(hyper); }

void ShardedEngine::set_hyper(std::size_t layer, const adam::AdamParams& hyper) {
  impl_->local->set_hyper(layer, hyper);
}

void ShardedEngine::save(const std::string& dir) {
  detail::save_sharded(impl_->comm, "ShardedEngine::save", dir,
                       detail::manifest_of("zinf-sharded-engine 1", "layer", impl_->layers),
                       [this](const std::string& mine) { impl_->local->save(mine); });
}

void ShardedEngine::load(const std::string& dir) {
  detail::load_sharded(impl_->comm, "ShardedEngine::load", dir,
                       detail::manifest_of("zinf-sharded-engine 1", "layer", impl_->layers),
                       [this](const std::string& mine) { impl_->local->load(mine); });
}

offload::OffloadEngine& ShardedEngine::local() noexcept { return *impl_->local; }
offload::EngineStats ShardedEngine::stats() const { return impl_->local->stats(); }

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
