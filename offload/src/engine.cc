// SPDX-License-Identifier: Apache-2.0
// OffloadEngine: validation of a config against the layers (before any file exists), the three
// parameter tiers (resident device copies, pinned host copies with a bounded device pool, a
// swap store behind a LayerPrefetcher), the optimizer tiers through OffloadedOptimizer, the
// per-layer step with the copy-out into the parameter tier, checkpoints and statistics.
#include "zinf/offload/engine.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <limits>
#include <optional>
#include <sstream>
#include <unordered_set>
#include <utility>

#include "zinf/common/align.h"
#include "zinf/common/error.h"
#include "zinf/common/log.h"
#include "zinf/offload/testing.h"
#include "zinf/prefetch/layer_prefetcher.h"
#include "zinf/swap/buffer_pool.h"
#include "zinf/swap/dir.h"
#include "zinf/swap/file.h"
#include "zinf/swap/swap_store.h"

namespace zinf::offload {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::size_t kNoLayer = std::numeric_limits<std::size_t>::max();
constexpr std::uint64_t kHostAlign = 4096;
constexpr std::uint32_t kParamStripe = 1u << 20;
constexpr const char* kManifestName = "zinf-engine-layers";
constexpr const char* kManifestHeader = "zinf engine layers v1";
// A line per layer; far more than any model's table, small enough to read whole.
constexpr std::uint64_t kMaxLayerTableBytes = std::uint64_t{64} << 20;

std::uint64_t param_bytes(const LayerSpec& l) { return l.numel * 2; }
std::string in_quotes(const std::string& s) { return "'" + s + "'"; }

// "" + "/" + name would be a file at the root of the file system, not in a checkpoint.
void check_checkpoint_dir(const std::string& dir, const char* function) {
  if (dir.empty()) {
    throw UsageError(std::string(function) +
                     ": the checkpoint directory is empty (\"\"); give "
                     "a directory");
  }
}

std::string manifest_text(const std::vector<LayerSpec>& layers) {
  std::ostringstream os;
  os << kManifestHeader << "\n" << layers.size() << "\n";
  for (const auto& l : layers)
    os << l.numel << " " << dtype_name(l.param_dtype) << " " << l.name << "\n";
  return os.str();
}

}  // namespace

struct OffloadEngine::Impl {
  Impl(EngineConfig c, std::vector<LayerSpec> l, cuda::Device& d, cuda::StreamRef s,
       const test_hooks::EngineFaults& faults);
  ~Impl();

  // Per layer.
  struct Layer {
    std::vector<std::uint16_t> host;  // kNone: the host copy the step's copy-out writes
    swap::BufferLease pinned;         // kCpu: the pinned host copy
    cuda::DeviceBuffer resident;      // kNone: the device copy
    cuda::Event host_read;            // kNone/kCpu: the latest device copy from the host copy
    bool fetched = false;
    bool has_grads = false;
    bool master_set = false;
    std::uint64_t version = 0;      // kCpu: bumped whenever the host copy changes
    std::size_t buffer = kNoLayer;  // kCpu: the device buffer holding it while fetched
  };
  // kCpu: one device buffer of the bounded pool.
  struct DevBuf {
    cuda::DeviceBuffer buffer;
    cuda::Event released;          // recorded on the compute stream by release()
    std::size_t layer = kNoLayer;  // whose bytes it holds (valid if version matches)
    std::uint64_t version = 0;
    bool held = false;
    std::uint64_t last_use = 0;
  };

  void check_usable() const {
    if (failure) throw EngineFailed(*failure);
  }
  Layer& layer_at(std::size_t index, const char* op);
  void check_outside_step(const char* op) const;
  void fail(const Status& cause);
  // Writes `layer`'s low-precision copy from `masters` into its parameter tier. Blocks.
  void write_low_precision(std::size_t layer, std::span<const float> masters);
  cuda::DeviceSpan fetch_cpu(std::size_t layer);

