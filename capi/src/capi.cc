// SPDX-License-Identifier: Apache-2.0
// The C API (zinf.h) over zinf::offload::OffloadEngine. Every entry point runs its body inside
// guarded(), which turns any exception into a zinf_status and records its what() text for
// zinf_last_error() (per thread) and zinf_engine_last_error() (per engine), so no exception
// crosses the C boundary.
#include "zinf.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "zinf/common/error.h"
#include "zinf/common/status.h"
#include "zinf/config.h"
#include "zinf/cuda/cuda_interop.h"
#include "zinf/cuda/device.h"
#include "zinf/offload/config.h"
#include "zinf/offload/engine.h"

namespace adam = zinf::adam;
namespace off = zinf::offload;

/// The engine handle: the device and compute stream the engine runs on, declared before the
/// engine so they are destroyed after it (the engine's contract). The compute stream is either
/// the engine's own (`stream`) or the caller's (`adopted`), never both.
struct zinf_engine {
  std::unique_ptr<zinf::cuda::Device> device;
  zinf::cuda::Stream stream;
  zinf::cuda::AdoptedStream adopted;
  std::unique_ptr<off::OffloadEngine> engine;
  std::string last_error;  // zinf_engine_last_error

  bool has_callers_stream() const noexcept { return !adopted.empty(); }
  zinf::cuda::StreamRef compute() const noexcept {
    return has_callers_stream() ? adopted.ref() : stream.ref();
  }
};

