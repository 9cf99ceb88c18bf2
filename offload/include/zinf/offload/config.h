// SPDX-License-Identifier: Apache-2.0
// EngineConfig: what an OffloadEngine is built from, read from a DeepSpeed-style JSON config
// (ds_config.json) so that an existing ZeRO-Infinity configuration works as it is, plus zinf's
// own section. Parsing is strict: an unknown key is an error that suggests the closest known one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "zinf/adam/cpu_adam.h"
#include "zinf/common/element_type.h"
#include "zinf/swap/io_engine.h"

namespace zinf::offload {

/// Where a kind of state lives between uses (DeepSpeed's "device" of offload_param and
/// offload_optimizer).
enum class OffloadDevice : std::uint8_t {
  kNone,  ///< not offloaded: parameters stay on the device; optimizer state in host memory
  kCpu,   ///< pinned host memory
  kNvme,  ///< files on NVMe (one per configured path), streamed through pinned buffers
};
/// "none" | "cpu" | "nvme".
std::string_view offload_device_name(OffloadDevice device) noexcept;

/// zero_optimization.offload_param. DeepSpeed's defaults unless noted.
struct OffloadParamConfig {
  OffloadDevice device = OffloadDevice::kNone;
  std::string nvme_path;           ///< required for kNvme (or zinf.nvme_paths)
  bool pin_memory = true;          ///< zinf's staging is always page-locked; false is accepted
  std::uint32_t buffer_count = 5;  ///< parameter buffers in the prefetch window
  std::uint64_t buffer_size = 100'000'000;   ///< elements per buffer; >= the largest layer
  std::uint64_t max_in_cpu = 1'000'000'000;  ///< accepted (DeepSpeed's cpu cache); unused
};

/// zero_optimization.offload_optimizer.
struct OffloadOptimizerConfig {
  OffloadDevice device = OffloadDevice::kNone;
  std::string nvme_path;  ///< required for kNvme (or zinf.nvme_paths)
  bool pin_memory = true;
  std::uint32_t buffer_count = 4;  ///< the optimizer pipeline's ring (>= 3)
  bool pipeline_read = false;      ///< accepted; zinf always pipelines reads
  bool pipeline_write = false;     ///< accepted; zinf always pipelines writes
  bool fast_init = false;          ///< accepted; unused
  double ratio = 1.0;              ///< accepted; must be 1.0 (partial offload not built)
};

/// The top-level "aio" block. Absent keys take zinf's defaults (IoOptions), not DeepSpeed's
/// (queue_depth 8): the figures behind them are in docs/benchmarks.md.
struct AioConfig {
  std::uint32_t block_size = 1u << 20;  ///< bytes per engine piece (multiple of 4096)
  std::uint32_t queue_depth = 16;       ///< pieces in flight per engine
  std::uint32_t intra_op_parallelism =
      0;                       ///< threads backend workers, 0: queue_depth (alias thread_count)
  bool single_submit = false;  ///< accepted; zinf always submits in batches
  bool overlap_events = true;  ///< accepted; zinf always overlaps
  bool use_gds = false;        ///< true is an error (GPUDirect Storage not built)
};

/// How OffloadEngine applies gradients (zinf.step_mode).
enum class StepMode : std::uint8_t {
  /// kStaged if gradient_clipping > 0 or loss_scaling.enabled, else kOnArrival.
  kAuto,
  /// Each layer's update starts as soon as its gradients are handed in, overlapping backward.
  /// Cannot clip or unscale: both need every gradient of the step first.
  kOnArrival,
  /// Gradients are copied into engine-owned staging as they arrive, with their squared norm
  /// and a non-finite flag; step() then clips, unscales, or skips the step on overflow.
  kStaged,
};
/// "auto" | "on_arrival" | "staged".
std::string_view step_mode_name(StepMode mode) noexcept;

/// fp16 loss scaling: DeepSpeed's "fp16" block, in effect with fp16.enabled (staged mode).
/// Defaults are DeepSpeed's (deepspeed/runtime/precision_config.py).
struct LossScaleConfig {
  bool enabled = false;  ///< fp16.enabled: the trainer scales its loss by loss_scale()
  /// > 0: this static scale; 0: dynamic scaling. At most 2^126, so that 1/scale is a normal
  /// fp32.
  double loss_scale = 0;
  std::uint32_t initial_scale_power = 16;  ///< dynamic: start at 2^this (at most 126)
  /// Dynamic: double the scale after this many consecutive steps without overflow (>= 1).
  std::uint32_t loss_scale_window = 1000;
  /// Dynamic: overflows tolerated before the scale is halved, DeepSpeed's "delay shift" (>=
  /// 1; 1 halves at every overflow). The count refills when the scale grows, or after every
  /// step without overflow with consecutive_hysteresis.
  std::uint32_t hysteresis = 2;
  bool consecutive_hysteresis = false;
  double min_loss_scale = 1;  ///< dynamic: the scale never goes below this (finite, > 0)
};

