/* SPDX-License-Identifier: Apache-2.0
 * zinf.h: the C API of zinf's OffloadEngine, for callers in C and in other languages (ctypes,
 * cffi, FFI). C99, no C++ types; every function is in libzinf.so (link -lzinf, or
 * find_package(zinf) -> zinf::zinf). It wraps zinf/offload/engine.h; read that header's class
 * comment for what the engine does per iteration.
 *
 * Contract, for every function:
 * - Errors. Every function that can fail returns a zinf_status; ZINF_OK (0) is success. On
 *   failure the message (one line, the same text as the C++ exception's what(), naming path,
 *   offset, length and errno where there are some) is available from zinf_last_error() on the
 *   calling thread and, for calls on an engine, from zinf_engine_last_error(engine). A
 *   successful call leaves both messages as they were. Out-parameters are written only on
 *   success. No C++ exception ever leaves a zinf_ function (std::bad_alloc included: it is
 *   ZINF_ERR_NO_MEMORY).
 * - Threads. An engine is used by one thread at a time (the caller serialises); different
 *   engines may be used from different threads at once. zinf_version, zinf_status_name and
 *   zinf_last_error are thread-safe. The engine runs its own threads (I/O, optimizer, device
 *   streams); they never call back into the caller.
 * - Ownership and lifetimes. zinf_engine_create* returns an engine the caller owns and ends
 *   with zinf_engine_destroy. Every pointer the caller passes in is read during the call only,
 *   except gradients (see zinf_engine_set_gradients) and the compute stream (see
 *   zinf_engine_options). Strings returned by the library are owned by it and valid as each
 *   function says.
 * - NULL. A NULL engine or a NULL required pointer is ZINF_ERR_USAGE (never a crash).
 * - Structs that grow. zinf_engine_options and zinf_stats start with `struct_size`, which the
 *   caller sets to sizeof the struct as it compiled it; 0 means the first version's size
 *   (ZINF_*_SIZE_V1), so a zero-initialised struct works. The library reads (options) or
 *   writes (stats) only the fields that size covers, and uses the defaults for the rest. A
 *   nonzero size below the first version's is ZINF_ERR_USAGE naming the struct, with nothing
 *   read or written. A size beyond the library's own (a caller built against a newer zinf.h):
 *   options are accepted if the bytes this library does not know are all zero (else
 *   ZINF_ERR_USAGE: they ask for something it cannot do); stats past the library's fields
 *   are zeroed. Fields are only ever appended.
 * - Several ranks. zinf_engine_create_mpi makes an engine that is one rank of a ZeRO-sharded
 *   engine (zinf::dist::ShardedEngine) over the caller's MPI communicator. Every other function
 *   takes it as it takes a one-rank engine, with the same meaning for the whole model: the
 *   handle carries either engine, so the header grows by one function rather than a parallel
 *   set (its comment says which calls are collective and what a sharded engine does not
 *   offer). The header needs no mpi.h: the communicator travels as its Fortran handle.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** How the last zinf_engine_save_async took its snapshot of the optimizer state
 *  (zinf_engine_last_save_snapshot). Values are stable. */
typedef enum zinf_save_snapshot {
  ZINF_SAVE_SNAPSHOT_NONE = 0,    /**< no zinf_engine_save_async yet */
  ZINF_SAVE_SNAPSHOT_REFLINK = 1, /**< cloned from the swap files (XFS, btrfs): steps copy
                                       nothing for the save */
  ZINF_SAVE_SNAPSHOT_STREAMED = 2 /**< streamed: a step copies each record the save has not
                                       written yet before it overwrites it */
} zinf_save_snapshot;

/** The outcome of a call. The values are stable (part of the ABI); new ones are appended. */
typedef enum zinf_status {
  ZINF_OK = 0,
  ZINF_ERR_USAGE = 1,      /**< misuse: bad config, bad argument, wrong size, call order */
  ZINF_ERR_IO = 2,         /**< a storage operation failed (errno in the message) */
  ZINF_ERR_NO_SPACE = 3,   /**< ENOSPC/EDQUOT: a drive or quota is full */
  ZINF_ERR_NOT_FOUND = 4,  /**< ENOENT/ENODEV: a file or directory does not exist */
  ZINF_ERR_PERMISSION = 5, /**< EACCES/EPERM/EROFS */
  ZINF_ERR_CORRUPT = 6,    /**< a checksum mismatch or an inconsistent file on disk */
  ZINF_ERR_DEVICE = 7,     /**< the device (CUDA or its host simulation) failed */
  ZINF_ERR_FAILED = 8,     /**< the engine is failed by an earlier error; destroy it */
  ZINF_ERR_NO_MEMORY = 9,  /**< host memory allocation failed */
  ZINF_ERR_INTERNAL = 10   /**< anything else (a bug: please report the message) */
} zinf_status;

