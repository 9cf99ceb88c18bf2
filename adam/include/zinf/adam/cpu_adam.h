// SPDX-License-Identifier: Apache-2.0
// CpuAdam: the SIMD Adam/AdamW update that the optimizer pipeline runs on every offloaded
// element each step. fp32 master parameters and moments; fp32, bf16 or fp16 gradients; an
// optional fused bf16/fp16 copy-out of the updated parameters. The instruction set (AVX-512,
// AVX2+FMA+F16C, SVE or NEON on aarch64, scalar) is chosen at run time; results do not depend
// on the thread count.
// Part of zinf::adam, a leaf layer on zinf::common only, so that the kernel and what times it
// need none of the I/O layers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "zinf/adam/compact_state.h"
#include "zinf/common/element_type.h"

namespace zinf::adam {

/// How weight decay enters the update (PyTorch semantics).
enum class AdamMode : std::uint8_t {
  kAdam,   ///< torch.optim.Adam: L2 decay added to the (scaled) gradient, g += wd * p
  kAdamW,  ///< torch.optim.AdamW: decoupled decay, p *= (1 - lr * wd) before the update
};

/// A code path of the kernel. Each is compiled in its own translation unit with its own flags.
enum class Isa : std::uint8_t {
  kScalar,      ///< portable C++, any CPU
  kAvx2,        ///< AVX2 + FMA + F16C
  kAvx512,      ///< AVX-512 F/BW/VL/DQ, bf16 rounding done with integer ops
  kAvx512Bf16,  ///< kAvx512 plus the AVX512-BF16 conversion instruction for bf16 copy-out
  kNeon,        ///< AArch64 Advanced SIMD (built only for aarch64), bf16 rounding with integer ops
  /// AArch64 SVE, vector-length agnostic (built only for aarch64, used where HWCAP_SVE is set),
  /// bf16 rounding with integer ops. "auto" prefers it to kNeon only where the vector length
  /// exceeds 128 bits, NEON's width; see best_isa().
  kSve,
};

/// Returns "scalar", "avx2", "avx512", "avx512bf16", "neon" or "sve".
std::string_view isa_name(Isa isa) noexcept;
/// Parses an ISA name as isa_name() spells it; "auto" gives std::nullopt. Throws UsageError
/// naming `what` (e.g. "--isa") and the accepted names for anything else.
std::optional<Isa> parse_isa(std::string_view text, std::string_view what);
/// Returns true if `isa` is compiled into this build and this CPU and OS support it (cpuid and
/// xgetbv on x86, the auxiliary vector's HWCAP on aarch64, read once when the library loads)
/// and ZINF_CPU_ADAM_DISABLE (a comma-separated list of names) does not hide it. The x86 paths
/// are built only for x86-64, kNeon and kSve only for aarch64.
bool isa_supported(Isa isa) noexcept;
/// Returns the fastest supported ISA (what "auto" picks). On aarch64 that is kSve where SVE's
/// vector length exceeds 128 bits, else kNeon: at 128 bits (Neoverse V2/Grace, N2) SVE has
/// NEON's width and no Arm hardware was measured to show it faster, so NEON stays the default.
Isa best_isa() noexcept;
/// Returns every supported ISA, fastest first (best_isa() first); kScalar is always last.
std::vector<Isa> supported_isas();

/// The hyper-parameters of one update. Defaults are torch.optim.Adam's. The kernel computes in
/// fp32, so every value must be finite as an fp32; check_adam_params() states the ranges.
struct AdamParams {
  double lr = 1e-3;             ///< finite, >= 0
  double beta1 = 0.9;           ///< in [0, 1)
  double beta2 = 0.999;         ///< in [0, 1)
  double eps = 1e-8;            ///< finite, > 0 (added after the bias-corrected sqrt(v), PyTorch)
  double weight_decay = 0.0;    ///< finite, >= 0; meaning set by `mode`
  std::uint64_t step = 1;       ///< this update's step number, counting from 1
  bool bias_correction = true;  ///< divide by 1 - beta^step (powers computed in double)
  double grad_scale = 1.0;      ///< finite, > 0: 1/loss-scale times a clipping coefficient
  AdamMode mode = AdamMode::kAdam;
};

/// Why a set of hyper-parameters cannot be used: the field ("lr", "beta1", "beta2", "eps",
/// "weight_decay", "grad_scale") and what it must be, with the value ("must be finite and
/// >= 0, got inf").
struct AdamParamsError {
  std::string_view field;
  std::string what;
};
/// The one range check of the hyper-parameters, shared by CpuAdam::step, OffloadedOptimizer,
/// OffloadEngine::set_hyper, the config reader and the C API, so that every layer refuses the
/// same values (each adds its own prefix: the function, or the config file and key). Returns
/// the first bad field, or std::nullopt if `hp` is valid: lr and weight_decay in [0, FLT_MAX]
/// (3.4028235e+38), beta1 and beta2 in [0, 1), eps and grad_scale in [FLT_TRUE_MIN, FLT_MAX]
/// ([1e-45, 3.4028235e+38]: > 0 once rounded to fp32; eps = 0 divides 0 by 0 for an element
/// whose gradients have all been 0, giving NaN parameters), and lr * weight_decay at most
/// FLT_MAX (the decay factor must stay finite). NaN and infinities fail. `step` is not checked
/// here (the optimizer numbers its own steps; CpuAdam::step refuses 0).
std::optional<AdamParamsError> check_adam_params(const AdamParams& hp);
/// The check of the hyper-parameters of a rollback (undoing the update made with `hp`, as
/// zinf.torch.adam_rollback, DeepSpeedCPUAdam.rollback_subgroup and the DeepSpeed op's
/// adam_rollback do): check_adam_params(hp), then what the inversion divides by, each rounded
/// to fp32 as the update rounds it: beta1 and beta2 must not be 0 (the old moments are
/// (m - (1 - beta1) * g) / beta1, likewise v), and for kAdamW with weight decay the decay
/// factor 1 - lr * weight_decay must not be 0 (the update multiplied the parameters by it,
/// so they cannot be recovered). Returns the first bad field, or std::nullopt.
std::optional<AdamParamsError> check_rollback_params(const AdamParams& hp);

/// The gradients of one update: a view of caller-owned memory of `size` elements of `dtype`.
struct GradView {
  const void* data = nullptr;
  std::size_t size = 0;
  ElementType dtype = ElementType::kF32;