/// The "zinf" section: settings DeepSpeed has no key for.
struct ZinfSection {
  /// Extra NVMe directories; the state is striped over nvme_path and these (one file each).
  std::vector<std::string> nvme_paths;
  /// The most pinned host memory the engine holds (optimizer ring + parameter staging +
  /// gradient staging).
  std::uint64_t pinned_budget_bytes = std::uint64_t{2} << 30;
  /// CRC32C per stripe of every swap file (optimizer state and parameters), verified on every
  /// read back: a step's state reads, a layer's fetch, a checkpoint save. On by default; a
  /// mismatch is IoError kCorrupt (file, offset, length, both CRCs) and the data is never
  /// used. With the nvme parameter tier it rounds sub_group_size up to a multiple of 524288
  /// elements (each sub-group's copy-out must be whole 1 MiB stripes). Opt out with
  /// "zinf": {"checksums": false}: a corrupt byte is then trained on, fetched and checkpointed.
  bool checksums = true;
  /// save_async on the nvme tier: snapshot the optimizer state by cloning it from the swap
  /// files where the file system allows it (XFS, btrfs); false always streams it
  /// (OptimizerOptions::checkpoint_reflink, docs/engine.md).
  bool checkpoint_reflink = true;
  swap::IoEngineKind backend = swap::IoEngineKind::kAuto;  ///< "auto" | "uring" | "threads"
  bool direct_io = true;             ///< O_DIRECT where the file system allows it
  bool precondition = false;         ///< write the swap files once at start (faster write-backs)
  std::uint32_t prefetch_depth = 2;  ///< layers read ahead of the one computing
  std::uint32_t adam_threads = 0;    ///< CpuAdam threads (0: one per hardware thread)
  /// How the optimizer keeps Adam's moments: "fp32" (12 bytes per parameter with the fp32
  /// master), "bf16" (8) or "int8" (6.125: codes with a scale per 64 elements); the master
  /// parameters stay fp32. Fewer bytes per step on the nvme tier (OptimizerOptions::
  /// state_precision, docs/config.md).
  adam::StatePrecision state_precision = adam::StatePrecision::kF32;
  /// Pinned buffers for gradients handed in from device memory (OffloadEngine::set_gradients
  /// with a DeviceSpan), each the largest layer's fp32 gradients: one receives a layer's
  /// device-to-host copy while the optimizer updates from another. Counted in
  /// pinned_budget_bytes; allocated at the first device-gradient call. 0: host gradients only.
  std::uint32_t grad_staging_buffers = 2;
  /// kOnArrival with gradient_clipping or loss scaling is refused (check_config), never a
  /// silent no-op.
  StepMode step_mode = StepMode::kAuto;
  /// The drive-slowdown notice (a consumer SSD's write cache filling up, or thermal
  /// throttling): when a step's optimizer NVMe write (or read) rate is below this share of the
  /// reference rate for rate_notice_steps steps in a row, the engine logs one notice naming
  /// the directory and both rates, and one more if the rate comes back. In [0, 1); 0: off.
  double rate_notice_share = 0.5;
  std::uint32_t rate_notice_steps = 3;  ///< consecutive slow steps before the notice (>= 1)
  /// Reference rates in GB/s (10^9 B/s), e.g. `zinf tune`'s figures for the drive; 0: the
  /// median of the first rate_notice_steps steps' own rates.
  double tuned_write_gbps = 0;
  double tuned_read_gbps = 0;
  /// The NVMe drives' rated endurance in TB written (10^12 bytes, as datasheets rate it); with
  /// an nvme tier the engine logs at start-up what a step writes and how many steps the
  /// endurance lasts, and after its first steps how many days at the measured step rate.
  /// 0: no wear notices.
  double tbw_tb = 0;
};

/// The optimizer: DeepSpeed's "optimizer" block ({"type": "Adam"|"AdamW", "params": {...}}).
/// "Adam" follows DeepSpeed: decoupled decay unless params.adam_w_mode is false.
struct OptimizerConfig {
  adam::AdamParams hyper;  ///< lr, betas, eps, weight_decay, bias_correction, mode
};

/// Everything an OffloadEngine needs, with the defaults above for absent keys.
struct EngineConfig {
  int zero_stage = 0;  ///< zero_optimization.stage, 0-3 (parameter offload needs 3)
  OffloadParamConfig offload_param;
  OffloadOptimizerConfig offload_optimizer;
  std::uint64_t sub_group_size = 1'000'000'000;  ///< elements per optimizer sub-group
  AioConfig aio;
  OptimizerConfig optimizer;
  ZinfSection zinf;
  /// The parameter dtype implied by "bf16"/"fp16" {"enabled": true}: kBF16 if neither.
  ElementType param_dtype = ElementType::kBF16;
  /// The top-level "gradient_clipping": > 0 clips the global L2 norm of each step's
  /// (unscaled) gradients to this value (staged mode); 0, or absent, does not clip.
  double gradient_clipping = 0;
  /// fp16's loss scaling keys; enabled with fp16.enabled.
  LossScaleConfig loss_scaling;
  /// Notices from parsing (aliases used, accepted keys that have no effect), one line each.
  std::vector<std::string> notices;