namespace {

thread_local std::string t_last_error;
// Used when recording a message itself runs out of memory.
constexpr const char* kNoMemoryForMessage = "out of memory (while recording an error message)";
thread_local const char* t_last_error_fallback = nullptr;

void record(zinf_engine* engine, const char* message) noexcept {
  try {
    t_last_error = message;
    t_last_error_fallback = nullptr;
  } catch (...) {
    t_last_error_fallback = kNoMemoryForMessage;
  }
  if (engine != nullptr) {
    try {
      engine->last_error = message;
    } catch (...) {
      engine->last_error.clear();  // never throws; the thread's message still holds the text
    }
  }
}

zinf_status status_of(zinf::ErrorCode code) noexcept {
  switch (code) {
    case zinf::ErrorCode::kNoSpace: return ZINF_ERR_NO_SPACE;
    case zinf::ErrorCode::kNotFound: return ZINF_ERR_NOT_FOUND;
    case zinf::ErrorCode::kPermission: return ZINF_ERR_PERMISSION;
    case zinf::ErrorCode::kCorrupt: return ZINF_ERR_CORRUPT;
    case zinf::ErrorCode::kFailedState: return ZINF_ERR_FAILED;
    case zinf::ErrorCode::kInvalidArgument: return ZINF_ERR_USAGE;
    case zinf::ErrorCode::kResource: return ZINF_ERR_NO_MEMORY;
    case zinf::ErrorCode::kDevice: return ZINF_ERR_DEVICE;
    case zinf::ErrorCode::kInternal: return ZINF_ERR_INTERNAL;
    default: return ZINF_ERR_IO;
  }
}

/// Runs `body` (which returns nothing or throws) and maps what it throws to a status,
/// recording the message. `engine` (may be null) also records it. The code comes from the
/// library's one exception mapping (status_from_current_exception); the text is the
/// exception's own, as the caller of the C++ API would see it.
template <typename Body>
zinf_status guarded(zinf_engine* engine, Body&& body) noexcept {
  try {
    body();
    return ZINF_OK;
  } catch (...) {
    const zinf_status status = status_of(zinf::status_from_current_exception().code());
    try {
      throw;
    } catch (const std::bad_alloc&) {
      record(engine, "out of memory (std::bad_alloc)");
    } catch (const std::exception& e) {
      record(engine, e.what());
    } catch (...) {
      record(engine, "unknown exception");
    }
    return status;
  }
}

// The C API's own argument checks; their messages name the function.
void require(bool condition, const char* function, const char* what) {
  if (!condition) throw zinf::UsageError(std::string(function) + ": " + what);
}

off::OffloadEngine& engine_of(zinf_engine* engine, const char* function) {
  require(engine != nullptr, function, "engine is NULL");
  return *engine->engine;
}

zinf::ElementType dtype_of(zinf_dtype dtype, const char* function) {
  switch (dtype) {
    case ZINF_DTYPE_F32: return zinf::ElementType::kF32;
    case ZINF_DTYPE_BF16: return zinf::ElementType::kBF16;
    case ZINF_DTYPE_F16: return zinf::ElementType::kF16;
  }
  throw zinf::UsageError(std::string(function) + ": unknown dtype " +
                         std::to_string(static_cast<int>(dtype)));
}

// The layer's element count, after checking the index, so a count mismatch is named here
// rather than as a span out of bounds inside the engine.
std::uint64_t checked_numel(off::OffloadEngine& engine, std::size_t layer, std::size_t count,
                            const char* function) {
  if (layer >= engine.layer_count()) {
    throw zinf::UsageError(std::string(function) + ": layer " + std::to_string(layer) +
                           " out of range (the engine has " + std::to_string(engine.layer_count()) +
                           " layers)");
  }
  const off::LayerSpec& spec = engine.layer(layer);
  if (count != spec.numel) {
    throw zinf::UsageError(std::string(function) + ": layer " + std::to_string(layer) + " ('" +
                           spec.name + "') has " + std::to_string(spec.numel) + " elements, got " +
                           std::to_string(count));
  }
  return spec.numel;
}

// The size a versioned struct's caller declared (0: the first version's), refused below the
// first version before anything is read or written.
std::size_t declared_size(std::size_t struct_size, std::size_t first_version, const char* function,
                          const char* what) {
  const std::size_t size = struct_size == 0 ? first_version : struct_size;
  if (size < first_version) {
    throw zinf::UsageError(std::string(function) + ": " + what + "->struct_size " +
                           std::to_string(size) + " is smaller than the first version's " +
                           std::to_string(first_version) + " bytes (set it to sizeof the struct)");
  }
  return size;
}

// The caller's options, as far as its struct_size covers them, over the defaults. Bytes past
// the fields this library knows must be zero: a newer caller's nonzero field asks for
// something this library would silently not do.
zinf_engine_options read_options(const zinf_engine_options* in, const char* function) {
  zinf_engine_options o{};  // the defaults: ZINF_DEVICE_AUTO, device 0, the engine's own stream
  if (in == nullptr) return o;
  const std::size_t size =
      declared_size(in->struct_size, ZINF_ENGINE_OPTIONS_SIZE_V1, function, "options");
  const auto* bytes = reinterpret_cast<const unsigned char*>(in);
  for (std::size_t i = sizeof o; i < size; ++i) {
    if (bytes[i] != 0) {
      throw zinf::UsageError(
          std::string(function) + ": options->struct_size " + std::to_string(size) +
          " covers fields this library (zinf " + ZINF_VERSION + ", " + std::to_string(sizeof o) +
          " bytes) does not know, and byte " + std::to_string(i) + " of them is not zero");
    }
  }
  std::memcpy(&o, in, std::min(size, sizeof o));
  o.struct_size = sizeof o;
  return o;
}

zinf_status create(off::EngineConfig (*read)(const char*), const char* config,
                   const zinf_layer_spec* layers, std::size_t layer_count,
                   const zinf_engine_options* options, zinf_engine** out, const char* function) {
  return guarded(nullptr, [&] {
    require(config != nullptr, function, "config is NULL");
    require(out != nullptr, function, "out is NULL");
    require(layers != nullptr || layer_count == 0, function, "layers is NULL");
    const zinf_engine_options opts = read_options(options, function);
    off::EngineConfig parsed = read(config);
    // Read as the integer a C caller stored: a value outside the enumerators may not be loaded
    // as the C++ enum type (its range is only what its enumerators need).
    std::underlying_type_t<zinf_state_precision> precision = 0;
    std::memcpy(&precision, &opts.state_precision, sizeof precision);
    switch (precision) {
      case ZINF_STATE_PRECISION_CONFIG: break;
      case ZINF_STATE_PRECISION_FP32:
        parsed.zinf.state_precision = zinf::adam::StatePrecision::kF32;
        break;
      case ZINF_STATE_PRECISION_BF16:
        parsed.zinf.state_precision = zinf::adam::StatePrecision::kBF16;
        break;
      case ZINF_STATE_PRECISION_INT8:
        parsed.zinf.state_precision = zinf::adam::StatePrecision::kInt8;
        break;
      default:
        throw zinf::UsageError(std::string(function) + ": unknown state_precision " +
                               std::to_string(precision) +
                               " (expected ZINF_STATE_PRECISION_CONFIG, _FP32, _BF16 or _INT8)");
    }
    std::vector<off::LayerSpec> specs;
    specs.reserve(layer_count);
    for (std::size_t i = 0; i < layer_count; ++i) {
      if (layers[i].name == nullptr) {
        throw zinf::UsageError(std::string(function) + ": layers[" + std::to_string(i) +
                               "].name is NULL");
      }
      specs.push_back(off::LayerSpec{layers[i].name, layers[i].numel,
                                     dtype_of(layers[i].param_dtype, function)});
    }
    zinf::cuda::DeviceOptions device_options;
    switch (opts.device) {
      case ZINF_DEVICE_HOST: device_options.kind = zinf::cuda::DeviceKind::kHost; break;
      case ZINF_DEVICE_CUDA: device_options.kind = zinf::cuda::DeviceKind::kCuda; break;
      case ZINF_DEVICE_AUTO: device_options.kind = zinf::cuda::DeviceKind::kAuto; break;
      default:
        throw zinf::UsageError(std::string(function) + ": unknown device kind " +
                               std::to_string(static_cast<int>(opts.device)));
    }
    device_options.device_index = opts.device_index;

    auto handle = std::make_unique<zinf_engine>();
    handle->device = zinf::cuda::make_device(device_options);
    if (opts.compute_stream != nullptr) {
      handle->adopted = zinf::cuda::adopt_stream(*handle->device, opts.compute_stream);
    } else {
      handle->stream = handle->device->create_stream();
    }
    handle->engine = std::make_unique<off::OffloadEngine>(std::move(parsed), std::move(specs),
                                                          *handle->device, handle->compute());
    *out = handle.release();
  });
}

zinf_step_stats to_c(const off::StepStats& s) noexcept {
  zinf_step_stats c{};
  c.step = s.step;
  c.sub_groups = s.sub_groups;
  c.elements = s.elements;
  c.seconds = s.seconds;
  c.read_seconds = s.read_seconds;
  c.write_seconds = s.write_seconds;
  c.compute_seconds = s.compute_seconds;
  c.wait_seconds = s.wait_seconds;
  c.bytes_read = s.bytes_read;
  c.bytes_written = s.bytes_written;
  return c;
}

zinf_adam_params to_c(const adam::AdamParams& h) noexcept {
  zinf_adam_params c{};
  c.lr = h.lr;
  c.beta1 = h.beta1;
  c.beta2 = h.beta2;
  c.eps = h.eps;
  c.weight_decay = h.weight_decay;
  c.bias_correction = h.bias_correction ? 1 : 0;
  c.grad_scale = h.grad_scale;
  c.adamw = h.mode == adam::AdamMode::kAdamW ? 1 : 0;
  return c;
}

// `base` with the C struct's fields: keeps what the struct does not carry. The engine refuses
// the same values; checked here too so the message names the C function and the struct's field,
// before the engine sees them (nothing changes).
adam::AdamParams from_c(const zinf_adam_params* params, adam::AdamParams base,
                        const char* function) {
  require(params != nullptr, function, "params is NULL");
  base.lr = params->lr;
  base.beta1 = params->beta1;
  base.beta2 = params->beta2;
  base.eps = params->eps;
  base.weight_decay = params->weight_decay;
  base.bias_correction = params->bias_correction != 0;
  base.grad_scale = params->grad_scale;
  base.mode = params->adamw != 0 ? adam::AdamMode::kAdamW : adam::AdamMode::kAdam;
  if (auto bad = adam::check_adam_params(base)) {
    throw zinf::UsageError(std::string(function) + ": params->" + std::string(bad->field) + " " +
                           bad->what);
  }
  return base;
}

}  // namespace