  /// Views fp32 gradients.
  static GradView f32(std::span<const float> g) noexcept {
    return {g.data(), g.size(), ElementType::kF32};
  }
  /// Views bf16 gradients given as their raw bits.
  static GradView bf16(std::span<const std::uint16_t> g) noexcept {
    return {g.data(), g.size(), ElementType::kBF16};
  }
  /// Views IEEE fp16 gradients given as their raw bits.
  static GradView f16(std::span<const std::uint16_t> g) noexcept {
    return {g.data(), g.size(), ElementType::kF16};
  }
};

/// Where the updated parameters are also written in the same pass: bf16/fp16 rounded to nearest
/// even, or fp32 as they are (a trainer whose parameters are fp32 and whose master copy lives
/// elsewhere, e.g. NVMe). Default-constructed: no copy-out.
struct CopyOut {
  void* data = nullptr;
  std::size_t size = 0;
  ElementType dtype = ElementType::kBF16;
  bool enabled = false;

  /// No copy-out.
  static CopyOut none() noexcept { return {}; }
  /// Writes bf16 bits (round to nearest even, as torch's .to(torch.bfloat16)).
  static CopyOut bf16(std::span<std::uint16_t> out) noexcept {
    return {out.data(), out.size(), ElementType::kBF16, true};
  }
  /// Writes IEEE fp16 bits (round to nearest even; overflow gives inf).
  static CopyOut f16(std::span<std::uint16_t> out) noexcept {
    return {out.data(), out.size(), ElementType::kF16, true};
  }
  /// Writes the fp32 values themselves.
  static CopyOut f32(std::span<float> out) noexcept {
    return {out.data(), out.size(), ElementType::kF32, true};
  }
};

/// Work a caller does on each piece of the arrays while it is in cache, on the thread that
/// updates that piece: `before(ctx, begin, end)` right before the kernel reads elements
/// [begin, end) of every array, `after(ctx, begin, end)` right after it has written them (and
/// their copy-out). The offloaded optimizer folds its swap checksums into the update's own
/// pass over memory this way instead of making passes of its own. Pieces hold at most
/// kHookPieceElements elements; together they cover [0, n) once each, in no set order and on
/// several threads at once, so the functions must be thread-safe, and must not throw. Null
/// functions are skipped.
struct ChunkHooks {
  void (*before)(void* ctx, std::size_t begin, std::size_t end) = nullptr;
  void (*after)(void* ctx, std::size_t begin, std::size_t end) = nullptr;
  void* ctx = nullptr;
};
/// 16 Ki elements: 64 KiB per fp32 array, so a piece's parameters, moments, gradients and
/// copy-out (~290 KiB) stay in a core's L2 between `before`, the kernel and `after`.
inline constexpr std::size_t kHookPieceElements = std::size_t{1} << 14;

/// How a CpuAdam is built.
struct CpuAdamOptions {
  /// Threads that run each step, the calling thread included; 0 means one per hardware thread.
  std::size_t threads = 0;
  /// Forces a code path (tests, benchmarks). Unset: the environment variable
  /// ZINF_CPU_ADAM_ISA (scalar|avx2|avx512|avx512bf16|sve|neon|auto) if set, else best_isa().
  std::optional<Isa> isa = std::nullopt;
  /// Software prefetch distance of the x86 vector paths in elements, 0 for none, at most
  /// 65536 (the other paths have no software prefetch and ignore it). Unset: the environment
  /// variable ZINF_CPU_ADAM_PREFETCH (auto|off|N) if set, else auto: the first steps of at
  /// least 1 Mi elements in the process time their chunks at 0, 128, 256, 512 and 1024 in
  /// turn (16 chunks of 64 Ki elements each) and keep the fastest for the rest of the process,
  /// per code path; 256 before that. The distance changes the speed only: every distance gives
  /// the same bits.
  std::optional<std::size_t> prefetch_elements = std::nullopt;
};

/// Parses a prefetch distance as ZINF_CPU_ADAM_PREFETCH spells it: "auto" gives std::nullopt
/// (calibrate), "off" 0, or a number of elements in [1, 65536]. Throws UsageError naming
/// `what` (e.g. "--prefetch") and the accepted forms for anything else.
std::optional<std::size_t> parse_prefetch(std::string_view text, std::string_view what);

/// The software prefetch distance a CpuAdam's steps use now, and where it comes from.
struct PrefetchSetting {
  std::size_t elements = 0;  ///< 0: no software prefetch
  /// "none" (this code path has no software prefetch), "option", "environment", "default"
  /// (auto, before the process has calibrated this path) or "calibrated".
  std::string_view source;
};

/// The CPU Adam/AdamW kernel with its persistent thread pool.
///
/// Each element is updated as PyTorch does, in fp32 with fp32 state:
///   g = grad * grad_scale;  kAdam: g += wd * p;  kAdamW: p *= (1 - lr * wd)
///   m = b1 * m + (1 - b1) * g;  v = b2 * v + (1 - b2) * g * g
///   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
/// The array is cut into fixed chunks independent of the thread count, and every element's
/// arithmetic is the same wherever it sits (vector body or tail), so results are bitwise
/// identical for any thread count, alignment and split. The ISAs agree with each other within
/// a few ulps; in practice bitwise except for bf16 copy-out of subnormal values on kAvx512Bf16
/// (the instruction flushes them to zero).
///
/// Thread-safety: step() may be called from several threads at once (they share the pool).
class CpuAdam {
 public:
  /// Starts the pool. Throws UsageError if the requested ISA (option or environment) is
  /// unknown or not supported here, if `threads` exceeds 1024, or if the prefetch distance
  /// (option or ZINF_CPU_ADAM_PREFETCH) is out of range or not auto, off or a number.
  explicit CpuAdam(CpuAdamOptions options = {});
  ~CpuAdam();
  CpuAdam(const CpuAdam&) = delete;
  CpuAdam& operator=(const CpuAdam&) = delete;