  EngineConfig config;
  std::vector<LayerSpec> layers;
  cuda::Device& device;
  cuda::StreamRef compute;
  OffloadDevice ptier;
  OffloadDevice otier;
  std::uint64_t sub_group = 0;
  std::uint64_t param_pinned = 0;  // pinned bytes of the parameter tier (staging or copies)
  adam::CpuAdam convert;           // the kernel's own conversion for copies from the masters

  // The pool and its registration before the leases and buffers that use them (destroyed
  // after them).
  std::unique_ptr<swap::BufferPool> host_pool;  // kCpu
  cuda::PinnedRegistration host_pinned;
  std::vector<Layer> state;
  std::vector<DevBuf> pool;  // kCpu
  std::uint64_t use_clock = 0;

  // Declared so that destruction runs prefetcher, optimizer, store, engine: the optimizer's
  // copy-out writes go through the parameter store and its engine.
  std::unique_ptr<swap::IoEngine> param_engine;
  std::unique_ptr<swap::SwapStore> param_store;
  std::unique_ptr<OffloadedOptimizer> optimizer;
  std::unique_ptr<prefetch::LayerPrefetcher> prefetcher;

  bool step_open = false;
  std::vector<std::size_t> suspended;  // kNvme: layers whose key the open step rewrites
  std::optional<Status> failure;

  // Counters.
  std::uint64_t steps = 0;
  std::uint64_t param_written = 0;
  std::uint64_t param_to_device = 0;  // kNone/kCpu copies (kNvme: the prefetcher's)
  std::uint64_t opt_read = 0;
  std::uint64_t opt_written = 0;
  double opt_read_seconds = 0;
  double opt_write_seconds = 0;
  double host_stall_seconds = 0;  // kCpu: fetch blocked for a free device buffer
  double step_seconds = 0;
  StepStats last_step;
};