/** Element types. Values are stable. */
typedef enum zinf_dtype {
  ZINF_DTYPE_F32 = 0,  /**< IEEE fp32 */
  ZINF_DTYPE_BF16 = 1, /**< bfloat16, as raw uint16_t bits */
  ZINF_DTYPE_F16 = 2   /**< IEEE fp16, as raw uint16_t bits */
} zinf_dtype;

/** Which device backend an engine runs on. Values are stable; 0 is the default, as in C++. */
typedef enum zinf_device_kind {
  ZINF_DEVICE_AUTO = 0, /**< CUDA if a GPU is visible, else the host simulation (with a notice
                             saying why): the default, as zinf::cuda::make_device's */
  ZINF_DEVICE_CUDA = 1, /**< a CUDA GPU, or ZINF_ERR_DEVICE saying why there is none */
  ZINF_DEVICE_HOST = 2  /**< the host simulation: "device" memory is host memory */
} zinf_device_kind;

/** One layer (parameter shard) the engine manages. */
typedef struct zinf_layer_spec {
  const char* name;       /**< unique, not empty; copied */
  uint64_t numel;         /**< elements, > 0 */
  zinf_dtype param_dtype; /**< the device copy's type: ZINF_DTYPE_BF16 or ZINF_DTYPE_F16 */
} zinf_layer_spec;

/** How the optimizer stores Adam's moments (the config's "zinf": {"state_precision"}). */
typedef enum zinf_state_precision {
  ZINF_STATE_PRECISION_CONFIG = 0, /**< as the config says (default "fp32") */
  ZINF_STATE_PRECISION_FP32 = 1,   /**< fp32 moments: 12 bytes per parameter with the master */
  ZINF_STATE_PRECISION_BF16 = 2,   /**< bf16 moments: 8 bytes per parameter */
  ZINF_STATE_PRECISION_INT8 = 3    /**< 8-bit codes, a scale per 64: 6.125 bytes per parameter */
} zinf_state_precision;

/** How to build an engine beyond its config. All-zero (or NULL) means the defaults: the same
 *  device as C++ picks (ZINF_DEVICE_AUTO), device 0, the engine's own stream. */
typedef struct zinf_engine_options {
  /** sizeof(zinf_engine_options) as the caller compiled it, or 0 for
   *  ZINF_ENGINE_OPTIONS_SIZE_V1 (see "Structs that grow" above). */
  size_t struct_size;
  zinf_device_kind device; /**< default ZINF_DEVICE_AUTO */
  int device_index;        /**< CUDA device ordinal; ignored by the host simulation */
  /** The caller's compute stream, or NULL for one the engine makes itself (the default).
   *  - CUDA: a cudaStream_t of the device `device_index` names (another device's stream is
   *    ZINF_ERR_USAGE). The default stream is spelled cudaStreamLegacy or cudaStreamPerThread,
   *    as NULL means "none".
   *  - Host simulation (tests): a host stream's native handle (zinf::cuda::native_stream of a
   *    host device's Stream, zinf/cuda/cuda_interop.h); anything else is ZINF_ERR_USAGE.
   *  The engine orders its work into this stream (zinf_engine_fetch) and never destroys it:
   *  it must outlive the engine. zinf_engine_destroy waits for everything enqueued on it so
   *  far. With ZINF_DEVICE_AUTO, the handle must be of the kind the engine ends up on. */
  void* compute_stream;
  /* Version 2 (ZINF_ENGINE_OPTIONS_SIZE_V2): */
  /** Overrides the config's zinf.state_precision unless ZINF_STATE_PRECISION_CONFIG (the
   *  default); another value is ZINF_ERR_USAGE. The fp32 master weights are kept in every
   *  mode; an engine checkpoint of another precision is refused on load. */
  zinf_state_precision state_precision;
  /* Later versions append fields here. */
} zinf_engine_options;