  /// Updates `params`, `m` and `v` in place from `grads` and writes `out` if enabled. Blocks
  /// until every element is done. All arrays must have the same length and must not overlap;
  /// no alignment is required. Throws UsageError (before touching any memory) on mismatched
  /// lengths, a null pointer with a non-zero length, overlapping arrays, hyper-parameters that
  /// check_adam_params() refuses, or step == 0. An fp32 copy-out is copied per chunk right
  /// after the kernel updated it (still in cache), so it costs a copy, not a memory pass.
  /// `hooks`, if given, run around each piece (see ChunkHooks); the update is bitwise the
  /// same with or without them.
  void step(const AdamParams& hp, std::span<float> params, std::span<float> m, std::span<float> v,
            GradView grads, CopyOut out = {}, const ChunkHooks* hooks = nullptr);
  /// As above with m and v in compact form (compact_state.h). In the same pass over memory,
  /// each element's m and v are decoded to fp32, updated exactly as the fp32 step does, and
  /// encoded back (int8: a block's scales from its updated values); the parameters and
  /// copy-out are what the fp32 step gives from the decoded moments, bitwise the same on
  /// every ISA and thread count. `hooks` pieces start on multiples of kInt8Block. kF32 is the
  /// fp32 step. Same errors as above, with `moments` checked as m and v are (size, null
  /// pointers, overlaps with every other array, scales included).
  void step(const AdamParams& hp, std::span<float> params, const CompactMoments& moments,
            GradView grads, CopyOut out = {}, const ChunkHooks* hooks = nullptr);

  /// Writes `params` rounded to `out`'s type (bf16/fp16, round to nearest even) with exactly
  /// the conversion step()'s copy-out uses on this instance's code path (the kernel itself,
  /// run as an update that changes nothing), so that a copy made here is bitwise what a step
  /// would have written. Runs on the calling thread. UsageError for a size mismatch, a null
  /// pointer or a copy-out that is not bf16/fp16.
  void copy_out(std::span<const float> params, CopyOut out);
  /// Returns the code path this instance runs.
  Isa isa() const noexcept;
  /// Returns the number of threads that run a step (calling thread included).
  std::size_t threads() const noexcept;
  /// Returns the prefetch distance the next step uses (see CpuAdamOptions::prefetch_elements).
  PrefetchSetting prefetch() const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zinf::adam