OffloadEngine::Impl::Impl(EngineConfig c, std::vector<LayerSpec> l, cuda::Device& d,
                          cuda::StreamRef s, const test_hooks::EngineFaults& faults)
    : config(std::move(c)),
      layers(std::move(l)),
      device(d),
      compute(s),
      ptier(config.offload_param.device),
      otier(config.offload_optimizer.device),
      convert(adam::CpuAdamOptions{1, std::nullopt}) {
  // ---- Validation: everything the config and the layers can contradict, before any file.
  check_config(config, "OffloadEngine");
  if (layers.empty()) throw UsageError("OffloadEngine: no layers");
  if (compute.empty() || compute.device() != &device) {
    throw UsageError("OffloadEngine: the compute stream must be a stream of device " +
                     std::string(device.name()));
  }
  std::unordered_set<std::string> names;
  for (const auto& layer : layers) {
    if (layer.name.empty() || layer.name.find_first_of(" \t\r\n#/") != std::string::npos) {
      throw UsageError(
          "OffloadEngine: layer names must be non-empty, without spaces, '#' or '/', got " +
          in_quotes(layer.name));
    }
    if (!names.insert(layer.name).second) {
      throw UsageError("OffloadEngine: duplicate layer name " + in_quotes(layer.name));
    }
    if (layer.numel == 0)
      throw UsageError("OffloadEngine: layer " + in_quotes(layer.name) + " has 0 elements");
    if (layer.param_dtype == DType::kF32) {
      throw UsageError("OffloadEngine: layer " + in_quotes(layer.name) +
                       " param_dtype must be bf16 or fp16");
    }
    if (ptier != OffloadDevice::kNone && layer.numel > config.offload_param.buffer_size) {
      throw UsageError(
          "OffloadEngine: layer " + in_quotes(layer.name) + " has " + std::to_string(layer.numel) +
          " elements, more than offload_param.buffer_size " +
          std::to_string(config.offload_param.buffer_size) +
          "; raise offload_param.buffer_size to at least " + std::to_string(layer.numel));
    }
  }
  if (ptier != OffloadDevice::kNone && config.offload_param.buffer_count == 0) {
    throw UsageError("OffloadEngine: offload_param.buffer_count must be at least 1");
  }
  const auto param_dirs = config.nvme_directories(config.offload_param.nvme_path);
  const auto opt_dirs = config.nvme_directories(config.offload_optimizer.nvme_path);

  // The sub-group size: with the nvme parameter tier each sub-group's copy-out is a range write
  // into the layer's key, so 2 x sub_group must be a multiple of the store's alignment (and of
  // its stripe with checksums): config.sub_group_size rounded up to that multiple.
  std::uint32_t param_align = static_cast<std::uint32_t>(kHostAlign);
  if (ptier == OffloadDevice::kNvme) {
    for (const auto& dir : param_dirs) {
      param_align = std::max(param_align, swap::probe_direct_io_alignment(dir));
    }
  }
  sub_group = std::max<std::uint64_t>(config.sub_group_size, 1);
  if (ptier == OffloadDevice::kNvme) {
    const std::uint64_t unit =
        config.zinf.checksums ? std::max<std::uint64_t>(kParamStripe, param_align) : param_align;
    const std::uint64_t rounded = align_up(sub_group * 2, unit) / 2;
    if (rounded != sub_group) {
      // Info, not notice: the default 1e9 is rounded on every run, by a few thousand elements.
      log(LogLevel::kInfo, "OffloadEngine: sub_group_size " + std::to_string(sub_group) +
                               " rounded up to " + std::to_string(rounded) +
                               " so that each sub-group's parameter copy-out is whole " +
                               std::to_string(unit) + "-byte units of the parameter store");
    }
    sub_group = rounded;
  }

  OptimizerOptions oo;
  oo.tier = otier == OffloadDevice::kNvme ? StateTier::kNvme : StateTier::kCpu;
  oo.sub_group_elements = sub_group;
  oo.pipeline_depth = config.offload_optimizer.buffer_count;
  oo.hyper = config.optimizer.hyper;
  oo.adam.threads = config.zinf.adam_threads;
  if (otier == OffloadDevice::kNvme) oo.directories = opt_dirs;
  oo.io = config.io_options();
  oo.io.faults = faults.optimizer;
  oo.swap_checksums = config.zinf.checksums;
  oo.direct_io = config.zinf.direct_io;
  oo.precondition = config.zinf.precondition;
  oo.store_copy_out = ptier == OffloadDevice::kNvme;
  std::vector<ParamGroupSpec> groups;
  for (const auto& layer : layers) groups.push_back({layer.name, layer.numel});

  // The pinned budget: the optimizer's ring (or state) plus the parameter tier's staging.
  std::uint64_t largest_padded = 0;
  std::uint64_t host_copies = 0;
  for (const auto& layer : layers) {
    largest_padded = std::max(largest_padded, align_up(param_bytes(layer), param_align));
    host_copies += align_up(param_bytes(layer), kHostAlign);
  }
  const std::uint64_t depth = config.zinf.prefetch_depth;
  if (ptier == OffloadDevice::kNvme) param_pinned = (depth + 2) * largest_padded;
  if (ptier == OffloadDevice::kCpu) param_pinned = host_copies;
  const std::uint64_t opt_need = optimizer_pinned_bytes_needed(oo, groups);
  const std::uint64_t budget = config.zinf.pinned_budget_bytes;
  if (opt_need > budget || param_pinned > budget - opt_need) {
    const std::string param_what =
        ptier == OffloadDevice::kNvme ? "the parameter staging" : "the pinned parameter copies";
    throw UsageError("OffloadEngine: zinf.pinned_budget_bytes " + std::to_string(budget) +
                     " cannot hold the optimizer's " + std::to_string(opt_need) + " bytes plus " +
                     param_what + "'s " + std::to_string(param_pinned) +
                     " bytes; the smallest budget that works is " +
                     std::to_string(opt_need + param_pinned));
  }
  oo.pinned_budget_bytes = opt_need;

  // Notice level, shown by default: a notice says the config means something other than what
  // it reads as (an old key name, a rounded size).
  for (const auto& notice : config.notices) log(LogLevel::kNotice, "config: " + notice);

  // ---- Construction.
  state.resize(layers.size());
  if (ptier == OffloadDevice::kNvme) {
    swap::IoOptions io = config.io_options();
    io.faults = faults.param;
    param_engine = swap::make_io_engine(io);
    swap::SwapStoreOptions so;
    so.directories = param_dirs;
    std::uint64_t capacity = 0;
    // A tensor of at least a stripe starts on a stripe boundary: room for that rounding.
    for (const auto& layer : layers)
      capacity += align_up(align_up(param_bytes(layer), param_align), kParamStripe);
    so.capacity_bytes = capacity;
    so.stripe_bytes = kParamStripe;
    so.checksums = config.zinf.checksums;
    so.direct_io = config.zinf.direct_io;
    param_store = std::make_unique<swap::SwapStore>(so, *param_engine);
    if (config.zinf.precondition) param_store->precondition();
    for (const auto& layer : layers) param_store->allocate(layer.name, param_bytes(layer));
  }
  optimizer = std::make_unique<OffloadedOptimizer>(oo, groups);
  if (ptier == OffloadDevice::kNvme) {
    prefetch::PrefetcherOptions po;
    for (const auto& layer : layers) po.layer_keys.push_back(layer.name);
    po.depth = depth;
    po.staging_bytes = param_pinned;
    po.max_bytes = param_pinned + std::uint64_t{config.offload_param.buffer_count} *
                                      align_up(config.offload_param.buffer_size * 2, 256);
    po.register_with_engine = param_engine.get();
    prefetcher = std::make_unique<prefetch::LayerPrefetcher>(po, *param_store, device, compute);
  } else if (ptier == OffloadDevice::kCpu) {
    swap::BufferPoolOptions bo;
    bo.budget_bytes = host_copies;
    bo.alignment = static_cast<std::uint32_t>(kHostAlign);
    bo.huge_pages = true;
    host_pool = std::make_unique<swap::BufferPool>(bo);
    host_pinned = device.register_host(host_pool->arena());
    std::uint64_t largest = 0;
    for (std::size_t i = 0; i < layers.size(); ++i) {
      state[i].pinned = host_pool->acquire(align_up(param_bytes(layers[i]), kHostAlign));
      state[i].host_read = device.create_event();
      largest = std::max(largest, param_bytes(layers[i]));
    }
    pool.resize(std::min<std::size_t>(config.offload_param.buffer_count, layers.size()));
    for (auto& b : pool) {
      b.buffer = device.allocate(largest);
      b.released = device.create_event();
    }
  } else {
    for (std::size_t i = 0; i < layers.size(); ++i) {
      state[i].host.assign(layers[i].numel, 0);
      state[i].resident = device.allocate(param_bytes(layers[i]));
      state[i].host_read = device.create_event();
    }
  }
}