/** The first version of zinf_engine_options: struct_size .. compute_stream. */
#define ZINF_ENGINE_OPTIONS_SIZE_V1 (offsetof(zinf_engine_options, compute_stream) + sizeof(void*))
/** The second version: every field above. */
#define ZINF_ENGINE_OPTIONS_SIZE_V2 \
  (offsetof(zinf_engine_options, state_precision) + sizeof(zinf_state_precision))

/** The optimizer's figures for one step (zinf::optim::StepStats). */
typedef struct zinf_step_stats {
  uint64_t step;          /**< step number, from 1 */
  uint64_t sub_groups;    /**< sub-groups updated */
  uint64_t elements;      /**< elements updated */
  double seconds;         /**< wall time of the step */
  double read_seconds;    /**< time with a state read in flight */
  double write_seconds;   /**< time with a write-back in flight */
  double compute_seconds; /**< time inside the CPU Adam kernel */
  double wait_seconds;    /**< time waiting for a read or a free buffer */
  uint64_t bytes_read;    /**< optimizer state bytes read */
  uint64_t bytes_written; /**< optimizer state bytes written */
} zinf_step_stats;

/** Counters since the engine was made (zinf::offload::EngineStats). Fields are only ever
 *  appended. */
typedef struct zinf_stats {
  /** In: sizeof(zinf_stats) as the caller compiled it, or 0 for ZINF_STATS_SIZE_V1 (see
   *  "Structs that grow" above). Out: the bytes the library wrote (the smaller of that size
   *  and its own), so a caller built against a newer zinf.h sees which fields are real. */
  size_t struct_size;
  uint64_t steps;
  uint64_t param_bytes_read;
  uint64_t param_bytes_written;
  uint64_t param_bytes_to_device;
  uint64_t optimizer_bytes_read;
  uint64_t optimizer_bytes_written;
  double nvme_read_gbps;  /**< optimizer state: 10^9 bytes/s while a read was in flight */
  double nvme_write_gbps; /**< optimizer state: 10^9 bytes/s while a write was in flight */
  double stall_seconds;   /**< compute waiting for parameters */
  double step_seconds;    /**< total time inside step */
  uint64_t prefetch_hits;
  uint64_t prefetch_on_demand;
  uint64_t pinned_bytes;
  uint64_t pinned_bytes_peak;
  zinf_step_stats last_step;
  /** Parameters (offload_param "nvme"): 10^9 bytes/s read from NVMe while the prefetcher had a
   *  read in flight; 0 for the other parameter tiers. */
  double param_read_gbps;
  /* Version 2 (ZINF_STATS_SIZE_V2): */
  uint64_t skipped_steps;           /**< staged mode: steps skipped on overflow (inf/NaN) */
  uint64_t last_step_skipped;       /**< 1 if the last step() was skipped, else 0 */
  double last_global_grad_norm;     /**< staged mode: the last step's unscaled gradient norm */
  double last_grad_scale_applied;   /**< min(1, clip / (norm + 1e-6)) / loss scale; 1 outside
                                         the staged mode, 0 for a skipped step */
  double loss_scale;                /**< what to multiply the next loss by (1 without fp16) */
  uint64_t grad_bytes_to_host;      /**< device gradients copied to pinned staging */
  double grad_staging_wait_seconds; /**< set_gradients_device waiting for a staging buffer */
  /* Version 3 (ZINF_STATS_SIZE_V3): */
  /** The last zinf_engine_step's data-parallel collectives on this rank, in bytes: what a ring
   *  algorithm moves into the rank, (N - 1) / N of each buffer padded to a multiple of the
   *  world size N, twice that for an all-reduce; the figures `zinf plan` prints per step and
   *  GPU (allgather_bytes_per_step_per_gpu; grad_reduce_bytes_per_step_per_gpu is
   *  reduce-scatter + all-reduce). They count the fetches, set_gradients and step since the
   *  step before it: parameters all-gathered (stage 3: at each fetch; 1 and 2: once in step),
   *  gradients reduce-scattered (stages 2 and 3) or all-reduced (stage 1). 0 before the first
   *  step, on one rank and for a zinf_engine_create engine, which has no collectives. */
  uint64_t last_step_allgather_bytes;
  uint64_t last_step_reduce_scatter_bytes;
  uint64_t last_step_all_reduce_bytes;
  /** The config's zero_optimization.stage (0 to 3), the one a sharded engine works at; a
   *  zinf_engine_create engine reports it as configured (one rank: it changes nothing). */
  uint64_t zero_stage;
  /* Later versions append fields here. */
} zinf_stats;

