// SPDX-License-Identifier: Apache-2.0
// The C API (zinf.h) over zinf::offload::OffloadEngine, and over zinf::dist::ShardedEngine for
// an engine of zinf_engine_create_mpi. Every entry point runs its body inside guarded(), which
// turns any exception into a zinf_status and records its what() text for zinf_last_error() (per
// thread) and zinf_engine_last_error() (per engine), so no exception crosses the C boundary.
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
#include "zinf/dist/collectives.h"
#include "zinf/dist/mpi_collectives.h"
#include "zinf/dist/sharded_engine.h"
#include "zinf/offload/config.h"
#include "zinf/offload/engine.h"

namespace adam = zinf::adam;
namespace off = zinf::offload;

/// The engine handle: the device and compute stream the engine runs on, and a sharded engine's
/// collectives, declared before the engine so they are destroyed after it (the engines'
/// contract). The compute stream is either the engine's own (`stream`) or the caller's
/// (`adopted`), never both. The engine is either one rank's OffloadEngine (`engine`) or one
/// rank of a ShardedEngine (`sharded`, zinf_engine_create_mpi), never both; visit() hands the
/// one there is to a function that takes either.
struct zinf_engine {
  std::unique_ptr<zinf::cuda::Device> device;
  zinf::cuda::Stream stream;
  zinf::cuda::AdoptedStream adopted;
  std::unique_ptr<zinf::dist::Collectives> comm;
  std::unique_ptr<off::OffloadEngine> engine;
  std::unique_ptr<zinf::dist::ShardedEngine> sharded;
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

// Calls `body` with the handle's engine, an OffloadEngine or a ShardedEngine: their members of
// the same name have the same meaning for the whole model (the sharded one's are collective).
template <typename Body>
decltype(auto) visit(zinf_engine* engine, const char* function, Body&& body) {
  require(engine != nullptr, function, "engine is NULL");
  if (engine->sharded) return body(*engine->sharded);
  return body(*engine->engine);
}

// The one-rank engine, or the local engine of a sharded one's rank (its hyper-parameters are
// every layer's: the slices keep their layer's).
off::OffloadEngine& local_of(zinf_engine* engine, const char* function) {
  require(engine != nullptr, function, "engine is NULL");
  return engine->sharded ? engine->sharded->local() : *engine->engine;
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
template <typename Engine>
std::uint64_t checked_numel(Engine& engine, std::size_t layer, std::size_t count,
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

// An engine's handle before its engine: the caller's config parsed and its options applied,
// the layers, the device and the compute stream.
struct Prepared {
  off::EngineConfig config;
  std::vector<off::LayerSpec> specs;
  std::unique_ptr<zinf_engine> handle;
};

Prepared prepare(off::EngineConfig (*read)(const char*), const char* config,
                 const zinf_layer_spec* layers, std::size_t layer_count,
                 const zinf_engine_options& opts, const char* function) {
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
    specs.push_back(
        off::LayerSpec{layers[i].name, layers[i].numel, dtype_of(layers[i].param_dtype, function)});
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
  return Prepared{std::move(parsed), std::move(specs), std::move(handle)};
}

zinf_status create(off::EngineConfig (*read)(const char*), const char* config,
                   const zinf_layer_spec* layers, std::size_t layer_count,
                   const zinf_engine_options* options, zinf_engine** out, const char* function) {
  return guarded(nullptr, [&] {
    require(config != nullptr, function, "config is NULL");
    require(out != nullptr, function, "out is NULL");
    require(layers != nullptr || layer_count == 0, function, "layers is NULL");
    const zinf_engine_options opts = read_options(options, function);
    Prepared p = prepare(read, config, layers, layer_count, opts, function);
    zinf_engine& h = *p.handle;
    h.engine = std::make_unique<off::OffloadEngine>(std::move(p.config), std::move(p.specs),
                                                    *h.device, h.compute());
    *out = p.handle.release();
  });
}

// What each rank of zinf_engine_create_mpi tells the others once it has built its engine (or
// failed to): its ErrorCode (0: built), and the model as it sees it.
struct RankReport {
  std::int64_t code = 0;
  std::int64_t stage = 0;
  std::int64_t layers = 0;
  std::int64_t elements = 0;
};

std::string describe(const RankReport& r) {
  return "zero_optimization.stage " + std::to_string(r.stage) + ", " + std::to_string(r.layers) +
         " layers of " + std::to_string(r.elements) + " elements";
}

// Collective: every rank's report, so that all of them fail if one did (none goes on into the
// engine's first collective alone) or if their models differ. Rethrows this rank's own failure.
void agree(zinf::dist::Collectives& comm, const RankReport& mine, std::exception_ptr failure,
           const char* function) {
  constexpr std::size_t kFields = sizeof(RankReport) / sizeof(std::int64_t);
  const std::int64_t own[kFields] = {mine.code, mine.stage, mine.layers, mine.elements};
  std::vector<std::int64_t> all(kFields * static_cast<std::size_t>(comm.size()));
  try {
    zinf::dist::all_gather<std::int64_t>(comm, own, all);
  } catch (...) {
    if (failure) std::rethrow_exception(failure);  // says more than the group's failure
    throw;
  }
  if (failure) std::rethrow_exception(failure);
  std::vector<RankReport> reports;
  for (std::size_t r = 0; r < static_cast<std::size_t>(comm.size()); ++r) {
    const std::int64_t* f = all.data() + r * kFields;
    reports.push_back({f[0], f[1], f[2], f[3]});
  }
  std::string failed;
  int count = 0;
  zinf::ErrorCode first = zinf::ErrorCode::kOk;
  for (std::size_t r = 0; r < reports.size(); ++r) {
    if (reports[r].code == 0) continue;
    const auto code = static_cast<zinf::ErrorCode>(reports[r].code);
    if (count == 0) first = code;
    failed +=
        (count++ == 0 ? "" : ", ") + std::to_string(r) + ": " + zinf_status_name(status_of(code));
  }
  if (count > 0) {
    throw zinf::IoError(
        zinf::Status::error(first, std::to_string(count) + " of " + std::to_string(comm.size()) +
                                       " ranks failed (rank" + (count > 1 ? "s " : " ") + failed +
                                       "); this rank (" + std::to_string(comm.rank()) + ") did not")
            .with_operation(function));
  }
  for (std::size_t r = 1; r < reports.size(); ++r) {
    const RankReport& a = reports[0];
    const RankReport& b = reports[r];
    if (a.stage != b.stage || a.layers != b.layers || a.elements != b.elements) {
      throw zinf::UsageError(std::string(function) + ": the ranks' models differ: rank 0 has " +
                             describe(a) + ", rank " + std::to_string(r) + " " + describe(b) +
                             " (every rank passes the same config and layers)");
    }
  }
}

zinf_status create_mpi(const char* config, const zinf_layer_spec* layers, std::size_t layer_count,
                       const zinf_engine_options* options, int mpi_comm, zinf_engine** out,
                       const char* function) {
  return guarded(nullptr, [&] {
    require(config != nullptr, function, "config is NULL");
    require(out != nullptr, function, "out is NULL");
    require(layers != nullptr || layer_count == 0, function, "layers is NULL");
    const zinf_engine_options opts = read_options(options, function);
    if (const std::string why = zinf::dist::mpi_unavailable_reason(); !why.empty()) {
      throw zinf::UsageError(std::string(function) + ": " + why);
    }
    // First the communicator (collective), so that a rank whose config or layers fail below
    // still meets the others in agree() rather than leaving them in the duplication.
    std::unique_ptr<zinf::dist::Collectives> comm;
    try {
      zinf::dist::MpiCollectivesOptions mpi;
      mpi.fortran_comm = mpi_comm;
      comm = zinf::dist::make_mpi_collectives(mpi);
    } catch (const zinf::UsageError& e) {
      throw zinf::UsageError(std::string(function) + ": " + e.what());
    }
    RankReport mine;
    std::exception_ptr failure;
    std::unique_ptr<zinf_engine> handle;
    try {
      Prepared p = prepare([](const char* json) { return off::parse_config(json); }, config, layers,
                           layer_count, opts, function);
      mine.stage = p.config.zero_stage;
      mine.layers = static_cast<std::int64_t>(p.specs.size());
      for (const off::LayerSpec& l : p.specs) mine.elements += static_cast<std::int64_t>(l.numel);
      zinf_engine& h = *p.handle;
      h.sharded = std::make_unique<zinf::dist::ShardedEngine>(
          std::move(p.config), std::move(p.specs), *h.device, h.compute(), *comm);
      handle = std::move(p.handle);
    } catch (...) {
      failure = std::current_exception();
      mine.code = static_cast<std::int64_t>(zinf::status_from_current_exception().code());
    }
    agree(*comm, mine, failure, function);
    // Destroyed after the engine (declared before it).
    handle->comm = std::move(comm);
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

zinf_status zinf_engine_create_mpi(const char* config_json, const zinf_layer_spec* layers,
                                   size_t layer_count, const zinf_engine_options* options,
                                   int mpi_comm, zinf_engine** out) {
  return create_mpi(config_json, layers, layer_count, options, mpi_comm, out,
                    "zinf_engine_create_mpi");
}

void zinf_engine_destroy(zinf_engine* engine) {
  // ~OffloadEngine, ~ShardedEngine, ~Collectives, ~Stream, ~AdoptedStream and ~Device never
  // throw (their contracts); delete cannot either.
  delete engine;
}

const char* zinf_engine_last_error(const zinf_engine* engine) {
  return engine != nullptr ? engine->last_error.c_str() : "";
}

zinf_status zinf_engine_layer_count(const zinf_engine* engine, size_t* count) {
  zinf_engine* h = const_cast<zinf_engine*>(engine);
  return guarded(h, [&] {
    const char* fn = "zinf_engine_layer_count";
    visit(h, fn, [&](auto& e) {
      require(count != nullptr, fn, "count is NULL");
      *count = e.layer_count();
    });
  });
}

zinf_status zinf_engine_device_kind(const zinf_engine* engine, zinf_device_kind* kind) {
  return guarded(const_cast<zinf_engine*>(engine), [&] {
    const char* fn = "zinf_engine_device_kind";
    require(engine != nullptr, fn, "engine is NULL");
    require(kind != nullptr, fn, "kind is NULL");
    *kind = engine->device->kind() == zinf::cuda::DeviceKind::kCuda ? ZINF_DEVICE_CUDA
                                                                    : ZINF_DEVICE_HOST;
  });
}

zinf_status zinf_engine_set_master_weights(zinf_engine* engine, size_t layer, const float* weights,
                                           size_t count) {
  return guarded(engine, [&] {
    const char* fn = "zinf_engine_set_master_weights";
    visit(engine, fn, [&](auto& e) {
      require(weights != nullptr, fn, "weights is NULL");
      checked_numel(e, layer, count, fn);
      e.set_master_weights(layer, std::span<const float>(weights, count));
    });
  });
}

zinf_status zinf_engine_read_master_weights(zinf_engine* engine, size_t layer, float* out,
                                            size_t count) {
  return guarded(engine, [&] {
    const char* fn = "zinf_engine_read_master_weights";
    visit(engine, fn, [&](auto& e) {
      require(out != nullptr, fn, "out is NULL");
      checked_numel(e, layer, count, fn);
      e.read_master_weights(layer, std::span<float>(out, count));
    });
  });
}

zinf_status zinf_engine_fetch(zinf_engine* engine, size_t layer, void** data, size_t* bytes) {
  return guarded(engine, [&] {
    const char* fn = "zinf_engine_fetch";
    visit(engine, fn, [&](auto& e) {
      require(data != nullptr, fn, "data is NULL");
      require(bytes != nullptr, fn, "bytes is NULL");
      const zinf::cuda::DeviceSpan span = e.fetch(layer);
      // Without a stream of its own the caller cannot be ordered after the copy on the
      // device, so the parameters must be in place when the call returns. With the caller's
      // stream, fetch has already made that stream wait for them: returning now is the
      // overlap.
      if (!engine->has_callers_stream()) engine->device->synchronize(engine->stream.ref());
      *data = span.data();
      *bytes = span.size();
    });
  });
}

zinf_status zinf_engine_release(zinf_engine* engine, size_t layer) {
  return guarded(engine,
                 [&] { visit(engine, "zinf_engine_release", [&](auto& e) { e.release(layer); }); });
}

zinf_status zinf_engine_set_gradients(zinf_engine* engine, size_t layer, const void* grads,
                                      size_t count, zinf_dtype dtype) {
  return guarded(engine, [&] {
    const char* fn = "zinf_engine_set_gradients";
    visit(engine, fn, [&](auto& e) {
      require(grads != nullptr, fn, "grads is NULL");
      const zinf::ElementType type = dtype_of(dtype, fn);
      checked_numel(e, layer, count, fn);
      e.set_gradients(layer, adam::GradView{grads, count, type});
    });
  });
}

zinf_status zinf_engine_step(zinf_engine* engine, zinf_step_stats* out) {
  return guarded(engine, [&] {
    const off::StepStats s = visit(engine, "zinf_engine_step", [](auto& e) { return e.step(); });
    if (out != nullptr) *out = to_c(s);
  });
}

zinf_status zinf_engine_set_gradients_device(zinf_engine* engine, size_t layer,
                                             const void* device_grads, size_t count,
                                             zinf_dtype dtype) {
  return guarded(engine, [&] {
    const char* fn = "zinf_engine_set_gradients_device";
    visit(engine, fn, [&](auto& e) {
      require(device_grads != nullptr, fn, "device_grads is NULL");
      const zinf::ElementType type = dtype_of(dtype, fn);
      checked_numel(e, layer, count, fn);
      const zinf::cuda::DeviceSpan span = zinf::cuda::adopt_device_memory(
          *engine->device, const_cast<void*>(device_grads), count * zinf::element_size(type));
      e.set_gradients(layer, span, type);
    });
  });
}

zinf_status zinf_engine_get_hyper(const zinf_engine* engine, zinf_adam_params* out) {
  zinf_engine* h = const_cast<zinf_engine*>(engine);
  return guarded(h, [&] {
    const char* fn = "zinf_engine_get_hyper";
    const off::OffloadEngine& e = local_of(h, fn);
    require(out != nullptr, fn, "out is NULL");
    *out = to_c(e.hyper());
  });
}

zinf_status zinf_engine_loss_scale(const zinf_engine* engine, double* out) {
  zinf_engine* h = const_cast<zinf_engine*>(engine);
  return guarded(h, [&] {
    const char* fn = "zinf_engine_loss_scale";
    const off::OffloadEngine& e = local_of(h, fn);
    require(out != nullptr, fn, "out is NULL");
    *out = e.loss_scale();
  });
}

zinf_status zinf_engine_get_layer_hyper(const zinf_engine* engine, size_t layer,
                                        zinf_adam_params* out) {
  zinf_engine* h = const_cast<zinf_engine*>(engine);
  return guarded(h, [&] {
    const char* fn = "zinf_engine_get_layer_hyper";
    const off::OffloadEngine& e = local_of(h, fn);
    require(out != nullptr, fn, "out is NULL");
    *out = to_c(e.hyper(layer));
  });
}

zinf_status zinf_engine_set_hyper(zinf_engine* engine, const zinf_adam_params* params) {
  return guarded(engine, [&] {
    const char* fn = "zinf_engine_set_hyper";
    const adam::AdamParams hyper = from_c(params, local_of(engine, fn).hyper(), fn);
    visit(engine, fn, [&](auto& e) { e.set_hyper(hyper); });
  });
}

zinf_status zinf_engine_set_layer_hyper(zinf_engine* engine, size_t layer,
                                        const zinf_adam_params* params) {
  return guarded(engine, [&] {
    const char* fn = "zinf_engine_set_layer_hyper";
    const adam::AdamParams hyper = from_c(params, local_of(engine, fn).hyper(layer), fn);
    visit(engine, fn, [&](auto& e) { e.set_hyper(layer, hyper); });
  });
}

zinf_status zinf_engine_save(zinf_engine* engine, const char* dir) {
  return guarded(engine, [&] {
    const char* fn = "zinf_engine_save";
    visit(engine, fn, [&](auto& e) {
      require(dir != nullptr, fn, "dir is NULL");
      require(dir[0] != '\0', fn, "dir is empty");
      e.save(dir);
    });
  });
}

zinf_status zinf_engine_save_async(zinf_engine* engine, const char* dir) {
  return guarded(engine, [&] {
    const char* fn = "zinf_engine_save_async";
    off::OffloadEngine& e = local_of(engine, fn);
    require(!engine->sharded, fn,
            "a sharded engine (zinf_engine_create_mpi) has no asynchronous save; use "
            "zinf_engine_save");
    require(dir != nullptr, fn, "dir is NULL");
    require(dir[0] != '\0', fn, "dir is empty");
    e.save_async(dir);
  });
}

zinf_status zinf_engine_wait_save(zinf_engine* engine) {
  // A sharded engine never has a save in flight: its local engine's wait returns at once.
  return guarded(engine, [&] { local_of(engine, "zinf_engine_wait_save").wait_save(); });
}

zinf_status zinf_engine_last_save_snapshot(const zinf_engine* engine, zinf_save_snapshot* out) {
  zinf_engine* h = const_cast<zinf_engine*>(engine);
  return guarded(h, [&] {
    const char* fn = "zinf_engine_last_save_snapshot";
    const off::OffloadEngine& e = local_of(h, fn);
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
    visit(engine, fn, [&](auto& e) {
      require(dir != nullptr, fn, "dir is NULL");
      require(dir[0] != '\0', fn, "dir is empty");
      e.load(dir);
    });
  });
}

zinf_status zinf_engine_stats(const zinf_engine* engine, zinf_stats* out) {
  zinf_engine* h = const_cast<zinf_engine*>(engine);
  return guarded(h, [&] {
    const char* fn = "zinf_engine_stats";
    const off::OffloadEngine& local = local_of(h, fn);
    require(out != nullptr, fn, "out is NULL");
    const std::size_t size = declared_size(out->struct_size, ZINF_STATS_SIZE_V1, fn, "out");
    // A sharded engine's: this rank's engine's, with the last step's collectives.
    const off::EngineStats s = h->sharded ? h->sharded->stats() : local.stats();
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
    c.loss_scale = local.loss_scale();
    c.grad_bytes_to_host = s.grad_bytes_to_host;
    c.grad_staging_wait_seconds = s.grad_staging_wait_seconds;
    c.last_step_allgather_bytes = s.last_step.allgather_bytes;
    c.last_step_reduce_scatter_bytes = s.last_step.reduce_scatter_bytes;
    c.last_step_all_reduce_bytes = s.last_step.all_reduce_bytes;
    c.zero_stage = static_cast<std::uint64_t>(h->sharded ? h->sharded->zero_stage()
                                                         : local.config().zero_stage);
    // Only the caller's fields: an older caller's struct ends before ours does.
    std::memcpy(out, &c, c.struct_size);
    if (size > sizeof c)
      std::memset(reinterpret_cast<unsigned char*>(out) + sizeof c, 0, size - sizeof c);
  });
}

}  // extern "C"