OffloadEngine::Impl::~Impl() {
  // An open step still writes: let it finish before anything it uses goes.
  if (step_open && optimizer) {
    try {
      (void)optimizer->end_step();
    } catch (const std::exception& e) {
      log(LogLevel::kWarning, std::string("OffloadEngine destroyed inside a step: ") + e.what());
    }
  }
  // Work enqueued on the compute stream may still read the device copies and buffers.
  try {
    device.synchronize(compute);
  } catch (const std::exception& e) {
    log(LogLevel::kDebug,
        std::string("OffloadEngine: compute stream failed before destruction: ") + e.what());
  }
}

OffloadEngine::Impl::Layer& OffloadEngine::Impl::layer_at(std::size_t index, const char* op) {
  if (index >= state.size()) {
    throw UsageError(std::string("OffloadEngine::") + op + ": layer " + std::to_string(index) +
                     " out of range (" + std::to_string(state.size()) + " layers)");
  }
  return state[index];
}

void OffloadEngine::Impl::check_outside_step(const char* op) const {
  if (step_open) {
    throw UsageError(std::string("OffloadEngine::") + op +
                     " inside a step (gradients were handed in; call step() first)");
  }
  for (std::size_t i = 0; i < state.size(); ++i) {
    if (state[i].fetched) {
      throw UsageError(std::string("OffloadEngine::") + op + " while layer " +
                       in_quotes(layers[i].name) + " is fetched (release it first)");
    }
  }
}

