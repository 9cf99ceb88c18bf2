// SPDX-License-Identifier: Apache-2.0
// The SVE (AArch64 Scalable Vector Extension) CpuAdam kernel. Built only for aarch64, and this
// file alone with -march=armv8.2-a+sve -ffp-contract=off (adam/CMakeLists.txt): SVE is optional,
// so the rest of the library stays on the baseline and cpu_adam.cc calls in here only when the
// auxiliary vector's HWCAP_SVE says the CPU and kernel support it.
//
// Vector-length agnostic: one vector of svcntw() floats per iteration, whatever the hardware's
// length (128 to 2048 bits), under a svwhilelt_b32 predicate that also covers the tail, so no
// scalar or zero-padded tail code is needed. Predicated loads give zero in inactive lanes and
// predicated stores leave memory there untouched, and neither faults on an inactive lane, so
// the last, partial vector reads and writes nothing past `end`. The arithmetic on those zero
// lanes (denom = eps) is thrown away.
//
// Every operation is the plain multiply, add, square root or division of cpu_adam_kernel.h's
// contract, each rounded on its own: svmul_x and svadd_x are FMUL and FADD, which GCC would
// fuse into FMLA/FMAD without -ffp-contract=off, and svmla/svmad are never used. An element's
// bits therefore depend neither on its lane nor on the vector length, which is what lets the
// tests compare this path with the scalar one at several lengths under qemu.
//
// The conversions agree bit for bit with the scalar path (cpu_adam_scalar.cc) and NEON's:
//  - fp16 <-> fp32 by FCVT (svcvt_f32_f16, svcvt_f16_f32), which under Linux's default FPCR
//    (round to nearest even, no flush to zero, no default NaN) behaves as NEON's FCVTL/FCVTN:
//    exact widening, narrowing with round to nearest even, subnormal results and overflow to
//    infinity, and a NaN quietened keeping its sign and top payload bits. Each halfword sits in
//    the low (even) half of a 32-bit lane: svld1uh_u32 zero-extends halfwords into the lanes,
//    FCVT reads and writes the even halfwords of .S containers, and svst1h_u32 stores each
//    lane's low halfword;
//  - bf16 -> fp32 by a 16-bit shift, exact;
//  - fp32 -> bf16 by integer rounding (add 0x7fff plus the kept lowest bit, shift), with a NaN
//    made quiet by setting bit 6 of its top half, as the scalar path does. SVE's BFCVT
//    (FEAT_BF16) is not used, for NEON's reasons: it is optional, and where FPCR.FZ or an
//    implementation flushes subnormals it would differ from the scalar path.
// No software prefetch and no unrolling: nothing was measured on SVE hardware yet
// (docs/benchmarks.md), and the four linear streams are what hardware prefetchers follow.
#include <arm_sve.h>

#include <cstddef>
#include <cstdint>

#include "cpu_adam_kernel.h"

