// SPDX-License-Identifier: Apache-2.0
// The portable CpuAdam kernel (any CPU, any architecture).
// Built with the baseline flags only, with -ffp-contract=off so that the compiler never fuses a
// multiply and an add (the arithmetic is exactly the sequence in cpu_adam_kernel.h, so this path
// agrees bitwise with the SIMD ones), and with -fno-math-errno so that it may vectorise the loop
// for the baseline ISA (SSE2 on x86-64): sqrt and division stay correctly rounded there, so the
// bits are the same, and sqrt of a negative or NaN v, where errno would matter, never happens
// (v is a sum of non-negative terms; a NaN yields NaN either way).
#include <cmath>
#include <cstdint>
#include <cstring>

#include "cpu_adam_kernel.h"
#include "loop_order.h"

namespace zinf::adam::detail {
namespace {

std::uint32_t float_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

float bits_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

float bf16_to_float(std::uint16_t h) { return bits_float(static_cast<std::uint32_t>(h) << 16); }

// Round to nearest even, as torch does; a NaN keeps its sign and top payload bits and is made
// quiet, which is what VCVTNEPS2BF16 does too.
std::uint16_t float_to_bf16(float f) {
  const std::uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
  const std::uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(rounded >> 16);
}

// Exact widening, subnormals included; a NaN is made quiet as VCVTPH2PS does.
float f16_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24 is exact in fp32.
    const float mag = static_cast<float>(mant) * 0x1p-24f;
    return bits_float(float_bits(mag) | sign);
  }
  if (exp == 0x1f) {
    return bits_float(sign | 0x7f800000u | (mant << 13) | (mant != 0 ? 0x400000u : 0u));
  }
  return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

// Round to nearest even with subnormal results and overflow to infinity, bit for bit what
// VCVTPS2PH does with imm8 = round-to-nearest (MXCSR is not consulted).
std::uint16_t float_to_f16(float f) {
  const std::uint32_t u = float_bits(f);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  const std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  if (a >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // >= 65520: inf
  if (a >= 0x38800000u) {                                                   // normal half
    std::uint32_t r = ((a >> 13) - (112u << 10));
    const std::uint32_t rem = a & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u) != 0)) ++r;
    return static_cast<std::uint16_t>(sign | r);
  }
  if (a <= 0x33000000u) return static_cast<std::uint16_t>(sign);  // <= 2^-25: ties to zero
  // Subnormal half: round(value / 2^-24) = round(mant24 * 2^(exp - 126)).
  const std::uint32_t exp = a >> 23;
  const std::uint32_t mant = (a & 0x7fffffu) | 0x800000u;
  const std::uint32_t shift = 126u - exp;  // 14..24
  std::uint32_t r = mant >> shift;
  const std::uint32_t rem = mant & ((1u << shift) - 1u);
  const std::uint32_t half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (r & 1u) != 0)) ++r;
  return static_cast<std::uint16_t>(sign | r);
}

template <ElementType G>
float load_grad(const void* grads, std::size_t i) {
  if constexpr (G == ElementType::kF32) {
    return static_cast<const float*>(grads)[i];
  } else if constexpr (G == ElementType::kBF16) {
    return bf16_to_float(static_cast<const std::uint16_t*>(grads)[i]);
  } else {
    return f16_to_float(static_cast<const std::uint16_t*>(grads)[i]);
  }
}

// The loop dispatch() instantiates (cpu_adam_kernel.h), one per combination of choices.
struct ScalarKernel {
  template <DecayKind D, ElementType G, ElementType O, bool kOut>
  static void run(const KernelArgs& a, std::size_t begin, std::size_t end);
  template <DecayKind D, ElementType G, ElementType O, bool kOut, bool kScaled>
  static void loop(const KernelArgs& a, std::size_t begin, std::size_t end);
};

// A load this many pieces (8 elements) or more after a store it may collide with, in loop
// order, no longer slows sequential() (loop_order.h): in the offset sweep of
// docs/benchmarks.md (one thread, state in L2) it ran at 0.15-0.43x of its best with the
// nearest colliding pair one piece apart, 0.57x two, 0.55-0.84x three and 0.95-1.0x four or
// more.
constexpr std::size_t kScalarSafeDistance = 4;