void OffloadEngine::Impl::fail(const Status& cause) {
  if (!failure) {
    failure = cause;
    log(LogLevel::kError, "OffloadEngine failed, refusing further work: " + cause.to_string());
  }
}

void OffloadEngine::Impl::write_low_precision(std::size_t index, std::span<const float> masters) {
  Layer& st = state[index];
  const LayerSpec& spec = layers[index];
  const std::size_t n = static_cast<std::size_t>(spec.numel);
  const std::uint64_t bytes = param_bytes(spec);
  switch (ptier) {
    case OffloadDevice::kNone: {
      st.host_read.synchronize();  // the previous refresh no longer reads the host copy
      convert.copy_out(masters, {st.host.data(), n, spec.param_dtype, true});
      device.copy_to_device(compute, st.resident.span(),
                            std::as_bytes(std::span<const std::uint16_t>(st.host)));
      device.record(st.host_read, compute);
      st.host_read.synchronize();
      param_to_device += bytes;
      break;
    }
    case OffloadDevice::kCpu: {
      st.host_read.synchronize();
      convert.copy_out(masters, {st.pinned.data(), n, spec.param_dtype, true});
      ++st.version;
      break;
    }
    case OffloadDevice::kNvme: {
      // One layer's padded bytes of ordinary (not pinned) aligned memory, for this call only.
      swap::BufferPoolOptions bo;
      bo.budget_bytes = param_store->padded_size(bytes);
      bo.alignment = param_store->alignment();
      bo.huge_pages = false;
      swap::BufferPool tmp(bo);
      swap::BufferLease buf = tmp.acquire(param_store->padded_size(bytes));
      convert.copy_out(masters, {buf.data(), n, spec.param_dtype, true});
      std::memset(buf.data() + bytes, 0, buf.size() - bytes);
      prefetcher->suspend(index);
      try {
        param_store->swap_out(spec.name, buf.span()).wait();
      } catch (...) {
        prefetcher->resume(index);
        throw;
      }
      prefetcher->resume(index);
      param_written += bytes;
      break;
    }
  }
}

cuda::DeviceSpan OffloadEngine::Impl::fetch_cpu(std::size_t index) {
  Layer& st = state[index];
  const std::uint64_t bytes = param_bytes(layers[index]);
  const auto entered = Clock::now();
  // A buffer that still holds this layer's current bytes is reused without a copy (reads only,
  // ordered on the compute stream after its earlier use).
  std::size_t pick = kNoLayer;
  for (std::size_t b = 0; b < pool.size(); ++b) {
    if (!pool[b].held && pool[b].layer == index && pool[b].version == st.version) pick = b;
  }
  if (pick == kNoLayer) {
    // Else the least recently used free buffer, once the compute stream is past its release.
    for (std::size_t b = 0; b < pool.size(); ++b) {
      if (pool[b].held) continue;
      if (pick == kNoLayer || pool[b].last_use < pool[pick].last_use) pick = b;
    }
    if (pick == kNoLayer) {
      throw UsageError("OffloadEngine::fetch: all " + std::to_string(pool.size()) +
                       " parameter buffers (offload_param.buffer_count) hold fetched layers; "
                       "release some first");
    }
    DevBuf& b = pool[pick];
    b.released.synchronize();  // blocks only while the stream still uses the buffer
    device.copy_to_device(compute, b.buffer.span(0, bytes), st.pinned.span().first(bytes));
    device.record(st.host_read, compute);
    b.layer = index;
    b.version = st.version;
    param_to_device += bytes;
  }
  DevBuf& b = pool[pick];
  b.held = true;
  b.last_use = ++use_clock;
  st.buffer = pick;
  host_stall_seconds += std::chrono::duration<double>(Clock::now() - entered).count();
  return b.buffer.span(0, bytes);
}

// ---------------------------------------------------------------------------------------------
// Public API

OffloadEngine::OffloadEngine(EngineConfig config, std::vector<LayerSpec> layers,
                             cuda::Device& device, cuda::StreamRef compute_stream)
    : OffloadEngine(std::move(config), std::move(layers), device, compute_stream,
                    test_hooks::EngineFaults{}) {}