/** The first version of zinf_stats: every field up to param_read_gbps. */
#define ZINF_STATS_SIZE_V1 (offsetof(zinf_stats, param_read_gbps) + sizeof(double))
/** The second: up to grad_staging_wait_seconds. */
#define ZINF_STATS_SIZE_V2 (offsetof(zinf_stats, grad_staging_wait_seconds) + sizeof(double))
/** The third: up to zero_stage. */
#define ZINF_STATS_SIZE_V3 (offsetof(zinf_stats, zero_stage) + sizeof(uint64_t))

/** Adam hyper-parameters (zinf::adam::AdamParams, less the step number the engine keeps).
 *  The kernel computes in fp32, so each value must be finite as an fp32 (FLT_MAX is
 *  3.4028235e38; NaN and infinities are refused). */
typedef struct zinf_adam_params {
  double lr;           /**< in [0, FLT_MAX] */
  double beta1;        /**< in [0, 1) */
  double beta2;        /**< in [0, 1) */
  double eps;          /**< in [1e-45, FLT_MAX]: > 0 once rounded to fp32 */
  double weight_decay; /**< in [0, FLT_MAX], and lr * weight_decay <= FLT_MAX */
  int bias_correction; /**< nonzero: divide by 1 - beta^step */
  double grad_scale;   /**< in [1e-45, FLT_MAX]: gradients are multiplied by this (1/loss scale) */
  int adamw;           /**< nonzero: decoupled weight decay (AdamW) */
} zinf_adam_params;

/** An engine: opaque, owned by the caller. */
typedef struct zinf_engine zinf_engine;

/** Returns the library version ("0.1.0"). Static storage. */
const char* zinf_version(void);
/** Returns the lower-case name of `status` ("ok", "usage", "no_space", ...; "unknown" for a
 *  value not in the enum). Static storage. */
const char* zinf_status_name(zinf_status status);
/** Returns the message of the latest failed zinf_ call on this thread, or "" if none has
 *  failed. Valid until the next failed zinf_ call on this thread. */
const char* zinf_last_error(void);

/** Builds an engine from a DeepSpeed-style JSON config (text, `config_json`) and a layer
 *  table. Parses the config (ZINF_ERR_USAGE with the reader's message for malformed JSON, an
 *  unknown key, a value out of range such as 1e309 or an infinite lr, a contradiction, more
 *  than 16 MiB of text or more than 64 levels of nesting: docs/config.md "Limits"), makes the
 *  device, checks the config against the layers and
 *  creates the swap files (ZINF_ERR_NO_SPACE etc.). `options` may be NULL (the defaults);
 *  ZINF_ERR_USAGE for a bad options->struct_size (see "Structs that grow"). Blocks. On
 *  success *out is the new engine; on failure *out is left as it was. */
zinf_status zinf_engine_create(const char* config_json, const zinf_layer_spec* layers,
                               size_t layer_count, const zinf_engine_options* options,
                               zinf_engine** out);
/** As zinf_engine_create, with the config read from the file `config_path` (ZINF_ERR_NOT_FOUND
 *  etc. naming it if it cannot be read; ZINF_ERR_USAGE naming it, without reading or blocking,
 *  if it is not a regular file: a FIFO, device, directory or socket). */
zinf_status zinf_engine_create_from_file(const char* config_path, const zinf_layer_spec* layers,
                                         size_t layer_count, const zinf_engine_options* options,
                                         zinf_engine** out);