// The sequential order. The scalars and arrays copied out of `a` into locals, the arrays
// restrict-qualified (step() refuses overlapping arrays): a store through params could
// otherwise alias a float member of `a` itself, and the compiler would have to reload the
// constants after every store or guard the vector loop with run-time overlap checks. One plain
// loop, which the compiler vectorises for the baseline ISA. There it is bound by the divider,
// one sqrt and one division per element, not by memory (it runs as fast with its arrays in the
// caches), so a blocked loop with software prefetch or a 2x unrolled one gained nothing
// measurable. Not inlined into loop(), so that the compiler schedules it exactly as the loop it
// was measured as.
template <DecayKind D, ElementType G, ElementType O, bool kOut, bool kScaled>
[[gnu::noinline]] void sequential(const KernelArgs& a, std::size_t begin, std::size_t end) {
  float* __restrict params = a.params;
  float* __restrict ms = a.m;
  float* __restrict vs = a.v;
  const void* grads = a.grads;
  auto* __restrict out = static_cast<std::uint16_t*>(a.out);
  const float grad_scale = a.grad_scale, weight_decay = a.weight_decay;
  const float decay_factor = a.decay_factor, beta1 = a.beta1, one_minus_beta1 = a.one_minus_beta1;
  const float beta2 = a.beta2, one_minus_beta2 = a.one_minus_beta2;
  const float inv_sqrt_bc2 = a.inv_sqrt_bc2, eps = a.eps, neg_step_size = a.neg_step_size;
  for (std::size_t i = begin; i < end; ++i) {
    float p = params[i];
    float g = load_grad<G>(grads, i);
    if constexpr (kScaled) g = g * grad_scale;
    if constexpr (D == DecayKind::kL2) g = g + weight_decay * p;
    if constexpr (D == DecayKind::kDecoupled) p = p * decay_factor;
    const float m = beta1 * ms[i] + one_minus_beta1 * g;
    const float v = beta2 * vs[i] + (one_minus_beta2 * g) * g;
    const float denom = std::sqrt(v) * inv_sqrt_bc2 + eps;
    p = p + neg_step_size * (m / denom);
    params[i] = p;
    ms[i] = m;
    vs[i] = v;
    if constexpr (kOut) out[i] = O == ElementType::kBF16 ? float_to_bf16(p) : float_to_f16(p);
  }
}

