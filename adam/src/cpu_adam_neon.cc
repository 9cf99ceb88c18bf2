// SPDX-License-Identifier: Apache-2.0
// The NEON (AArch64 Advanced SIMD) CpuAdam kernel. Built only for aarch64 (adam/CMakeLists.txt),
// with the baseline flags plus -ffp-contract=off: NEON is part of every AArch64 CPU, so no -m
// flag is needed, but the run-time table still picks this path (cpu_adam.cc), so that
// ZINF_CPU_ADAM_ISA=scalar and ZINF_CPU_ADAM_DISABLE=neon work as on x86.
//
// 4 floats per vector, two vectors per iteration. Every operation is the plain multiply, add,
// square root or division of cpu_adam_kernel.h's contract, each rounded on its own: GCC's
// vmulq_f32 and vaddq_f32 are ordinary `*` and `+` on vector types, which the compiler would
// fuse into FMLA without -ffp-contract=off, and vfmaq_f32 is never used. As with the AVX2
// path, the tail (fewer than 4 elements) is copied into zero-padded local vectors, updated by
// the same code as the body, and copied back, so a tail element gets a body element's bits.
//
// The conversions agree bit for bit with the scalar path (cpu_adam_scalar.cc):
//  - fp16 <-> fp32 by FCVTL/FCVTN (vcvt_f32_f16, vcvt_f16_f32), which under Linux's default
//    FPCR (round to nearest even, no flush to zero, no default NaN) widen exactly, round to
//    nearest even with subnormal results and overflow to infinity, and quieten a NaN keeping
//    its sign and top payload bits, as the scalar functions spell out;
//  - bf16 -> fp32 by a 16-bit shift, exact;
//  - fp32 -> bf16 by integer rounding (add 0x7fff plus the kept lowest bit, shift), with a NaN
//    made quiet by setting bit 6 of its top half, as the scalar path does. AArch64's BFCVTN
//    (FEAT_BF16) is not used: it is optional, and where FPCR.FZ or an implementation flushes
//    subnormals it would differ from the scalar path.
// No software prefetch: the x86 paths' distance was measured on x86 hosts only, and AArch64
// cores' hardware prefetchers follow these four linear streams; nothing was measured on Arm
// hardware yet (docs/benchmarks.md).
#include <arm_neon.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "cpu_adam_kernel.h"