namespace zinf::adam::detail {
namespace {

template <ElementType G>
inline svfloat32_t load_grad(svbool_t pg, const void* grads, std::size_t i) {
  if constexpr (G == ElementType::kF32) {
    return svld1_f32(pg, static_cast<const float*>(grads) + i);
  } else {
    const svuint32_t h = svld1uh_u32(pg, static_cast<const std::uint16_t*>(grads) + i);
    if constexpr (G == ElementType::kBF16) {
      return svreinterpret_f32_u32(svlsl_n_u32_x(pg, h, 16));
    } else {
      return svcvt_f32_f16_x(pg, svreinterpret_f16_u32(h));
    }
  }
}

// fp32 -> bf16 in each lane's low halfword, round to nearest even; NaN made quiet keeping its
// top bits (as the scalar path).
inline svuint32_t to_bf16(svbool_t pg, svfloat32_t x) {
  const svuint32_t u = svreinterpret_u32_f32(x);
  const svuint32_t hi = svlsr_n_u32_x(pg, u, 16);
  const svuint32_t lsb = svand_n_u32_x(pg, hi, 1);
  const svuint32_t rounded =
      svlsr_n_u32_x(pg, svadd_u32_x(pg, svadd_n_u32_x(pg, u, 0x7fff), lsb), 16);
  const svbool_t is_nan = svcmpuo_f32(pg, x, x);
  const svuint32_t quiet = svorr_n_u32_x(pg, hi, 0x40);
  return svsel_u32(is_nan, quiet, rounded);
}

// The loop dispatch() instantiates (cpu_adam_kernel.h), one per combination of choices.
struct SveKernel {
  template <DecayKind D, ElementType G, ElementType O, bool kOut>
  static void run(const KernelArgs& a, std::size_t begin, std::size_t end);
};

template <DecayKind D, ElementType G, ElementType O, bool kOut>
void SveKernel::run(const KernelArgs& a, std::size_t begin, std::size_t end) {
  // SVE vector types are sizeless: they cannot be members of a struct, so the broadcast
  // constants are locals, which the compiler keeps in registers across the loop.
  const svfloat32_t grad_scale = svdup_n_f32(a.grad_scale);
  const svfloat32_t weight_decay = svdup_n_f32(a.weight_decay);
  const svfloat32_t decay_factor = svdup_n_f32(a.decay_factor);
  const svfloat32_t beta1 = svdup_n_f32(a.beta1);
  const svfloat32_t one_minus_beta1 = svdup_n_f32(a.one_minus_beta1);
  const svfloat32_t beta2 = svdup_n_f32(a.beta2);
  const svfloat32_t one_minus_beta2 = svdup_n_f32(a.one_minus_beta2);
  const svfloat32_t inv_sqrt_bc2 = svdup_n_f32(a.inv_sqrt_bc2);
  const svfloat32_t eps = svdup_n_f32(a.eps);
  const svfloat32_t neg_step_size = svdup_n_f32(a.neg_step_size);
  auto* out = static_cast<std::uint16_t*>(a.out);
  const std::size_t lanes = svcntw();
  for (std::size_t i = begin; i < end; i += lanes) {
    const svbool_t pg = svwhilelt_b32_u64(i, end);
    svfloat32_t g = svmul_f32_x(pg, load_grad<G>(pg, a.grads, i), grad_scale);
    svfloat32_t p = svld1_f32(pg, a.params + i);
    svfloat32_t m = svld1_f32(pg, a.m + i);
    svfloat32_t v = svld1_f32(pg, a.v + i);
    if constexpr (D == DecayKind::kL2) {
      g = svadd_f32_x(pg, g, svmul_f32_x(pg, weight_decay, p));
    }
    if constexpr (D == DecayKind::kDecoupled) p = svmul_f32_x(pg, p, decay_factor);
    m = svadd_f32_x(pg, svmul_f32_x(pg, beta1, m), svmul_f32_x(pg, one_minus_beta1, g));
    v = svadd_f32_x(pg, svmul_f32_x(pg, beta2, v),
                    svmul_f32_x(pg, svmul_f32_x(pg, one_minus_beta2, g), g));
    const svfloat32_t denom =
        svadd_f32_x(pg, svmul_f32_x(pg, svsqrt_f32_x(pg, v), inv_sqrt_bc2), eps);
    p = svadd_f32_x(pg, p, svmul_f32_x(pg, neg_step_size, svdiv_f32_x(pg, m, denom)));
    svst1_f32(pg, a.params + i, p);
    svst1_f32(pg, a.m + i, m);
    svst1_f32(pg, a.v + i, v);
    if constexpr (kOut) {
      svuint32_t h;
      if constexpr (O == ElementType::kBF16) {
        h = to_bf16(pg, p);
      } else {
        h = svreinterpret_u32_f16(svcvt_f16_f32_x(pg, p));
      }
      svst1h_u32(pg, out + i, h);
    }
  }
}

}  // namespace

void adam_kernel_sve(const KernelArgs& args, std::size_t begin, std::size_t end) {
  dispatch<SveKernel>(args, begin, end);
}

std::size_t sve_vector_bytes() { return svcntb(); }

}  // namespace zinf::adam::detail
