// SPDX-License-Identifier: Apache-2.0
// The contract between CpuAdam (cpu_adam.cc) and its per-ISA kernels (cpu_adam_<isa>.cc).
// Kept free of the public header and of any std inline code: each kernel TU is compiled with
// its own -m flags, and an inline function emitted there could be merged by the linker into
// code that runs on CPUs without those instructions.
#pragma once

#include <cstddef>
#include <cstdint>

#include "zinf/common/element_type.h"

namespace zinf::adam::detail {

// Buffers reach the kernels as kF32, kBF16 or kF16 (zinf::ElementType, found from this
// namespace); CpuAdam refuses the reduction-only types before any kernel runs.

// How decay enters: none (weight_decay == 0, Adam and AdamW coincide), L2 into the gradient,
// or decoupled multiplication of the parameter.
enum class DecayKind : std::uint8_t { kNone, kL2, kDecoupled };

// Everything a kernel needs, with the per-call scalars already folded in double and rounded
// to float once, so that every ISA sees the same constants.
struct KernelArgs {
  float* params;
  float* m;
  float* v;
  const void* grads;  // ElementType grad_type
  void* out;          // ElementType out_type, or nullptr for no copy-out
  ElementType grad_type;
  ElementType out_type;  // kBF16 or kF16 when out != nullptr
  DecayKind decay_kind;
  float grad_scale;    // g = grad * grad_scale
  float weight_decay;  // kL2: g = g + weight_decay * p
  float decay_factor;  // kDecoupled: p = p * decay_factor, (1 - lr * wd)
  float beta1;
  float one_minus_beta1;
  float beta2;
  float one_minus_beta2;
  float inv_sqrt_bc2;  // 1 / sqrt(1 - beta2^t)
  float eps;
  float neg_step_size;  // -lr / (1 - beta1^t)
  // Software prefetch distance in elements, 0 for none (the x86 vector paths read it; the
  // others leave prefetching to the hardware). Changes the speed only, never a bit.
  std::uint32_t prefetch_elems;
};

// Updates elements [begin, end). Every element gets exactly this sequence of fp32 operations,
// each rounded on its own (no fused multiply-add anywhere), whatever its position, so the paths
// agree bitwise:
//   g = grad * grad_scale
//   kL2: g = g + wd * p            kDecoupled: p = p * decay_factor
//   m = beta1 * m + one_minus_beta1 * g
//   v = beta2 * v + (one_minus_beta2 * g) * g
//   denom = sqrt(v) * inv_sqrt_bc2 + eps
//   p = p + neg_step_size * (m / denom)
// Unfused because a CPU without FMA (x86-64's baseline, where the portable path runs) has no
// cheap exact fma: libm's costs a call per operation and made that path 10x slower than a
// plain loop. Plain multiplies and adds are what every ISA does natively and the same on all;
// the vector paths, bound by memory, lose nothing measurable to the extra instructions.
using KernelFn = void (*)(const KernelArgs& args, std::size_t begin, std::size_t end);

// Turns the run-time choices in `a` (decay kind, gradient type, copy-out) into a call of
// `Kernel::run<D, G, O, kOut>(a, begin, end)`, the per-ISA loop. One ladder serves every ISA.
// `Kernel` must be declared in the calling kernel TU's unnamed namespace: every instantiation
// then has internal linkage, so no copy built with one TU's -m flags can be merged by the
// linker into another (the hazard described at the top of this file).
template <class Kernel, DecayKind D, ElementType G>
void dispatch_out(const KernelArgs& a, std::size_t begin, std::size_t end) {
  if (a.out == nullptr) return Kernel::template run<D, G, ElementType::kF32, false>(a, begin, end);
  if (a.out_type == ElementType::kBF16) {
    return Kernel::template run<D, G, ElementType::kBF16, true>(a, begin, end);
  }
  return Kernel::template run<D, G, ElementType::kF16, true>(a, begin, end);
}

template <class Kernel, DecayKind D>
void dispatch_grad(const KernelArgs& a, std::size_t begin, std::size_t end) {
  // CpuAdam::step lets only fp32, bf16 and fp16 through (check_buffer_type).
  if (a.grad_type == ElementType::kBF16) {
    return dispatch_out<Kernel, D, ElementType::kBF16>(a, begin, end);
  }
  if (a.grad_type == ElementType::kF16) {
    return dispatch_out<Kernel, D, ElementType::kF16>(a, begin, end);
  }
  return dispatch_out<Kernel, D, ElementType::kF32>(a, begin, end);
}

template <class Kernel>
void dispatch(const KernelArgs& a, std::size_t begin, std::size_t end) {
  switch (a.decay_kind) {
    case DecayKind::kNone: return dispatch_grad<Kernel, DecayKind::kNone>(a, begin, end);
    case DecayKind::kL2: return dispatch_grad<Kernel, DecayKind::kL2>(a, begin, end);
    case DecayKind::kDecoupled: return dispatch_grad<Kernel, DecayKind::kDecoupled>(a, begin, end);
  }
}

void adam_kernel_scalar(const KernelArgs& args, std::size_t begin, std::size_t end);
#if ZINF_CPU_ADAM_X86
void adam_kernel_avx2(const KernelArgs& args, std::size_t begin, std::size_t end);
void adam_kernel_avx512(const KernelArgs& args, std::size_t begin, std::size_t end);
void adam_kernel_avx512bf16(const KernelArgs& args, std::size_t begin, std::size_t end);
#endif
#if ZINF_CPU_ADAM_NEON
void adam_kernel_neon(const KernelArgs& args, std::size_t begin, std::size_t end);
// Built with +sve (cpu_adam_sve.cc): call only where HWCAP_SVE is set.
void adam_kernel_sve(const KernelArgs& args, std::size_t begin, std::size_t end);
// svcntb(): the SVE vector length in bytes, for the choice between SVE and NEON.
std::size_t sve_vector_bytes();
#endif

}  // namespace zinf::adam::detail