/** As zinf_engine_create (the config as JSON text), for one rank of a data-parallel group: the
 *  engine is this rank's share of a ZeRO-sharded engine (zinf::dist::ShardedEngine,
 *  docs/distributed.md) over the MPI communicator whose Fortran handle is `mpi_comm`
 *  (MPI_Comm_c2f(comm), an MPI_Fint; mpi4py: comm.py2f()), which libzinf turns back into the
 *  communicator with MPI_Comm_f2c. It works on a duplicate; the caller's communicator and its
 *  error handler are left alone.
 *  - What it does. Every rank passes the same config and layer table (full sizes). Each rank
 *    keeps 1/N of every layer's fp32 master weights and Adam moments (N the communicator's
 *    size), in the config's optimizer tier under `rank<R>` folders of its NVMe paths, and
 *    averages the ranks' gradients into its slice; zero_optimization.stage 3 also keeps 1/N
 *    of the parameters and all-gathers a layer at each fetch, stages 1 and 2 keep every layer
 *    whole and all-gather the updated slices once per step (stage 1 all-reduces gradients,
 *    2 and 3 reduce-scatter them). The weights are the same bitwise at every stage and on one
 *    rank (fed the average) where the average is exact. Stage 0 on several ranks is
 *    ZINF_ERR_USAGE (plain data parallelism is not offered); parameter offload needs stage 3.
 *    zinf_stats (version 3) reports each step's collective bytes and the stage.
 *  - The other functions, on such an engine: the whole model's layers as with
 *    zinf_engine_create (fetch returns the full layer, set_gradients takes this rank's
 *    gradients of the full layer and master weights are read and set whole).
 *    Collective, so every rank makes the same calls in the same order: set_master_weights,
 *    read_master_weights, fetch (stage 3), set_gradients, set_gradients_device, step, save and
 *    load (dir/rank<R> per rank and a manifest; a checkpoint saved at one stage or world size
 *    loads at another). A rank's own I/O failure in these fails the call on every rank (the
 *    others: ZINF_ERR_IO naming the ranks that failed); a refused argument (NULL, a wrong
 *    count or layer) fails on its rank only, before any collective, and the job should then
 *    end as after any divergence between the ranks. set_hyper and set_layer_hyper are
 *    local: every rank must make the same ones. zinf_engine_save_async is ZINF_ERR_USAGE (a
 *    sharded engine saves synchronously); wait_save then has nothing to wait for and
 *    last_save_snapshot says ZINF_SAVE_SNAPSHOT_NONE. zinf_engine_stats: this rank's own
 *    I/O, with the step's collectives.
 *  - MPI. MPI is initialized by the caller (ZINF_ERR_USAGE if it is not, or is finalized) and
 *    finalized only after every such engine is destroyed; zinf calls MPI from the thread
 *    calling into the engine, so another thread than the one that initialized MPI needs
 *    MPI_THREAD_SERIALIZED, and engines used from several threads at once (the Threads rule
 *    above) MPI_THREAD_MULTIPLE. Each collective waits at most 10 minutes for the other ranks,
 *    then fails with ZINF_ERR_IO naming the ranks that did not answer; the group is then
 *    unusable and the job must end (MPI_Abort).
 *  - Collective: every rank of the communicator calls it. A rank's own failure (the config,
 *    the layers, the device, the swap files) fails the call on every rank: that rank returns
 *    its own status and message, the others the first failed rank's status with
 *    "zinf_engine_create_mpi failed: K of N ranks failed (rank R: <zinf_status_name>); this
 *    rank (Q) did not". A config or layer table whose stage, layer count or element count
 *    differs between ranks is ZINF_ERR_USAGE on every rank ("... the ranks' models differ").
 *  - Errors before any collective, on the rank that makes them (ZINF_ERR_USAGE, the message
 *    starting "zinf_engine_create_mpi: "): MPI not initialized; MPI_COMM_NULL's handle ("...
 *    fortran_comm <h> is MPI_COMM_NULL ..."), a handle that names no communicator (Open MPI:
 *    "... is not a valid communicator handle"; MPICH may abort through MPI_COMM_WORLD's error
 *    handler instead), an intercommunicator; and, where libzinf was built without MPI,
 *    "zinf_engine_create_mpi: zinf was built without MPI (ZINF_WITH_MPI=OFF, ...)" (never an
 *    engine that pretends).
 *  - Lifetime and threads as for any engine; zinf_engine_destroy frees the duplicates
 *    (MPI_Comm_free, which MPI calls collective: every rank destroys its engine). */
zinf_status zinf_engine_create_mpi(const char* config_json, const zinf_layer_spec* layers,
                                   size_t layer_count, const zinf_engine_options* options,
                                   int mpi_comm, zinf_engine** out);
/** Waits for the engine's work in flight, removes its swap files, frees everything. Never
 *  fails; NULL is a no-op. The engine and every pointer it returned are invalid afterwards. */
void zinf_engine_destroy(zinf_engine* engine);

/** Returns the message of the latest failed call on `engine` ("" if none; "" for NULL). Valid
 *  until the next failed call on `engine` or its destruction. */