namespace zinf::adam::detail {
namespace {

constexpr std::size_t kLanes = 4;

struct Consts {
  float32x4_t grad_scale, weight_decay, decay_factor, beta1, one_minus_beta1, beta2,
      one_minus_beta2, inv_sqrt_bc2, eps, neg_step_size;
  explicit Consts(const KernelArgs& a)
      : grad_scale(vdupq_n_f32(a.grad_scale)),
        weight_decay(vdupq_n_f32(a.weight_decay)),
        decay_factor(vdupq_n_f32(a.decay_factor)),
        beta1(vdupq_n_f32(a.beta1)),
        one_minus_beta1(vdupq_n_f32(a.one_minus_beta1)),
        beta2(vdupq_n_f32(a.beta2)),
        one_minus_beta2(vdupq_n_f32(a.one_minus_beta2)),
        inv_sqrt_bc2(vdupq_n_f32(a.inv_sqrt_bc2)),
        eps(vdupq_n_f32(a.eps)),
        neg_step_size(vdupq_n_f32(a.neg_step_size)) {}
};

// Pointers to one vector's worth of every array (into the caller's arrays, or into the
// zero-padded tail copies).
struct Lanes {
  float* p;
  float* m;
  float* v;
  const void* g;
  std::uint16_t* out;
};

template <ElementType G>
constexpr std::size_t grad_bytes() {
  return G == ElementType::kF32 ? 4 : 2;
}

template <ElementType G>
inline float32x4_t load_grad(const void* g) {
  if constexpr (G == ElementType::kF32) {
    return vld1q_f32(static_cast<const float*>(g));
  } else {
    const uint16x4_t h = vld1_u16(static_cast<const std::uint16_t*>(g));
    if constexpr (G == ElementType::kBF16) {
      return vreinterpretq_f32_u32(vshll_n_u16(h, 16));
    } else {
      return vcvt_f32_f16(vreinterpret_f16_u16(h));
    }
  }
}

// fp32 -> bf16, round to nearest even; NaN made quiet keeping its top bits (as the scalar path).
inline uint16x4_t to_bf16(float32x4_t x) {
  const uint32x4_t u = vreinterpretq_u32_f32(x);
  const uint32x4_t hi = vshrq_n_u32(u, 16);
  const uint32x4_t lsb = vandq_u32(hi, vdupq_n_u32(1));
  const uint32x4_t rounded = vshrq_n_u32(vaddq_u32(vaddq_u32(u, vdupq_n_u32(0x7fff)), lsb), 16);
  const uint32x4_t is_num = vceqq_f32(x, x);  // all ones unless NaN
  const uint32x4_t quiet = vorrq_u32(hi, vdupq_n_u32(0x40));
  // Every lane is <= 0xffff, so the narrowing keeps it whole.
  return vmovn_u32(vbslq_u32(is_num, rounded, quiet));
}

template <DecayKind D, ElementType G, ElementType O, bool kOut>
inline void update(const Consts& c, const Lanes& l) {
  float32x4_t g = vmulq_f32(load_grad<G>(l.g), c.grad_scale);
  float32x4_t p = vld1q_f32(l.p);
  float32x4_t m = vld1q_f32(l.m);
  float32x4_t v = vld1q_f32(l.v);
  if constexpr (D == DecayKind::kL2) g = vaddq_f32(g, vmulq_f32(c.weight_decay, p));
  if constexpr (D == DecayKind::kDecoupled) p = vmulq_f32(p, c.decay_factor);
  m = vaddq_f32(vmulq_f32(c.beta1, m), vmulq_f32(c.one_minus_beta1, g));
  v = vaddq_f32(vmulq_f32(c.beta2, v), vmulq_f32(vmulq_f32(c.one_minus_beta2, g), g));
  const float32x4_t denom = vaddq_f32(vmulq_f32(vsqrtq_f32(v), c.inv_sqrt_bc2), c.eps);
  p = vaddq_f32(p, vmulq_f32(c.neg_step_size, vdivq_f32(m, denom)));
  vst1q_f32(l.p, p);
  vst1q_f32(l.m, m);
  vst1q_f32(l.v, v);
  if constexpr (kOut) {
    uint16x4_t h;
    if constexpr (O == ElementType::kBF16) {
      h = to_bf16(p);
    } else {
      h = vreinterpret_u16_f16(vcvt_f16_f32(p));
    }
    vst1_u16(l.out, h);
  }
}

// The loop dispatch() instantiates (cpu_adam_kernel.h), one per combination of choices.
struct NeonKernel {
  template <DecayKind D, ElementType G, ElementType O, bool kOut>
  static void run(const KernelArgs& a, std::size_t begin, std::size_t end);
};

template <DecayKind D, ElementType G, ElementType O, bool kOut>
void NeonKernel::run(const KernelArgs& a, std::size_t begin, std::size_t end) {
  const Consts c(a);
  const auto* grads = static_cast<const unsigned char*>(a.grads);
  auto* out = static_cast<std::uint16_t*>(a.out);
  auto lanes_at = [&](std::size_t i) {
    return Lanes{a.params + i, a.m + i, a.v + i, grads + i * grad_bytes<G>(),
                 kOut ? out + i : nullptr};
  };
  std::size_t i = begin;
  for (; i + 2 * kLanes <= end; i += 2 * kLanes) {
    update<D, G, O, kOut>(c, lanes_at(i));
    update<D, G, O, kOut>(c, lanes_at(i + kLanes));
  }
  for (; i + kLanes <= end; i += kLanes) update<D, G, O, kOut>(c, lanes_at(i));
  if (i < end) {
    const std::size_t n = end - i;
    alignas(16) float p[kLanes] = {};
    alignas(16) float m[kLanes] = {};
    alignas(16) float v[kLanes] = {};
    alignas(16) unsigned char g[kLanes * 4] = {};
    alignas(16) std::uint16_t o[kLanes] = {};
    std::memcpy(p, a.params + i, n * sizeof(float));
    std::memcpy(m, a.m + i, n * sizeof(float));
    std::memcpy(v, a.v + i, n * sizeof(float));
    std::memcpy(g, grads + i * grad_bytes<G>(), n * grad_bytes<G>());
    update<D, G, O, kOut>(c, Lanes{p, m, v, g, o});
    std::memcpy(a.params + i, p, n * sizeof(float));
    std::memcpy(a.m + i, m, n * sizeof(float));
    std::memcpy(a.v + i, v, n * sizeof(float));
    if constexpr (kOut) std::memcpy(out + i, o, n * sizeof(std::uint16_t));
  }
}

}  // namespace

void adam_kernel_neon(const KernelArgs& args, std::size_t begin, std::size_t end) {
  dispatch<NeonKernel>(args, begin, end);
}

}  // namespace zinf::adam::detail