OffloadEngine::OffloadEngine(EngineConfig config, std::vector<LayerSpec> layers,
                             cuda::Device& device, cuda::StreamRef compute_stream,
                             const test_hooks::EngineFaults& faults)
    : impl_(std::make_unique<Impl>(std::move(config), std::move(layers), device, compute_stream,
                                   faults)) {}

OffloadEngine::~OffloadEngine() = default;

std::size_t OffloadEngine::layer_count() const noexcept { return impl_->layers.size(); }

const LayerSpec& OffloadEngine::layer(std::size_t index) const {
  (void)impl_->layer_at(index, "layer");
  return impl_->layers[index];
}

const EngineConfig& OffloadEngine::config() const noexcept { return impl_->config; }

void OffloadEngine::set_master_weights(std::size_t index, std::span<const float> weights) {
  Impl& m = *impl_;
  m.check_usable();
  Impl::Layer& st = m.layer_at(index, "set_master_weights");
  m.check_outside_step("set_master_weights");
  const LayerSpec& spec = m.layers[index];
  if (weights.size() != spec.numel) {
    throw UsageError("OffloadEngine::set_master_weights: layer " + in_quotes(spec.name) + " has " +
                     std::to_string(spec.numel) + " elements, got " +
                     std::to_string(weights.size()));
  }
  m.optimizer->set_params(index, weights);
  st.master_set = false;
  m.write_low_precision(index, weights);
  st.master_set = true;
}

void OffloadEngine::read_master_weights(std::size_t index, std::span<float> out) {
  Impl& m = *impl_;
  m.check_usable();
  (void)m.layer_at(index, "read_master_weights");
  if (m.step_open) {
    throw UsageError("OffloadEngine::read_master_weights inside a step (call step() first)");
  }
  m.optimizer->read_state(index, out, {}, {});
}

cuda::DeviceSpan OffloadEngine::fetch(std::size_t index) {
  Impl& m = *impl_;
  m.check_usable();
  Impl::Layer& st = m.layer_at(index, "fetch");
  const std::string& name = m.layers[index].name;
  if (st.fetched)
    throw UsageError("OffloadEngine::fetch: layer " + in_quotes(name) +
                     " is already fetched (release it first)");
  if (st.has_grads) {
    throw UsageError("OffloadEngine::fetch: layer " + in_quotes(name) +
                     " has its gradients handed in for this step; fetch it after step()");
  }
  if (!st.master_set) {
    throw UsageError("OffloadEngine::fetch: layer " + in_quotes(name) +
                     " has no weights yet (set_master_weights or load first)");
  }
  cuda::DeviceSpan span;
  switch (m.ptier) {
    case OffloadDevice::kNone: span = st.resident.span(); break;
    case OffloadDevice::kCpu: span = m.fetch_cpu(index); break;
    case OffloadDevice::kNvme: span = m.prefetcher->acquire(index); break;  // IoError as is
  }
  st.fetched = true;
  return span;
}

void OffloadEngine::release(std::size_t index) {
  Impl& m = *impl_;
  m.check_usable();
  Impl::Layer& st = m.layer_at(index, "release");
  if (!st.fetched) {
    throw UsageError("OffloadEngine::release: layer " + in_quotes(m.layers[index].name) +
                     " is not fetched");
  }
  if (m.ptier == OffloadDevice::kCpu) {
    Impl::DevBuf& b = m.pool[st.buffer];
    m.device.record(b.released, m.compute);
    b.held = false;
    st.buffer = kNoLayer;
  } else if (m.ptier == OffloadDevice::kNvme) {
    m.prefetcher->release(index);
  }
  st.fetched = false;
}