const char* zinf_engine_last_error(const zinf_engine* engine);
/** Writes the number of layers to *count. */
zinf_status zinf_engine_layer_count(const zinf_engine* engine, size_t* count);
/** Writes the device the engine runs on to *kind: ZINF_DEVICE_CUDA or ZINF_DEVICE_HOST (what
 *  ZINF_DEVICE_AUTO became), i.e. whether fetched addresses are GPU or host memory. */
zinf_status zinf_engine_device_kind(const zinf_engine* engine, zinf_device_kind* kind);

/** Sets layer `layer`'s fp32 master weights from `weights` (`count` elements, which must be
 *  the layer's numel), zeroes its moments and writes its low-precision copy. Blocks. Outside
 *  an iteration (between step and the next fetch). */
zinf_status zinf_engine_set_master_weights(zinf_engine* engine, size_t layer, const float* weights,
                                           size_t count);
/** Copies layer `layer`'s fp32 master weights into `out` (`count` = the layer's numel).
 *  Blocks. Outside an iteration. */
zinf_status zinf_engine_read_master_weights(zinf_engine* engine, size_t layer, float* out,
                                            size_t count);

/** Makes layer `layer`'s parameters (numel elements of its param_dtype) present on the device
 *  and writes their device address to *data and their size in bytes to *bytes. Read-only for
 *  the caller; valid until zinf_engine_release(layer).
 *  - Without a compute stream (options.compute_stream NULL): blocks until the parameters are
 *    there, so any stream, or the host with ZINF_DEVICE_HOST, may read them at once. Every use
 *    of them must have completed before zinf_engine_release.
 *  - With the caller's compute stream: does not wait for the copy. The stream waits for it
 *    (device-side, as the C++ fetch does), so work enqueued on that stream after this call
 *    sees the parameters; anything else (another stream, or the host with ZINF_DEVICE_HOST)
 *    must wait for that stream first. The call still blocks while the layer's NVMe read is in
 *    flight or every parameter buffer is in use. zinf_engine_release orders itself after the
 *    work enqueued on the stream before it: uses on other streams must be ordered into the
 *    compute stream (an event) before that call. */
zinf_status zinf_engine_fetch(zinf_engine* engine, size_t layer, void** data, size_t* bytes);
/** Ends the caller's use of the parameters fetch returned for `layer`. Non-blocking. */
zinf_status zinf_engine_release(zinf_engine* engine, size_t layer);
/** Hands in `layer`'s gradients for this step: `count` (= numel) elements of `dtype` (fp32,
 *  or bf16/fp16 as raw bits) in host memory, and starts the layer's update at once. `grads`
 *  must stay valid and unchanged until zinf_engine_step returns. Each layer at most once per
 *  step, only while it is released. With the caller's compute stream, the gradients must
 *  already be complete in host memory (synchronise whatever copied them there): the update
 *  reads them from this call on, on the engine's own thread. */
zinf_status zinf_engine_set_gradients(zinf_engine* engine, size_t layer, const void* grads,
                                      size_t count, zinf_dtype dtype);
/** As zinf_engine_set_gradients, from device memory: `count` (= numel) elements of `dtype` at
 *  `device_grads` (memory of the engine's device from any allocator, e.g. PyTorch's), written
 *  by work enqueued on the compute stream before this call. The engine copies them to pinned
 *  staging on its own copy stream after that work, without blocking the host, and the layer's
 *  update starts when the copy has landed, so the copies overlap the rest of backward. Returns
 *  at once unless every staging buffer (config "zinf": {"grad_staging_buffers": N}, default 2)
 *  still holds gradients the update has not read. The memory must stay valid and unchanged
 *  until zinf_engine_step returns. ZINF_ERR_USAGE for memory that is not the device's (CUDA:
 *  checked with cudaPointerGetAttributes), grad_staging_buffers 0, and as the host variant; a
 *  failed copy fails zinf_engine_step as a failed read (the step did not happen). */
zinf_status zinf_engine_set_gradients_device(zinf_engine* engine, size_t layer,
                                             const void* device_grads, size_t count,
                                             zinf_dtype dtype);
/** Completes the step's updates (layers without gradients are not updated) and makes the new
 *  parameters what the next fetch returns. Writes the step's figures to *out unless it is
 *  NULL. A failed write-back leaves the engine failed (ZINF_ERR_FAILED from then on). */
zinf_status zinf_engine_step(zinf_engine* engine, zinf_step_stats* out);

/** Writes the hyper-parameters last set for every layer (the config's optimizer block, or the
 *  latest zinf_engine_set_hyper) to *out. */
