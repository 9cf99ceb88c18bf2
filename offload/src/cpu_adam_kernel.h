// SPDX-License-Identifier: Apache-2.0
// The contract between CpuAdam (cpu_adam.cc) and its per-ISA kernels (cpu_adam_<isa>.cc).
// Kept free of the public header and of any std inline code: each kernel TU is compiled with
// its own -m flags, and an inline function emitted there could be merged by the linker into
// code that runs on CPUs without those instructions.
#pragma once

#include <cstddef>
#include <cstdint>

namespace zinf::offload::detail {

enum class ElemType : std::uint8_t { kF32, kBF16, kF16 };

// How decay enters: none (weight_decay == 0, Adam and AdamW coincide), L2 into the gradient,
// or decoupled multiplication of the parameter.
enum class DecayKind : std::uint8_t { kNone, kL2, kDecoupled };

// Everything a kernel needs, with the per-call scalars already folded in double and rounded
// to float once, so that every ISA sees the same constants.
struct KernelArgs {
  float* params;
  float* m;
  float* v;
  const void* grads;      // ElemType grad_type
  void* out;              // ElemType out_type, or nullptr for no copy-out
  ElemType grad_type;
  ElemType out_type;      // kBF16 or kF16 when out != nullptr
  DecayKind decay_kind;
  float grad_scale;       // g = grad * grad_scale
  float weight_decay;     // kL2: g = fma(weight_decay, p, g)
  float decay_factor;     // kDecoupled: p = p * decay_factor, (1 - lr * wd)
  float beta1;
  float one_minus_beta1;
  float beta2;
  float one_minus_beta2;
  float inv_sqrt_bc2;     // 1 / sqrt(1 - beta2^t)
  float eps;
  float neg_step_size;    // -lr / (1 - beta1^t)
};

// Updates elements [begin, end). Every element gets exactly this sequence of fp32 operations
// (fma where written), whatever its position, so the paths agree bitwise:
//   g = grad * grad_scale
//   kL2: g = fma(wd, p, g)         kDecoupled: p = p * decay_factor
//   m = fma(beta1, m, one_minus_beta1 * g)
//   v = fma(beta2, v, (one_minus_beta2 * g) * g)
//   denom = fma(sqrt(v), inv_sqrt_bc2, eps)
//   p = fma(neg_step_size, m / denom, p)
using KernelFn = void (*)(const KernelArgs& args, std::size_t begin, std::size_t end);

void adam_kernel_scalar(const KernelArgs& args, std::size_t begin, std::size_t end);
void stream_rmw_kernel(float* a, const float* b, float s, std::size_t begin, std::size_t end);
#if ZINF_CPU_ADAM_X86
void adam_kernel_avx2(const KernelArgs& args, std::size_t begin, std::size_t end);
void adam_kernel_avx512(const KernelArgs& args, std::size_t begin, std::size_t end);
void adam_kernel_avx512bf16(const KernelArgs& args, std::size_t begin, std::size_t end);
#endif

}  // namespace zinf::offload::detail
