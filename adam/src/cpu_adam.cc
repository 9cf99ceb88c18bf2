// SPDX-License-Identifier: Apache-2.0
// CpuAdam: argument checks, the per-call constants (beta powers in double), the
// run-time choice of kernel (cpuid or the auxiliary vector once at load, overridable by option or ZINF_CPU_ADAM_ISA),
// and the hand-off of fixed chunks to the pool.
#include "zinf/adam/cpu_adam.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "chunk_pool.h"
#include "compact_step.h"
#include "cpu_adam_kernel.h"
#include "prefetch_tuner.h"
#include "zinf/common/error.h"
#include "zinf/common/log.h"

#if ZINF_CPU_ADAM_X86
#include <cpuid.h>
#endif
#if ZINF_CPU_ADAM_NEON
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif

namespace zinf::adam {
namespace {

using detail::ChunkPool;
using detail::KernelArgs;
using detail::KernelFn;

// Fastest first. Each architecture has its own paths, so the order between x86's and Arm's
// never matters: one build supports only one family. SVE is listed before NEON but is
// preferred only where its vectors are wider than NEON's (preference_order()).
constexpr Isa kAllIsas[] = {Isa::kAvx512Bf16, Isa::kAvx512, Isa::kAvx2,
                            Isa::kSve,        Isa::kNeon,   Isa::kScalar};

// What this CPU and OS support, read once. x86: cpuid, and an instruction set counts only if
// the OS also saves its registers on a context switch (XCR0 via xgetbv): ymm state for AVX2,
// opmask and zmm state for AVX-512. Plain cpuid rather than __builtin_cpu_supports, whose
// feature names differ between GCC and Clang (Clang 14 has no "f16c"). AArch64: the kernel's
// HWCAP_ASIMD bit; Advanced SIMD is part of the AArch64 Linux ABI, so this holds on every
// real host, but the path is still reported by the same table the x86 paths use. HWCAP_SVE
// for SVE, which is optional (Neoverse V1/V2/N2, A64FX have it; Graviton2, Ampere Altra and
// Apple cores do not); only then is SVE code, svcntb() included, ever run.
struct CpuFeatures {
  bool avx2 = false;
  bool avx512 = false;
  bool avx512bf16 = false;
  bool neon = false;
  bool sve = false;
  std::size_t sve_bytes = 0;  // SVE vector length, 0 without SVE
  CpuFeatures() {
#if ZINF_CPU_ADAM_NEON
    const unsigned long hwcap = getauxval(AT_HWCAP);
    neon = (hwcap & HWCAP_ASIMD) != 0;
    sve = (hwcap & HWCAP_SVE) != 0;
    // Read before the disable list, which may clear `sve`: the length is the hardware's.
    if (sve) sve_bytes = detail::sve_vector_bytes();
#endif
#if ZINF_CPU_ADAM_X86
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (__get_cpuid_max(0, nullptr) < 7) return;
    __cpuid_count(1, 0, a, b, c, d);
    const bool fma = (c & (1u << 12)) != 0;
    const bool osxsave = (c & (1u << 27)) != 0;
    const bool avx = (c & (1u << 28)) != 0;
    const bool f16c = (c & (1u << 29)) != 0;
    if (!osxsave || !avx) return;
    unsigned xcr0_lo = 0, xcr0_hi = 0;
    __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
    const bool os_ymm = (xcr0_lo & 0x6u) == 0x6u;    // SSE and AVX state
    const bool os_zmm = (xcr0_lo & 0xe6u) == 0xe6u;  // plus opmask, ZMM_Hi256, Hi16_ZMM
    __cpuid_count(7, 0, a, b, c, d);
    const unsigned max_leaf7 = a;
    const bool avx2_bit = (b & (1u << 5)) != 0;
    const bool f = (b & (1u << 16)) != 0, dq = (b & (1u << 17)) != 0;
    const bool bw = (b & (1u << 30)) != 0, vl = (b & (1u << 31)) != 0;
    bool bf16 = false;
    if (max_leaf7 >= 1) {
      __cpuid_count(7, 1, a, b, c, d);
      bf16 = (a & (1u << 5)) != 0;
    }
    avx2 = os_ymm && avx2_bit && fma && f16c;
    avx512 = avx2 && os_zmm && f && dq && bw && vl;
    avx512bf16 = avx512 && bf16;
#endif
    apply_disable_list(std::getenv("ZINF_CPU_ADAM_DISABLE"));
  }