zinf_status zinf_engine_get_hyper(const zinf_engine* engine, zinf_adam_params* out);
/** Sets every layer's hyper-parameters from the next step on (e.g. a learning-rate schedule),
 *  replacing layers' own sets too (to keep those, use zinf_engine_set_layer_hyper per layer).
 *  ZINF_ERR_USAGE, naming the field, for a value outside the ranges zinf_adam_params states
 *  (infinite or NaN included), or inside a step. A refused call changes nothing: the engine
 *  stays usable with its hyper-parameters and state as they were. */
zinf_status zinf_engine_set_hyper(zinf_engine* engine, const zinf_adam_params* params);

/** Writes the loss scale to multiply the next loss by to *out (config fp16.loss_scale, or the
 *  dynamic scale as steps adjust it; 1 without fp16 loss scaling). */
zinf_status zinf_engine_loss_scale(const zinf_engine* engine, double* out);
/** Writes the hyper-parameters layer `layer`'s next step uses to *out: the engine's, or the
 *  layer's own set (zinf_engine_set_layer_hyper). */
zinf_status zinf_engine_get_layer_hyper(const zinf_engine* engine, size_t layer,
                                        zinf_adam_params* out);
/** Sets layer `layer`'s own hyper-parameters from the next step on (e.g. weight_decay 0 for a
 *  bias or a norm); the other layers keep theirs. zinf_engine_set_hyper sets every layer's,
 *  these included. Refused as zinf_engine_set_hyper (nothing changes); saved and restored by
 *  checkpoints. */
zinf_status zinf_engine_set_layer_hyper(zinf_engine* engine, size_t layer,
                                        const zinf_adam_params* params);

/** Writes a checkpoint (master weights, moments, step count, hyper-parameters, layer table)
 *  under directory `dir`, atomically. Outside a step. Blocks. ZINF_ERR_USAGE for an empty
 *  `dir` (""). The first save or load locks `dir` for this engine until it is destroyed:
 *  another engine or process using it fails with ZINF_ERR_IO naming the directory and the
 *  holder's pid. */
zinf_status zinf_engine_save(zinf_engine* engine, const char* dir);
/** Starts the checkpoint zinf_engine_save writes and returns while a thread of the engine's
 *  writes it; steps may run meanwhile, and the checkpoint holds the state at this call, bitwise
 *  (OffloadEngine::save_async: before a step overwrites a record not yet written, it copies it
 *  for the save). A save still in flight is waited for first, and its failure is returned here
 *  (nothing new starts). ZINF_ERR_USAGE inside a step or for an empty `dir`. Until
 *  zinf_engine_wait_save, the save's own failure is not reported; zinf_engine_save,
 *  zinf_engine_load and zinf_engine_set_master_weights wait for it first and return it;
 *  zinf_engine_destroy finishes it. A kill at any point leaves the previous checkpoint
 *  loadable. */
zinf_status zinf_engine_save_async(zinf_engine* engine, const char* dir);
/** Waits for the zinf_engine_save_async in flight, if any, to be committed. ZINF_ERR_IO (the
 *  message names the file, offset and length) if it failed: the half-written version is
 *  removed and the previous checkpoint stays current. Reports a failure once. */
zinf_status zinf_engine_wait_save(zinf_engine* engine);
/** Writes how the last zinf_engine_save_async took its snapshot to *out
 *  (ZINF_SAVE_SNAPSHOT_NONE before the first): by reflink where the checkpoint directory is on
 *  the swap files' XFS or btrfs file system, else streamed, which costs the steps after it
 *  more (docs/engine.md, "Snapshot by reflink"). */
zinf_status zinf_engine_last_save_snapshot(const zinf_engine* engine, zinf_save_snapshot* out);
/** Restores what zinf_engine_save wrote (ZINF_ERR_USAGE if the layer table differs or `dir` is
 *  ""). Blocks. */
zinf_status zinf_engine_load(zinf_engine* engine, const char* dir);

/** Writes the engine's counters to *out, as far as out->struct_size covers them (set it
 *  first; ZINF_ERR_USAGE, writing nothing, for a size below ZINF_STATS_SIZE_V1). A sharded
 *  engine's (zinf_engine_create_mpi) are this rank's. */
zinf_status zinf_engine_stats(const zinf_engine* engine, zinf_stats* out);

#ifdef __cplusplus
} /* extern "C" */
#endif