  /// The I/O engine options these settings give (aio block + zinf.backend).
  swap::IoOptions io_options() const;
  /// zinf.step_mode with kAuto resolved: kStaged or kOnArrival.
  StepMode effective_step_mode() const noexcept;
  /// Every NVMe directory for `device`'s state (its nvme_path, then zinf.nvme_paths).
  std::vector<std::string> nvme_directories(const std::string& nvme_path) const;
};

/// Hostile-input bounds of a config (parse_config and load_config refuse anything past them
/// with a UsageError saying which): a real ds_config is a few KiB and about 5 levels deep, so
/// these are far above any real one, and keep a bad input from exhausting memory or the stack.
inline constexpr std::size_t kConfigMaxBytes = std::size_t{16} << 20;  ///< 16 MiB of text
inline constexpr std::size_t kConfigMaxDepth = 64;  ///< nested objects and arrays
/// The smallest zero_optimization.sub_group_size a config may give. Each sub-group is one
/// record of 12 bytes per element (fp32 master, m, v) padded to the 4096-byte I/O alignment,
/// so a record of 32768 elements (384 KiB) or more wastes at most ~1% on padding, where
/// sub_group_size 1 would waste 341x the state. (EngineConfig built in code, and
/// OptimizerOptions::sub_group_elements, are not held to it: tests use small sub-groups to
/// cut small tensors into many records.)
inline constexpr std::uint64_t kConfigMinSubGroupSize = 32768;
/// The largest zero_optimization.offload_param.buffer_size (elements): 2^50, the largest layer
/// OffloadEngine takes, so a bigger buffer could never be used; its bytes, rounded up to any
/// alignment, then fit in 64 bits.
inline constexpr std::uint64_t kConfigMaxBufferSize = std::uint64_t{1} << 50;
/// The largest buffer or thread count a config may give (offload_param.buffer_count,
/// offload_optimizer.buffer_count, zinf.prefetch_depth, zinf.adam_threads): far above any
/// real setting (DeepSpeed's defaults are 4 and 5), and small enough that a count times the
/// largest buffer's or record's bytes (at most 2^51 and 2^44) fits in 64 bits.
inline constexpr std::uint32_t kConfigMaxCount = 1024;

/// Parses a DeepSpeed-style JSON config. `source` names it in errors (a path, or "<string>").
/// Integers may be written as 1e8 (as DeepSpeed accepts) if the value is integral and fits.
/// Top-level DeepSpeed keys that zinf does not use (train_batch_size, scheduler, ...) are
/// accepted. Throws UsageError, one line, "<source>: <json path>: <what>", for an unknown
/// key ("<source>: zero_optimization.offload_param.nvme_pth: unknown key; did you mean
/// 'nvme_path'?"), a value of the wrong type or out of range, and contradictory settings
/// (e.g. NVMe offload without a path, parameter offload below stage 3), hyper-parameters that
/// check_adam_params() refuses (non-finite or out of range, named by their key), and a
/// sub_group_size below kConfigMinSubGroupSize; malformed JSON reads "<source>: line L,
/// column C: <what>", a duplicate key "<source>: line L, column C: <json path>: duplicate key
/// (...)", a number beyond a double's range "<source>: line L, column C: <json path>: number
/// out of range (...)". Input over kConfigMaxBytes or nested deeper than kConfigMaxDepth is
/// refused before it is parsed further (no recursion on it, ever). Values and keys quoted in
/// messages are cut to 80 characters. Checks that need the model (a buffer smaller than the
/// largest layer) happen in OffloadEngine's constructor. Does not block; thread-safe.
EngineConfig parse_config(std::string_view json, std::string_view source = "<string>");
/// Reads and parses a config file. IoError if it cannot be opened or read (errno, path);
/// UsageError, naming the path, for anything but a regular file (a FIFO, device, directory or
/// socket: refused from fstat before a byte is read, so a FIFO never blocks and /dev/zero is
/// never read), for a file over kConfigMaxBytes, and as parse_config.
EngineConfig load_config(const std::string& path);
/// Throws UsageError, "<source>: <json path>: <what>", for settings of `config` that contradict
/// each other (the checks parse_config ends with): NVMe offload without a directory, parameter
/// offload below stage 3, a buffer size or count above its bound (kConfigMaxBufferSize,
/// kConfigMaxCount; zinf.grad_staging_buffers at most 64), an NVMe optimizer pipeline of
/// fewer than 3 buffers, zinf.step_mode
/// "on_arrival" with gradient_clipping or fp16 loss scaling, and gradient_clipping or loss
/// scaling values out of the ranges LossScaleConfig states. For configs
/// built in code; OffloadEngine's constructor runs it before anything else. Thread-safe.
void check_config(const EngineConfig& config, std::string_view source = "EngineConfig");
/// Writes `config` as JSON that parse_config reads back to the same settings: DeepSpeed's keys
/// where DeepSpeed has them, the rest under "zinf". Real JSON booleans and numbers.
/// `notices` are not written. Throws UsageError for param_dtype kF32, which no config spells
/// (parameters are bf16 or fp16), and where loss_scaling.enabled differs from param_dtype ==
/// kF16 (both are fp16.enabled in a config).
std::string config_to_json(const EngineConfig& config);

}  // namespace zinf::offload