  // ZINF_CPU_ADAM_DISABLE=avx512,avx512bf16 (or neon, sve) hides paths from a CPU that has them:
  // for machines where AVX-512 lowers the clock more than it gains, and so that the refusal of
  // an unsupported path can be tested on a CPU that supports every path. Read once, at load.
  void apply_disable_list(const char* list) {
    if (list == nullptr) return;
    std::string_view rest(list);
    while (!rest.empty()) {
      std::string_view name = rest.substr(0, rest.find(','));
      rest.remove_prefix(std::min(rest.size(), name.size() + 1));
      if (name == "avx2") {
        avx2 = avx512 = avx512bf16 = false;  // the AVX-512 paths need AVX2 too
      } else if (name == "avx512") {
        avx512 = avx512bf16 = false;
      } else if (name == "avx512bf16") {
        avx512bf16 = false;
      } else if (name == "neon") {
        neon = false;
      } else if (name == "sve") {
        sve = false;
      } else if (!name.empty()) {
        zinf::log(LogLevel::kWarning, "ZINF_CPU_ADAM_DISABLE: ignoring unknown path '" +
                                          std::string(name) +
                                          "' (expected avx2, avx512, avx512bf16, sve, neon)");
      }
    }
  }
};

const CpuFeatures& cpu_features() {
  static const CpuFeatures features;
  return features;
}

// Read when the library loads, as the issue asks; cpu_features() stays safe to call earlier.
[[maybe_unused]] const CpuFeatures& g_features_at_load = cpu_features();

KernelFn kernel_for(Isa isa) {
  switch (isa) {
#if ZINF_CPU_ADAM_X86
    case Isa::kAvx512Bf16: return detail::adam_kernel_avx512bf16;
    case Isa::kAvx512: return detail::adam_kernel_avx512;
    case Isa::kAvx2: return detail::adam_kernel_avx2;
#else
    case Isa::kAvx512Bf16:
    case Isa::kAvx512:
    case Isa::kAvx2: break;
#endif
#if ZINF_CPU_ADAM_NEON
    case Isa::kNeon: return detail::adam_kernel_neon;
    case Isa::kSve: return detail::adam_kernel_sve;
#else
    case Isa::kNeon:
    case Isa::kSve: break;
#endif
    case Isa::kScalar: return detail::adam_kernel_scalar;
  }
  return nullptr;
}

std::string supported_list() {
  std::string s;
  for (Isa isa : supported_isas()) {
    if (!s.empty()) s += ", ";
    s += isa_name(isa);
  }
  return s;
}

// Picks the ISA: the option, else ZINF_CPU_ADAM_ISA, else the best. An ISA named explicitly
// that this machine lacks is an error, never a silent fallback.
Isa choose_isa(const std::optional<Isa>& requested) {
  std::optional<Isa> isa = requested;
  std::string source = "option";
  if (!isa) {
    if (const char* env = std::getenv("ZINF_CPU_ADAM_ISA"); env != nullptr && *env != '\0') {
      isa = parse_isa(env, "ZINF_CPU_ADAM_ISA");
      source = "ZINF_CPU_ADAM_ISA";
    }
  }
  if (!isa) return best_isa();
  if (!isa_supported(*isa)) {
    throw UsageError("cpu adam: isa '" + std::string(isa_name(*isa)) + "' requested by " + source +
                     " is not supported on this machine (supported: " + supported_list() + ")");
  }
  return *isa;
}

struct Range {
  const char* name;
  const void* data;
  std::size_t bytes;  // 0: not in use
};

// UsageError naming the first two arrays that share a byte.
void check_no_overlap(std::initializer_list<Range> list) {
  const Range* ranges = list.begin();
  for (std::size_t i = 0; i < list.size(); ++i) {
    for (std::size_t j = i + 1; j < list.size(); ++j) {
      if (ranges[i].bytes == 0 || ranges[j].bytes == 0) continue;
      const auto ai = reinterpret_cast<std::uintptr_t>(ranges[i].data);
      const auto aj = reinterpret_cast<std::uintptr_t>(ranges[j].data);
      if (ai < aj + ranges[j].bytes && aj < ai + ranges[i].bytes) {
        throw UsageError(std::string("cpu adam: ") + ranges[i].name + " and " + ranges[j].name +
                         " overlap");
      }
    }
  }
}

void check_array(const char* name, const void* data, std::size_t size, std::size_t expected) {
  if (size != expected) {
    throw UsageError(std::string("cpu adam: ") + name + " has " + std::to_string(size) +
                     " elements, params has " + std::to_string(expected));
  }
  if (data == nullptr && size != 0) {
    throw UsageError(std::string("cpu adam: ") + name + " is null with " + std::to_string(size) +
                     " elements");
  }
}

// Shortest text that reads back to `v` ("0.001", "1e+300", "inf", "nan"): std::to_string
// would print 1e-9 as "0.000000", hiding the value that was refused.
template <typename Float>
std::string number_text(Float v) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

void check_hyper(const AdamParams& hp) {
  if (auto bad = check_adam_params(hp)) {
    throw UsageError("cpu adam: " + std::string(bad->field) + " " + bad->what);
  }
  if (hp.step == 0) throw UsageError("cpu adam: step=0: steps count from 1");
}

// Folds the hyper-parameters in double (beta powers included) and rounds each constant to
// float once, so every ISA and every chunk uses the same values.
KernelArgs make_args(const AdamParams& hp) {
  double bc1 = 1.0;
  double bc2 = 1.0;
  if (hp.bias_correction) {
    const auto t = static_cast<double>(hp.step);
    bc1 = 1.0 - std::pow(hp.beta1, t);
    bc2 = 1.0 - std::pow(hp.beta2, t);
  }
  KernelArgs a{};
  a.decay_kind = hp.weight_decay == 0         ? detail::DecayKind::kNone
                 : hp.mode == AdamMode::kAdam ? detail::DecayKind::kL2
                                              : detail::DecayKind::kDecoupled;
  a.grad_scale = static_cast<float>(hp.grad_scale);
  a.weight_decay = static_cast<float>(hp.weight_decay);
  a.decay_factor = static_cast<float>(1.0 - hp.lr * hp.weight_decay);
  a.beta1 = static_cast<float>(hp.beta1);
  a.one_minus_beta1 = static_cast<float>(1.0 - hp.beta1);
  a.beta2 = static_cast<float>(hp.beta2);
  a.one_minus_beta2 = static_cast<float>(1.0 - hp.beta2);
  a.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  a.eps = static_cast<float>(hp.eps);
  a.neg_step_size = static_cast<float>(-hp.lr / bc1);
  return a;
}

struct AdamJob {
  KernelFn kernel;
  KernelArgs args;
  float* out_f32 = nullptr;  // an fp32 copy-out: the kernels convert only to bf16/fp16
  const ChunkHooks* hooks = nullptr;
  detail::PrefetchTuner* tuner = nullptr;  // set while this step calibrates the distance
};

void run_adam_piece(const AdamJob& job, std::size_t begin, std::size_t end) {
  job.kernel(job.args, begin, end);
  if (job.out_f32 != nullptr) {
    std::copy(job.args.params + begin, job.args.params + end, job.out_f32 + begin);
  }
}

void run_adam_hooked(const AdamJob* job, std::size_t begin, std::size_t end) {
  // Smaller pieces than the pool's chunks, so that what `before` touched is still in L2 when
  // the kernel reads it, and what the kernel wrote when `after` reads it. The kernel gives
  // every element the same arithmetic wherever a range starts, so the split changes no bit.
  const ChunkHooks& h = *job->hooks;
  for (std::size_t b = begin; b < end; b += kHookPieceElements) {
    const std::size_t e = std::min(end, b + kHookPieceElements);
    if (h.before != nullptr) h.before(h.ctx, b, e);
    run_adam_piece(*job, b, e);
    if (h.after != nullptr) h.after(h.ctx, b, e);
  }
}

void run_adam_chunk(const void* ctx, std::size_t begin, std::size_t end) {
  const auto* job = static_cast<const AdamJob*>(ctx);
  if (job->tuner != nullptr && end - begin >= detail::kChunkElems) {
    // A calibrating step: this chunk runs with the next candidate distance and is timed whole
    // (hooks included: they cost every candidate alike). A step's last, shorter chunk runs
    // untimed with the current distance, so that every sample covers a chunk's span of memory.
    AdamJob mine = *job;
    mine.tuner = nullptr;
    const std::size_t index = job->tuner->next_candidate();
    mine.args.prefetch_elems = detail::kPrefetchCandidates[index];
    const auto t0 = std::chrono::steady_clock::now();
    run_adam_chunk(&mine, begin, end);
    const std::chrono::duration<double, std::nano> took = std::chrono::steady_clock::now() - t0;
    job->tuner->record(index, took.count() / static_cast<double>(end - begin));
    return;
  }
  if (job->hooks == nullptr) {
    run_adam_piece(*job, begin, end);
    return;
  }
  run_adam_hooked(job, begin, end);
}

}  // namespace

std::optional<AdamParamsError> check_adam_params(const AdamParams& hp) {
  // The kernel rounds every constant to fp32 (make_args): a value past fp32's range becomes
  // inf there, and a positive eps or grad_scale below its smallest value becomes 0.
  constexpr double kMax = std::numeric_limits<float>::max();
  constexpr double kTiny = std::numeric_limits<float>::denorm_min();
  const std::string max_text = number_text(std::numeric_limits<float>::max());
  const std::string tiny_text = number_text(std::numeric_limits<float>::denorm_min());
  const auto bad = [&](std::string_view field, const std::string& range, double v) {
    return AdamParamsError{field, "must be in " + range + ", got " + number_text(v)};
  };
  // Written as !(in range) so that NaN, which fails every comparison, is refused too.
  if (!(hp.lr >= 0 && hp.lr <= kMax)) return bad("lr", "[0, " + max_text + "]", hp.lr);
  if (!(hp.beta1 >= 0 && hp.beta1 < 1)) return bad("beta1", "[0, 1)", hp.beta1);
  if (!(hp.beta2 >= 0 && hp.beta2 < 1)) return bad("beta2", "[0, 1)", hp.beta2);
  if (!(hp.eps >= kTiny && hp.eps <= kMax)) {
    return bad("eps", "[" + tiny_text + ", " + max_text + "]", hp.eps);
  }
  if (!(hp.weight_decay >= 0 && hp.weight_decay <= kMax)) {
    return bad("weight_decay", "[0, " + max_text + "]", hp.weight_decay);
  }
  if (!(hp.lr * hp.weight_decay <= kMax)) {
    return AdamParamsError{"weight_decay", "times lr must be at most " + max_text + ", got " +
                                               number_text(hp.lr * hp.weight_decay)};
  }
  if (!(hp.grad_scale >= kTiny && hp.grad_scale <= kMax)) {
    return bad("grad_scale", "[" + tiny_text + ", " + max_text + "]", hp.grad_scale);
  }
  return std::nullopt;
}

std::optional<AdamParamsError> check_rollback_params(const AdamParams& hp) {
  if (auto bad = check_adam_params(hp)) return bad;
  // The rollback divides by these, rounded to fp32 as make_args() rounds them for the update:
  // a value that is 0 there (0 itself, or below fp32's smallest subnormal) gives inf or NaN.
  const auto cannot_invert = [](std::string_view field, const std::string& why, double v) {
    return AdamParamsError{field,
                           "must not be 0 for a rollback (" + why + "), got " + number_text(v)};
  };
  if (static_cast<float>(hp.beta1) == 0.0f) {
    return cannot_invert("beta1", "the old exp_avg is (exp_avg - (1 - beta1) * grad) / beta1",
                         hp.beta1);
  }
  if (static_cast<float>(hp.beta2) == 0.0f) {
    return cannot_invert(
        "beta2", "the old exp_avg_sq is (exp_avg_sq - (1 - beta2) * grad^2) / beta2", hp.beta2);
  }
  if (hp.mode == AdamMode::kAdamW && hp.weight_decay != 0 &&
      static_cast<float>(1.0 - hp.lr * hp.weight_decay) == 0.0f) {
    return AdamParamsError{"weight_decay",
                           "times lr must not be 1 for a rollback (the update multiplied the "
                           "parameters by 1 - lr * weight_decay = 0, so they cannot be "
                           "recovered), got lr=" +
                               number_text(hp.lr) +
                               " weight_decay=" + number_text(hp.weight_decay)};
  }
  return std::nullopt;
}

std::string_view isa_name(Isa isa) noexcept {
  switch (isa) {
    case Isa::kScalar: return "scalar";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
    case Isa::kAvx512Bf16: return "avx512bf16";
    case Isa::kNeon: return "neon";
    case Isa::kSve: return "sve";
  }
  return "?";
}

std::optional<Isa> parse_isa(std::string_view text, std::string_view what) {
  if (text == "auto") return std::nullopt;
  for (Isa isa : kAllIsas) {
    if (text == isa_name(isa)) return isa;
  }
  throw UsageError("invalid " + std::string(what) + " '" + std::string(text) +
                   "': expected auto, avx512bf16, avx512, avx2, sve, neon or scalar");
}

bool isa_supported(Isa isa) noexcept {
  const CpuFeatures& f = cpu_features();
  switch (isa) {
    case Isa::kScalar: return true;
    case Isa::kAvx2: return kernel_for(isa) != nullptr && f.avx2;
    case Isa::kAvx512: return kernel_for(isa) != nullptr && f.avx512;
    case Isa::kAvx512Bf16: return kernel_for(isa) != nullptr && f.avx512bf16;
    case Isa::kNeon: return kernel_for(isa) != nullptr && f.neon;
    case Isa::kSve: return kernel_for(isa) != nullptr && f.sve;
  }
  return false;
}

namespace {

// kAllIsas with SVE after NEON, for where SVE's vectors are no wider than NEON's 128 bits
// (16 bytes). There, as on Neoverse V2 (Grace) and N2, SVE does the same work per instruction
// as NEON, and no Arm hardware was available to measure either path, so the NEON path, the
// older and simpler of the two, stays the default. Wider SVE (A64FX's 512 bits, Neoverse V1's
// 256) processes more elements per instruction, so there "auto" takes it; an explicit
// ZINF_CPU_ADAM_ISA=sve or --isa sve selects it at any length.
constexpr Isa kNarrowSveOrder[] = {Isa::kAvx512Bf16, Isa::kAvx512, Isa::kAvx2,
                                   Isa::kNeon,       Isa::kSve,    Isa::kScalar};

std::span<const Isa> preference_order() noexcept {
  if (cpu_features().sve_bytes > 16) return kAllIsas;
  return kNarrowSveOrder;
}

}  // namespace

Isa best_isa() noexcept {
  for (Isa isa : preference_order()) {
    if (isa_supported(isa)) return isa;
  }
  return Isa::kScalar;
}

std::vector<Isa> supported_isas() {
  std::vector<Isa> out;
  for (Isa isa : preference_order()) {
    if (isa_supported(isa)) out.push_back(isa);
  }
  return out;
}

// True for the paths with software prefetch (the x86 vector ones): the others leave it to the
// hardware prefetchers, and their distance is 0 whatever is asked.
bool has_software_prefetch(Isa isa) {
  return isa == Isa::kAvx2 || isa == Isa::kAvx512 || isa == Isa::kAvx512Bf16;
}

struct CpuAdam::Impl {
  explicit Impl(const CpuAdamOptions& o)
      : isa(choose_isa(o.isa)), kernel(kernel_for(isa)), pool(o.threads) {
    if (o.prefetch_elements) {
      if (*o.prefetch_elements > detail::kMaxPrefetchElems) {
        throw UsageError("cpu adam: prefetch_elements=" + std::to_string(*o.prefetch_elements) +
                         " exceeds the limit of " + std::to_string(detail::kMaxPrefetchElems));
      }
      fixed_prefetch = static_cast<std::uint32_t>(*o.prefetch_elements);
      prefetch_source = "option";
    } else if (const char* env = std::getenv("ZINF_CPU_ADAM_PREFETCH");
               env != nullptr && *env != '\0') {
      if (const auto elems = parse_prefetch(env, "ZINF_CPU_ADAM_PREFETCH")) {
        fixed_prefetch = static_cast<std::uint32_t>(*elems);
        prefetch_source = "environment";
      }
    }
    if (!has_software_prefetch(isa)) {
      fixed_prefetch = 0;
      prefetch_source = "none";
    }
    if (!fixed_prefetch) tuner = &detail::prefetch_tuner(static_cast<std::size_t>(isa));
  }
  // The distance a step uses now: the fixed one, else the tuner's current choice.
  std::uint32_t prefetch_elems() const {
    return fixed_prefetch ? *fixed_prefetch : tuner->current();
  }
  // The tuner, if a step of n elements should time its chunks to calibrate it.
  detail::PrefetchTuner* calibrating(std::size_t n) const {
    return tuner != nullptr && tuner->wants(n) ? tuner : nullptr;
  }
  Isa isa;
  KernelFn kernel;
  ChunkPool pool;
  std::optional<std::uint32_t> fixed_prefetch;  // option, environment, or 0 without prefetch
  std::string_view prefetch_source;             // of fixed_prefetch
  detail::PrefetchTuner* tuner = nullptr;       // when the distance is calibrated ("auto")
};

CpuAdam::CpuAdam(CpuAdamOptions options) : impl_(std::make_unique<Impl>(options)) {
  const PrefetchSetting pf = prefetch();
  log(LogLevel::kInfo, "cpu adam: isa=" + std::string(isa_name(impl_->isa)) +
                           " threads=" + std::to_string(impl_->pool.threads()) + " prefetch=" +
                           std::to_string(pf.elements) + " (" + std::string(pf.source) + ")");
}

PrefetchSetting CpuAdam::prefetch() const noexcept {
  const std::string_view source = impl_->fixed_prefetch        ? impl_->prefetch_source
                                  : impl_->tuner->calibrated() ? "calibrated"
                                                               : "default";
  return {impl_->prefetch_elems(), source};
}

CpuAdam::~CpuAdam() = default;

Isa CpuAdam::isa() const noexcept { return impl_->isa; }

std::size_t CpuAdam::threads() const noexcept { return impl_->pool.threads(); }

void CpuAdam::step(const AdamParams& hp, std::span<float> params, std::span<float> m,
                   std::span<float> v, GradView grads, CopyOut out, const ChunkHooks* hooks) {
  // Every check comes before any memory is touched, so a refused call changes nothing.
  const std::size_t n = params.size();
  check_array("params", params.data(), n, n);
  check_array("m", m.data(), m.size(), n);
  check_array("v", v.data(), v.size(), n);
  check_array("grads", grads.data, grads.size, n);
  check_buffer_type(grads.dtype, "cpu adam: grads");
  if (out.enabled) {
    check_array("copy-out", out.data, out.size, n);
    check_buffer_type(out.dtype, "cpu adam: copy-out");
  }
  check_hyper(hp);
  if (n == 0) return;

  check_no_overlap({{"params", params.data(), n * 4},
                    {"m", m.data(), n * 4},
                    {"v", v.data(), n * 4},
                    {"grads", grads.data, n * element_size(grads.dtype)},
                    {"copy-out", out.data, out.enabled ? n * element_size(out.dtype) : 0}});

  AdamJob job{impl_->kernel, make_args(hp)};
  job.args.params = params.data();
  job.args.m = m.data();
  job.args.v = v.data();
  job.args.grads = grads.data;
  job.args.grad_type = grads.dtype;
  const bool f32_out = out.enabled && out.dtype == ElementType::kF32;
  job.args.out = out.enabled && !f32_out ? out.data : nullptr;
  job.args.out_type = out.dtype;
  job.out_f32 = f32_out ? static_cast<float*>(out.data) : nullptr;
  job.hooks = hooks;
  job.args.prefetch_elems = impl_->prefetch_elems();
  job.tuner = impl_->calibrating(n);
  impl_->pool.run(n, params.data(), sizeof(float), run_adam_chunk, &job);
}

void CpuAdam::step(const AdamParams& hp, std::span<float> params, const CompactMoments& moments,
                   GradView grads, CopyOut out, const ChunkHooks* hooks) {
  if (moments.precision == StatePrecision::kF32) {
    step(hp, params, {static_cast<float*>(moments.m), moments.size},
         {static_cast<float*>(moments.v), moments.size}, grads, out, hooks);
    return;
  }
  const std::size_t n = params.size();
  check_array("params", params.data(), n, n);
  check_array("m", moments.m, moments.size, n);
  check_array("v", moments.v, moments.size, n);
  const bool int8 = moments.precision == StatePrecision::kInt8;
  const std::size_t blocks = int8 ? (n + kInt8Block - 1) / kInt8Block : 0;
  if (int8) {
    check_array("m scales", moments.m_scale, blocks, blocks);
    check_array("v scales", moments.v_scale, blocks, blocks);
  }
  check_array("grads", grads.data, grads.size, n);
  check_buffer_type(grads.dtype, "cpu adam: grads");
  if (out.enabled) {
    check_array("copy-out", out.data, out.size, n);
    check_buffer_type(out.dtype, "cpu adam: copy-out");
  }
  check_hyper(hp);
  if (n == 0) return;
  const std::size_t moment = int8 ? 1 : 2;
  check_no_overlap({{"params", params.data(), n * 4},
                    {"m", moments.m, n * moment},
                    {"v", moments.v, n * moment},
                    {"m scales", moments.m_scale, blocks * 4},
                    {"v scales", moments.v_scale, blocks * 4},
                    {"grads", grads.data, n * element_size(grads.dtype)},
                    {"copy-out", out.data, out.enabled ? n * element_size(out.dtype) : 0}});

  detail::CompactJob job{impl_->kernel, make_args(hp)};
  // The fp32 kernel runs there on decoded pieces in L1, so it is never timed for calibration:
  // it takes the distance the fp32 steps chose.
  job.args.prefetch_elems = impl_->prefetch_elems();
  job.args.params = params.data();
  job.args.grads = grads.data;
  job.args.grad_type = grads.dtype;
  job.grad_bytes = element_size(grads.dtype);
  const bool f32_out = out.enabled && out.dtype == ElementType::kF32;
  job.args.out = out.enabled && !f32_out ? out.data : nullptr;
  job.args.out_type = out.dtype;
  job.out_bytes = element_size(out.dtype);
  job.out_f32 = f32_out ? static_cast<float*>(out.data) : nullptr;
  job.moments = moments;
  job.codec = detail::codec_for(impl_->isa);
  job.hooks = hooks;
  // Chunks anchored at element 0 rather than at the parameters' cache lines: every chunk must
  // start on an int8 block (a record's arrays are page-aligned, so nothing is lost there).
  impl_->pool.run(n, nullptr, sizeof(float), detail::run_compact_chunk, &job);
}

void CpuAdam::copy_out(std::span<const float> params, CopyOut out) {
  const std::size_t n = params.size();
  check_array("params", params.data(), n, n);
  if (!out.enabled || (out.dtype != ElementType::kBF16 && out.dtype != ElementType::kF16)) {
    throw UsageError("cpu adam: copy_out needs a bf16 or fp16 copy-out");
  }
  check_array("copy-out", out.data, out.size, n);
  // The kernel itself, with an update that leaves every parameter exactly as it is, so that
  // the conversion is the very code (and ISA) of step()'s copy-out: zero gradients and moments
  // give m / denom = 0 with denom = eps = 1, and p + (-0.0f * 0) is p bit for bit
  // (-0 + p keeps the sign of a zero p). Chunks through small scratch arrays on this thread.
  constexpr std::size_t kChunk = 16384;
  const std::size_t c = std::min(n, kChunk);
  std::vector<float> p(c), zeros(c * 3, 0.0f);
  detail::KernelArgs a{};
  a.grad_type = ElementType::kF32;
  a.out_type = out.dtype;
  a.decay_kind = detail::DecayKind::kNone;
  a.grad_scale = 1.0f;
  a.weight_decay = 0.0f;
  a.decay_factor = 1.0f;
  a.beta1 = 0.0f;
  a.one_minus_beta1 = 1.0f;
  a.beta2 = 0.0f;
  a.one_minus_beta2 = 1.0f;
  a.inv_sqrt_bc2 = 1.0f;
  a.eps = 1.0f;
  a.neg_step_size = -0.0f;
  const std::size_t elem = element_size(out.dtype);
  for (std::size_t begin = 0; begin < n; begin += kChunk) {
    const std::size_t len = std::min(kChunk, n - begin);
    std::copy_n(params.data() + begin, len, p.data());
    std::fill(zeros.begin(), zeros.end(), 0.0f);
    a.params = p.data();
    a.m = zeros.data();
    a.v = zeros.data() + c;
    a.grads = zeros.data() + 2 * c;
    a.out = static_cast<std::byte*>(out.data) + begin * elem;
    impl_->kernel(a, 0, len);
  }
}

}  // namespace zinf::adam