// The windowed order (loop_order.h): each window of kWindow elements walked as kStreams
// streams kStride elements apart, one piece of kPiece elements of each stream in turn. Set out
// as sequential() is (locals, restrict-qualified arrays) so that the compiler vectorises every
// piece for the baseline ISA with the same correctly rounded operations; the earlier version,
// which went through `a` and local arrays, compiled to scalar sqrtss/divss and ran at ~0.65x
// of sequential() (docs/benchmarks.md, issue #37). Returns where the windows end.
template <DecayKind D, ElementType G, ElementType O, bool kOut, bool kScaled>
[[gnu::noinline]] std::size_t windowed(const KernelArgs& a, std::size_t begin, std::size_t end) {
  float* __restrict params = a.params;
  float* __restrict ms = a.m;
  float* __restrict vs = a.v;
  const void* __restrict grads = a.grads;
  auto* __restrict out = static_cast<std::uint16_t*>(a.out);
  const float grad_scale = a.grad_scale, weight_decay = a.weight_decay;
  const float decay_factor = a.decay_factor, beta1 = a.beta1, one_minus_beta1 = a.one_minus_beta1;
  const float beta2 = a.beta2, one_minus_beta2 = a.one_minus_beta2;
  const float inv_sqrt_bc2 = a.inv_sqrt_bc2, eps = a.eps, neg_step_size = a.neg_step_size;
  // One element's update, on values already loaded: the operations of sequential().
  const auto update = [&](float& p, float& m, float& v, float g) {
    if constexpr (kScaled) g = g * grad_scale;
    if constexpr (D == DecayKind::kL2) g = g + weight_decay * p;
    if constexpr (D == DecayKind::kDecoupled) p = p * decay_factor;
    m = beta1 * m + one_minus_beta1 * g;
    v = beta2 * v + (one_minus_beta2 * g) * g;
    const float denom = std::sqrt(v) * inv_sqrt_bc2 + eps;
    p = p + neg_step_size * (m / denom);
  };
  constexpr std::size_t kHalf = kPiece / 2;
  std::size_t w = begin;
  for (; w + kWindow <= end; w += kWindow) {
    for (std::size_t k = 0; k < kStride; k += kPiece) {
      for (std::size_t s = 0; s < kStreams; ++s) {
        const std::size_t at = w + s * kStride + k;
        // 2-byte gradients widened first, and a 2-byte copy-out narrowed after, each in a
        // loop over the whole piece: in the half-piece loop below they would take 8-byte
        // vectors (4 x 16 bits), which made GCC build that whole loop of 2-lane vectors.
        [[maybe_unused]] float gw[kPiece];
        [[maybe_unused]] float pw[kPiece];
        if constexpr (G != ElementType::kF32) {
          for (std::size_t e = 0; e < kPiece; ++e) gw[e] = load_grad<G>(grads, at + e);
        }
        // A piece as one loop of kHalf iterations over two elements kHalf apart, which the
        // compiler turns into one pass of 4-lane vectors (SSE2, NEON) that loads both halves of
        // the piece before storing either, as loop_order.h counts. An element a time, the
        // second half's loads would follow the first half's stores, 16 bytes on, and collide
        // with them where the arrays are 16 bytes apart. The arrays never overlap (step()
        // refuses that), which ivdep tells the compiler so that no piece tests for overlap at
        // run time; `unroll 1` keeps GCC from unrolling the loop whole before it vectorises,
        // after which it left the piece scalar or vectorised across streams behind overlap
        // tests (seen in objdump).
#pragma GCC ivdep
#pragma GCC unroll 1
        for (std::size_t e = 0; e < kHalf; ++e) {
          const std::size_t i0 = at + e, i1 = at + kHalf + e;
          float p0 = params[i0], p1 = params[i1];
          float g0, g1;
          if constexpr (G == ElementType::kF32) {
            g0 = load_grad<G>(grads, i0);
            g1 = load_grad<G>(grads, i1);
          } else {
            g0 = gw[e];
            g1 = gw[kHalf + e];
          }
          float m0 = ms[i0], m1 = ms[i1];
          float v0 = vs[i0], v1 = vs[i1];
          update(p0, m0, v0, g0);
          update(p1, m1, v1, g1);
          params[i0] = p0;
          params[i1] = p1;
          ms[i0] = m0;
          ms[i1] = m1;
          vs[i0] = v0;
          vs[i1] = v1;
          if constexpr (kOut) {
            pw[e] = p0;
            pw[kHalf + e] = p1;
          }
        }
        if constexpr (kOut) {
          for (std::size_t e = 0; e < kPiece; ++e) {
            out[at + e] = O == ElementType::kBF16 ? float_to_bf16(pw[e]) : float_to_f16(pw[e]);
          }
        }
      }
    }
  }
  return w;
}

// The range in the order loop_order.h chooses for these arrays: windowed where the sequential
// order has a load within kScalarSafeDistance pieces of a store it may collide with, then the
// remainder (less than a window) in sequence.
template <DecayKind D, ElementType G, ElementType O, bool kOut, bool kScaled>
void ScalarKernel::loop(const KernelArgs& a, std::size_t begin, std::size_t end) {
  std::size_t i = begin;
  if (use_windowed_order(a, kScalarSafeDistance)) i = windowed<D, G, O, kOut, kScaled>(a, i, end);
  sequential<D, G, O, kOut, kScaled>(a, i, end);
}

// Unscaled gradients (grad_scale 1, every step without loss scaling) skip the multiply: g * 1
// is g bit for bit (a NaN keeps its payload and is made quiet by the next operation either
// way). Bound by the divider, the loop gains from each instruction it saves beside it: with the
// arrays in the caches, 0.96 of the baseline-ISA loop's rate with the multiply, 1.01 without.
template <DecayKind D, ElementType G, ElementType O, bool kOut>
void ScalarKernel::run(const KernelArgs& a, std::size_t begin, std::size_t end) {
  if (a.grad_scale == 1.0f) return loop<D, G, O, kOut, false>(a, begin, end);
  loop<D, G, O, kOut, true>(a, begin, end);
}

}  // namespace

void adam_kernel_scalar(const KernelArgs& args, std::size_t begin, std::size_t end) {
  dispatch<ScalarKernel>(args, begin, end);
}

}  // namespace zinf::adam::detail