extern "C" {

const char* zinf_version(void) { return ZINF_VERSION; }

const char* zinf_status_name(zinf_status status) {
  switch (status) {
    case ZINF_OK: return "ok";
    case ZINF_ERR_USAGE: return "usage";
    case ZINF_ERR_IO: return "io";
    case ZINF_ERR_NO_SPACE: return "no_space";
    case ZINF_ERR_NOT_FOUND: return "not_found";
    case ZINF_ERR_PERMISSION: return "permission";
    case ZINF_ERR_CORRUPT: return "corrupt";
    case ZINF_ERR_DEVICE: return "device";
    case ZINF_ERR_FAILED: return "failed";
    case ZINF_ERR_NO_MEMORY: return "no_memory";
    case ZINF_ERR_INTERNAL: return "internal";
  }
  return "unknown";
}

const char* zinf_last_error(void) {
  return t_last_error_fallback != nullptr ? t_last_error_fallback : t_last_error.c_str();
}

zinf_status zinf_engine_create(const char* config_json, const zinf_layer_spec* layers,
                               size_t layer_count, const zinf_engine_options* options,
                               zinf_engine** out) {
  return create([](const char* json) { return off::parse_config(json); }, config_json, layers,
                layer_count, options, out, "zinf_engine_create");
}

zinf_status zinf_engine_create_from_file(const char* config_path, const zinf_layer_spec* layers,
                                         size_t layer_count, const zinf_engine_options* options,
                                         zinf_engine** out) {
  return create([](const char* path) { return off::load_config(path); }, config_path, layers,
                layer_count, options, out, "zinf_engine_create_from_file");
}

void zinf_engine_destroy(zinf_engine* engine) {
  // ~OffloadEngine, ~Stream, ~AdoptedStream and ~Device never throw (their contracts); delete
  // cannot either.
  delete engine;
}

const char* zinf_engine_last_error(const zinf_engine* engine) {
  return engine != nullptr ? engine->last_error.c_str() : "";
}

zinf_status zinf_engine_layer_count(const zinf_engine* engine, size_t* count) {
  return guarded(const_cast<zinf_engine*>(engine), [&] {
    const char* fn = "zinf_engine_layer_count";
    off::OffloadEngine& e = engine_of(const_cast<zinf_engine*>(engine), fn);
    require(count != nullptr, fn, "count is NULL");
    *count = e.layer_count();
  });
}

zinf_status zinf_engine_device_kind(const zinf_engine* engine, zinf_device_kind* kind) {
  return guarded(const_cast<zinf_engine*>(engine), [&] {
    const char* fn = "zinf_engine_device_kind";
    (void)engine_of(const_cast<zinf_engine*>(engine), fn);
    require(kind != nullptr, fn, "kind is NULL");
    *kind = engine->device->kind() == zinf::cuda::DeviceKind::kCuda ? ZINF_DEVICE_CUDA
                                                                    : ZINF_DEVICE_HOST;
  });
}

zinf_status zinf_engine_set_master_weights(zinf_engine* engine, size_t layer, const float* weights,
                                           size_t count) {
  return guarded(engine, [&] {
    const char* fn = "zinf_engine_set_master_weights";
    off::OffloadEngine& e = engine_of(engine, fn);
    require(weights != nullptr, fn, "weights is NULL");
    checked_numel(e, layer, count, fn);
    e.set_master_weights(layer, std::span<const float>(weights, count));
  });
}

zinf_status zinf_engine_read_master_weights(zinf_engine* engine, size_t layer, float* out,
                                            size_t count) {
  return guarded(engine, [&] {
    const char* fn = "zinf_engine_read_master_weights";
    off::OffloadEngine& e = engine_of(engine, fn);
    require(out != nullptr, fn, "out is NULL");
    checked_numel(e, layer, count, fn);
    e.read_master_weights(layer, std::span<float>(out, count));
  });
}

zinf_status zinf_engine_fetch(zinf_engine* engine, size_t layer, void** data, size_t* bytes) {
  return guarded(engine, [&] {
    const char* fn = "zinf_engine_fetch";
    off::OffloadEngine& e = engine_of(engine, fn);
    require(data != nullptr, fn, "data is NULL");
    require(bytes != nullptr, fn, "bytes is NULL");
    const zinf::cuda::DeviceSpan span = e.fetch(layer);
    // Without a stream of its own the caller cannot be ordered after the copy on the device,
    // so the parameters must be in place when the call returns. With the caller's stream,
    // fetch has already made that stream wait for them: returning now is the overlap.
    if (!engine->has_callers_stream()) engine->device->synchronize(engine->stream.ref());
    *data = span.data();
    *bytes = span.size();
  });
}

zinf_status zinf_engine_release(zinf_engine* engine, size_t layer) {
  return guarded(engine, [&] { engine_of(engine, "zinf_engine_release").release(layer); });
}

zinf_status zinf_engine_set_gradients(zinf_engine* engine, size_t layer, const void* grads,
                                      size_t count, zinf_dtype dtype) {
  return guarded(engine, [&] {
    const char* fn = "zinf_engine_set_gradients";
    off::OffloadEngine& e = engine_of(engine, fn);
    require(grads != nullptr, fn, "grads is NULL");
    const zinf::ElementType type = dtype_of(dtype, fn);
    checked_numel(e, layer, count, fn);
    e.set_gradients(layer, adam::GradView{grads, count, type});
  });
}

zinf_status zinf_engine_step(zinf_engine* engine, zinf_step_stats* out) {
  return guarded(engine, [&] {
    const off::StepStats s = engine_of(engine, "zinf_engine_step").step();
    if (out != nullptr) *out = to_c(s);
  });
}

zinf_status zinf_engine_set_gradients_device(zinf_engine* engine, size_t layer,
                                             const void* device_grads, size_t count,
                                             zinf_dtype dtype) {
  return guarded(engine, [&] {
    const char* fn = "zinf_engine_set_gradients_device";
    off::OffloadEngine& e = engine_of(engine, fn);
    require(device_grads != nullptr, fn, "device_grads is NULL");
    const zinf::ElementType type = dtype_of(dtype, fn);
    checked_numel(e, layer, count, fn);
    const zinf::cuda::DeviceSpan span = zinf::cuda::adopt_device_memory(
        *engine->device, const_cast<void*>(device_grads), count * zinf::element_size(type));
    e.set_gradients(layer, span, type);
  });
}

zinf_status zinf_engine_get_hyper(const zinf_engine* engine, zinf_adam_params* out) {
  return guarded(const_cast<zinf_engine*>(engine), [&] {
    const char* fn = "zinf_engine_get_hyper";
    const off::OffloadEngine& e = engine_of(const_cast<zinf_engine*>(engine), fn);
    require(out != nullptr, fn, "out is NULL");
    *out = to_c(e.hyper());
  });
}

zinf_status zinf_engine_loss_scale(const zinf_engine* engine, double* out) {
  return guarded(const_cast<zinf_engine*>(engine), [&] {
    const char* fn = "zinf_engine_loss_scale";
    const off::OffloadEngine& e = engine_of(const_cast<zinf_engine*>(engine), fn);
    require(out != nullptr, fn, "out is NULL");
    *out = e.loss_scale();
  });
}

zinf_status zinf_engine_get_layer_hyper(const zinf_engine* engine, size_t layer,
                                        zinf_adam_params* out) {
  return guarded(const_cast<zinf_engine*>(engine), [&] {
    const char* fn = "zinf_engine_get_layer_hyper";
    const off::OffloadEngine& e = engine_of(const_cast<zinf_engine*>(engine), fn);
    require(out != nullptr, fn, "out is NULL");
    *out = to_c(e.hyper(layer));
  });
}

zinf_status zinf_engine_set_hyper(zinf_engine* engine, const zinf_adam_params* params) {
  return guarded(engine, [&] {
    const char* fn = "zinf_engine_set_hyper";
    off::OffloadEngine& e = engine_of(engine, fn);
    e.set_hyper(from_c(params, e.hyper(), fn));
  });
}

zinf_status zinf_engine_set_layer_hyper(zinf_engine* engine, size_t layer,
                                        const zinf_adam_params* params) {
  return guarded(engine, [&] {
    const char* fn = "zinf_engine_set_layer_hyper";
    off::OffloadEngine& e = engine_of(engine, fn);
    e.set_hyper(layer, from_c(params, e.hyper(layer), fn));
  });
}

zinf_status zinf_engine_save(zinf_engine* engine, const char* dir) {
  return guarded(engine, [&] {
    const char* fn = "zinf_engine_save";
    off::OffloadEngine& e = engine_of(engine, fn);
    require(dir != nullptr, fn, "dir is NULL");
    require(dir[0] != '\0', fn, "dir is empty");
    e.save(dir);
  });
}

zinf_status zinf_engine_save_async(zinf_engine* engine, const char* dir) {
  return guarded(engine, [&] {
    const char* fn = "zinf_engine_save_async";
    off::OffloadEngine& e = engine_of(engine, fn);
    require(dir != nullptr, fn, "dir is NULL");
    require(dir[0] != '\0', fn, "dir is empty");
    e.save_async(dir);
  });
}

zinf_status zinf_engine_wait_save(zinf_engine* engine) {
  return guarded(engine, [&] { engine_of(engine, "zinf_engine_wait_save").wait_save(); });
}

zinf_status zinf_engine_last_save_snapshot(const zinf_engine* engine, zinf_save_snapshot* out) {
  return guarded(const_cast<zinf_engine*>(engine), [&] {
    const char* fn = "zinf_engine_last_save_snapshot";
    const off::OffloadEngine& e = engine_of(const_cast<zinf_engine*>(engine), fn);
    require(out != nullptr, fn, "out is NULL");
    switch (e.last_save_snapshot()) {
      case off::SaveSnapshot::kNone:
        *out = ZINF_SAVE_SNAPSHOT_NONE;
        break;
      case off::SaveSnapshot::kReflink:
        *out = ZINF_SAVE_SNAPSHOT_REFLINK;
        break;
      case off::SaveSnapshot::kStreamed:
        *out = ZINF_SAVE_SNAPSHOT_STREAMED;
        break;
    }
  });
}

zinf_status zinf_engine_load(zinf_engine* engine, const char* dir) {
  return guarded(engine, [&] {
    const char* fn = "zinf_engine_load";
    off::OffloadEngine& e = engine_of(engine, fn);
    require(dir != nullptr, fn, "dir is NULL");
    require(dir[0] != '\0', fn, "dir is empty");
    e.load(dir);
  });
}

zinf_status zinf_engine_stats(const zinf_engine* engine, zinf_stats* out) {
  return guarded(const_cast<zinf_engine*>(engine), [&] {
    const char* fn = "zinf_engine_stats";
    const off::OffloadEngine& e = engine_of(const_cast<zinf_engine*>(engine), fn);
    require(out != nullptr, fn, "out is NULL");
    const std::size_t size = declared_size(out->struct_size, ZINF_STATS_SIZE_V1, fn, "out");
    const off::EngineStats s = e.stats();
    zinf_stats c{};
    c.struct_size = std::min(size, sizeof c);
    c.steps = s.steps;
    c.param_bytes_read = s.param_bytes_read;
    c.param_bytes_written = s.param_bytes_written;
    c.param_bytes_to_device = s.param_bytes_to_device;
    c.optimizer_bytes_read = s.optimizer_bytes_read;
    c.optimizer_bytes_written = s.optimizer_bytes_written;
    c.nvme_read_gbps = s.nvme_read_gbps;
    c.nvme_write_gbps = s.nvme_write_gbps;
    c.stall_seconds = s.stall_seconds;
    c.step_seconds = s.step_seconds;
    c.prefetch_hits = s.prefetch_hits;
    c.prefetch_on_demand = s.prefetch_on_demand;
    c.pinned_bytes = s.pinned_bytes;
    c.pinned_bytes_peak = s.pinned_bytes_peak;
    c.last_step = to_c(s.last_step);
    c.param_read_gbps = s.param_read_gbps;
    c.skipped_steps = s.skipped_steps;
    c.last_step_skipped = s.last_step.skipped ? 1 : 0;
    c.last_global_grad_norm = s.last_step.global_grad_norm;
    c.last_grad_scale_applied = s.last_step.grad_scale_applied;
    c.loss_scale = e.loss_scale();
    c.grad_bytes_to_host = s.grad_bytes_to_host;
    c.grad_staging_wait_seconds = s.grad_staging_wait_seconds;
    // Only the caller's fields: an older caller's struct ends before ours does.
    std::memcpy(out, &c, c.struct_size);
    if (size > sizeof c)
      std::memset(reinterpret_cast<unsigned char*>(out) + sizeof c, 0, size - sizeof c);
  });
}

}  // extern "C"