void OffloadEngine::set_gradients(std::size_t index, adam::GradView grads) {
  Impl& m = *impl_;
  m.check_usable();
  Impl::Layer& st = m.layer_at(index, "set_gradients");
  const LayerSpec& spec = m.layers[index];
  if (st.fetched) {
    throw UsageError("OffloadEngine::set_gradients: layer " + in_quotes(spec.name) +
                     " is fetched (release it first)");
  }
  if (st.has_grads) {
    throw UsageError("OffloadEngine::set_gradients: layer " + in_quotes(spec.name) +
                     " already has gradients in this step");
  }
  if (!st.master_set) {
    throw UsageError("OffloadEngine::set_gradients: layer " + in_quotes(spec.name) +
                     " has no weights yet (set_master_weights or load first)");
  }
  if (grads.size != spec.numel || grads.data == nullptr) {
    throw UsageError("OffloadEngine::set_gradients: layer " + in_quotes(spec.name) + " has " +
                     std::to_string(spec.numel) + " elements, got " + std::to_string(grads.size) +
                     " gradients");
  }
  if (!m.step_open) {
    m.optimizer->begin_step();
    m.step_open = true;
  }
  const std::size_t n = static_cast<std::size_t>(spec.numel);
  switch (m.ptier) {
    case OffloadDevice::kNone:
      st.host_read.synchronize();  // the last refresh has read the host copy
      m.optimizer->step_group(index, grads,
                              adam::CopyOut{st.host.data(), n, spec.param_dtype, true});
      break;
    case OffloadDevice::kCpu:
      st.host_read.synchronize();  // the last fetch's copy has read the pinned copy
      m.optimizer->step_group(index, grads,
                              adam::CopyOut{st.pinned.data(), n, spec.param_dtype, true});
      ++st.version;  // device buffers holding the old bytes are stale from now on
      break;
    case OffloadDevice::kNvme:
      // No read of the key may overlap the copy-out, and no copy read before it may be
      // handed out after it.
      m.prefetcher->suspend(index);
      try {
        m.optimizer->step_group(index, grads,
                                StoreCopyOut{m.param_store.get(), spec.name, spec.param_dtype});
      } catch (...) {
        m.prefetcher->resume(index);
        throw;
      }
      m.suspended.push_back(index);
      break;
  }
  st.has_grads = true;
}

StepStats OffloadEngine::step() {
  Impl& m = *impl_;
  m.check_usable();
  for (std::size_t i = 0; i < m.state.size(); ++i) {
    if (m.state[i].fetched) {
      throw UsageError("OffloadEngine::step: layer " + in_quotes(m.layers[i].name) +
                       " is still fetched (release it first)");
    }
  }
  const auto t0 = Clock::now();
  if (!m.step_open) {
    m.optimizer->begin_step();
    m.step_open = true;
  }
  StepStats st;
  try {
    st = m.optimizer->end_step();
  } catch (const IoError& e) {
    m.step_open = false;
    if (m.optimizer->failed()) {
      m.fail(e.status());
    } else {
      // Nothing was written (a state read failed first): the step did not happen, and the
      // parameter copies are as they were. Release the layers for the next attempt.
      for (std::size_t l : m.suspended) m.prefetcher->resume(l);
      m.suspended.clear();
      for (auto& s : m.state) s.has_grads = false;
    }
    throw;
  } catch (const EngineFailed& e) {
    m.step_open = false;
    m.fail(e.cause());
    throw;
  }
  m.step_open = false;
  for (std::size_t i = 0; i < m.state.size(); ++i) {
    Impl::Layer& s = m.state[i];
    if (!s.has_grads) continue;
    s.has_grads = false;
    if (m.ptier == OffloadDevice::kNone) {
      // The device copy is refreshed in stream order: compute enqueued before this point sees
      // the old parameters, compute enqueued after it the new ones.
      m.device.copy_to_device(m.compute, s.resident.span(),
                              std::as_bytes(std::span<const std::uint16_t>(s.host)));
      m.device.record(s.host_read, m.compute);
      m.param_to_device += param_bytes(m.layers[i]);
    }
  }
  if (m.ptier == OffloadDevice::kNvme) {
    for (std::size_t l : m.suspended) m.prefetcher->resume(l);
    m.suspended.clear();
    m.prefetcher->end_iteration();
    m.param_written += st.copy_out_bytes;
  }
  ++m.steps;
  m.opt_read += st.bytes_read;
  m.opt_written += st.bytes_written;
  m.opt_read_seconds += st.read_seconds;
  m.opt_write_seconds += st.write_seconds;
  m.last_step = st;
  m.step_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
  return st;
}

void OffloadEngine::set_hyper(const adam::AdamParams& hyper) {
  impl_->check_usable();
  if (impl_->step_open)
    throw UsageError("OffloadEngine::set_hyper inside a step (call step() first)");
  impl_->optimizer->set_hyper(hyper);
}

adam::AdamParams OffloadEngine::hyper() const { return impl_->optimizer->hyper(); }

void OffloadEngine::save(const std::string& dir) {
  check_checkpoint_dir(dir, "OffloadEngine::save");
  Impl& m = *impl_;
  m.check_usable();
  m.check_outside_step("save");
  // The optimizer's directory, created if missing and locked for it: the layer table is
  // written under the same lock, through the same descriptor.
  const swap::Dir& d = m.optimizer->checkpoint_directory(dir, /*create=*/true);
  // The layer table first: it never changes for an engine, so a crash between it and the
  // optimizer's checkpoint leaves a table that matches the previous checkpoint too.
  swap::replace_file_durably(d, kManifestName, manifest_text(m.layers));
  m.optimizer->save(dir);
}

void OffloadEngine::load(const std::string& dir) {
  check_checkpoint_dir(dir, "OffloadEngine::load");
  Impl& m = *impl_;
  m.check_usable();
  m.check_outside_step("load");
  const swap::Dir& d = m.optimizer->checkpoint_directory(dir, /*create=*/false);
  const std::string path = d.path_of(kManifestName);
  const std::string want = manifest_text(m.layers);
  if (swap::read_small_file(d, kManifestName, kMaxLayerTableBytes) != want) {
    throw UsageError("OffloadEngine::load: the checkpoint's layer table " + path +
                     " differs from this engine's layers (names, element counts, dtypes)");
  }
  m.optimizer->load(dir);
  // Every layer's low-precision copy from the restored masters, one layer at a time.
  std::vector<float> masters;
  for (std::size_t i = 0; i < m.layers.size(); ++i) {
    masters.assign(static_cast<std::size_t>(m.layers[i].numel), 0.0f);
    m.optimizer->read_state(i, masters, {}, {});
    m.state[i].master_set = false;
    m.write_low_precision(i, masters);
    m.state[i].master_set = true;
  }
}

EngineStats OffloadEngine::stats() const {
  const Impl& m = *impl_;
  EngineStats s;
  s.steps = m.steps;
  s.param_bytes_written = m.param_written;
  s.param_bytes_to_device = m.param_to_device;
  s.optimizer_bytes_read = m.opt_read;
  s.optimizer_bytes_written = m.opt_written;
  s.stall_seconds = m.host_stall_seconds;
  s.step_seconds = m.step_seconds;
  if (m.prefetcher) {
    const prefetch::PrefetcherStats p = m.prefetcher->stats();
    s.param_bytes_read = p.bytes_read;
    s.param_bytes_to_device += p.bytes_to_device;
    s.stall_seconds += std::chrono::duration<double>(p.stall_time).count();
    s.prefetch_hits = p.hits;
    s.prefetch_on_demand = p.on_demand;
    const double busy = std::chrono::duration<double>(p.read_busy_time).count();
    if (busy > 0) s.param_read_gbps = static_cast<double>(p.bytes_read) / busy / 1e9;
  }
  if (m.opt_read_seconds > 0)
    s.nvme_read_gbps = static_cast<double>(m.opt_read) / m.opt_read_seconds / 1e9;
  if (m.opt_write_seconds > 0) {
    s.nvme_write_gbps = static_cast<double>(m.opt_written) / m.opt_write_seconds / 1e9;
  }
  s.pinned_bytes = m.optimizer->pinned_bytes() + m.param_pinned;
  s.pinned_bytes_peak = m.optimizer->pinned_bytes_peak() + m.param_pinned;
  s.last_step = m.last_step;
  return s;
}

}  // namespace zinf::offload
