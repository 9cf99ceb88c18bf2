// SPDX-License-Identifier: Apache-2.0
// The AVX-512 CpuAdam kernel body, included by cpu_adam_avx512.cc and cpu_adam_avx512bf16.cc
// (which defines ZINF_ADAM_USE_AVX512BF16 and is built with -mavx512bf16). Everything here has
// internal linkage so that the two builds, and the other ISAs, never share a symbol.
//
// 16 floats per vector. The body runs unmasked; the tail (fewer than 16 elements) runs the
// same update with a lane mask, so a tail element gets exactly the arithmetic of a body one.
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "bf16_x86.h"
#include "cpu_adam_kernel.h"
#include "cpu_adam_x86_common.h"

namespace zinf::adam::detail {
namespace {

constexpr std::size_t kLanes = 16;

struct Consts {
  __m512 grad_scale, weight_decay, decay_factor, beta1, one_minus_beta1, beta2, one_minus_beta2,
      inv_sqrt_bc2, eps, neg_step_size;
  explicit Consts(const KernelArgs& a)
      : grad_scale(_mm512_set1_ps(a.grad_scale)),
        weight_decay(_mm512_set1_ps(a.weight_decay)),
        decay_factor(_mm512_set1_ps(a.decay_factor)),
        beta1(_mm512_set1_ps(a.beta1)),
        one_minus_beta1(_mm512_set1_ps(a.one_minus_beta1)),
        beta2(_mm512_set1_ps(a.beta2)),
        one_minus_beta2(_mm512_set1_ps(a.one_minus_beta2)),
        inv_sqrt_bc2(_mm512_set1_ps(a.inv_sqrt_bc2)),
        eps(_mm512_set1_ps(a.eps)),
        neg_step_size(_mm512_set1_ps(a.neg_step_size)) {}
};

template <bool kMasked>
inline __m512 load_f32(const float* p, __mmask16 k) {
  if constexpr (kMasked) return _mm512_maskz_loadu_ps(k, p);
  return _mm512_loadu_ps(p);
}

template <bool kMasked>
inline void store_f32(float* p, __m512 x, __mmask16 k) {
  if constexpr (kMasked) {
    _mm512_mask_storeu_ps(p, k, x);
  } else {
    _mm512_storeu_ps(p, x);
  }
}

template <bool kMasked>
inline __m256i load_u16(const std::uint16_t* p, __mmask16 k) {
  if constexpr (kMasked) return _mm256_maskz_loadu_epi16(k, p);
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

template <bool kMasked>
inline void store_u16(std::uint16_t* p, __m256i x, __mmask16 k) {
  if constexpr (kMasked) {
    _mm256_mask_storeu_epi16(p, k, x);
  } else {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), x);
  }
}

template <ElementType G, bool kMasked>
inline __m512 load_grad(const void* grads, std::size_t i, __mmask16 k) {
  if constexpr (G == ElementType::kF32) {
    return load_f32<kMasked>(static_cast<const float*>(grads) + i, k);
  } else if constexpr (G == ElementType::kBF16) {
    const __m256i h = load_u16<kMasked>(static_cast<const std::uint16_t*>(grads) + i, k);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  } else {
    return _mm512_cvtph_ps(load_u16<kMasked>(static_cast<const std::uint16_t*>(grads) + i, k));
  }
}

// fp32 -> bf16, round to nearest even; NaN made quiet keeping its top bits (as VCVTNEPS2BF16).
inline __m256i to_bf16(__m512 x) {
#if ZINF_ADAM_USE_AVX512BF16
  return reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(x));
#else
  return bf16_round_512(x);
#endif
}

template <ElementType O, bool kMasked>
inline void store_out(void* out, std::size_t i, __m512 p, __mmask16 k) {
  auto* dst = static_cast<std::uint16_t*>(out) + i;
  if constexpr (O == ElementType::kBF16) {
    store_u16<kMasked>(dst, to_bf16(p), k);
  } else {
    store_u16<kMasked>(dst, _mm512_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), k);
  }
}

// One vector of every input array, as loaded. The loop loads a block's vectors one block
// before it stores that block's results (Avx512Kernel::loop says why).
struct In {
  __m512 g, p, m, v;
};

// Forced inline: out of line, GCC 12 warns (-Wuninitialized) about the intrinsics' own
// self-initialised "undefined" vectors, and a call per vector would cost the loop anyway.
template <ElementType G, bool kMasked>
[[gnu::always_inline]] inline In load_in(const KernelArgs& a, std::size_t i, __mmask16 k) {
  return {load_grad<G, kMasked>(a.grads, i, k), load_f32<kMasked>(a.params + i, k),
          load_f32<kMasked>(a.m + i, k), load_f32<kMasked>(a.v + i, k)};
}

template <DecayKind D, ElementType O, bool kOut, bool kMasked>
[[gnu::always_inline]] inline void finish(const KernelArgs& a, const Consts& c, In x, std::size_t i,
                                          __mmask16 k) {
  __m512 g = _mm512_mul_ps(x.g, c.grad_scale);
  __m512 p = x.p;
  __m512 m = x.m;
  __m512 v = x.v;
  if constexpr (D == DecayKind::kL2) g = _mm512_add_ps(g, _mm512_mul_ps(c.weight_decay, p));
  if constexpr (D == DecayKind::kDecoupled) p = _mm512_mul_ps(p, c.decay_factor);
  m = _mm512_add_ps(_mm512_mul_ps(c.beta1, m), _mm512_mul_ps(c.one_minus_beta1, g));
  v = _mm512_add_ps(_mm512_mul_ps(c.beta2, v),
                    _mm512_mul_ps(_mm512_mul_ps(c.one_minus_beta2, g), g));
  const __m512 denom = _mm512_add_ps(_mm512_mul_ps(_mm512_sqrt_ps(v), c.inv_sqrt_bc2), c.eps);
  p = _mm512_add_ps(p, _mm512_mul_ps(c.neg_step_size, _mm512_div_ps(m, denom)));
  store_f32<kMasked>(a.params + i, p, k);
  store_f32<kMasked>(a.m + i, m, k);
  store_f32<kMasked>(a.v + i, v, k);
  if constexpr (kOut) store_out<O, kMasked>(a.out, i, p, k);
}

template <DecayKind D, ElementType G, ElementType O, bool kOut, bool kMasked>
inline void update(const KernelArgs& a, const Consts& c, std::size_t i, __mmask16 k) {
  finish<D, O, kOut, kMasked>(a, c, load_in<G, kMasked>(a, i, k), i, k);
}

// The loop dispatch() instantiates (cpu_adam_kernel.h), one per combination of choices.
struct Avx512Kernel {
  template <DecayKind D, ElementType G, ElementType O, bool kOut>
  static void run(const KernelArgs& a, std::size_t begin, std::size_t end);
  template <DecayKind D, ElementType G, ElementType O, bool kOut, bool kPrefetch>
  static void loop(const KernelArgs& a, std::size_t begin, std::size_t end);
};

template <DecayKind D, ElementType G, ElementType O, bool kOut>
void Avx512Kernel::run(const KernelArgs& a, std::size_t begin, std::size_t end) {
  if (a.prefetch_elems == 0) return loop<D, G, O, kOut, false>(a, begin, end);
  loop<D, G, O, kOut, true>(a, begin, end);
}

template <DecayKind D, ElementType G, ElementType O, bool kOut, bool kPrefetch>
void Avx512Kernel::loop(const KernelArgs& a, std::size_t begin, std::size_t end) {
  const Consts c(a);
  std::size_t i = begin;
  // Blocks of two vectors (two cache lines of each fp32 array), with two independent chains
  // of sqrt and div in flight, software-pipelined: the next block's loads are issued before
  // this block's stores. A load issued after a store whose address agrees with its own in the
  // low 20 bits (of the physical address, on the core measured: "4K aliasing" with bits 12-19
  // too, loop_order.h) waits for that store, and the store's data comes last, after the
  // divide. When one array starts 1 to 127 bytes past another mod 1 MiB on huge pages,
  // loading vector j+1 of the first right after storing vector j of the second hit that in
  // every vector and slowed the loop by up to 2.5x (docs/benchmarks.md, issue #37). With the
  // loads a block ahead, every store older than a load is at least three vectors behind it.
  // The order of loads and stores changes no value: the arrays never overlap.
  constexpr std::size_t kBlock = 2 * kLanes;
  if (i + kBlock <= end) {
    In x0 = load_in<G, false>(a, i, 0);
    In x1 = load_in<G, false>(a, i + kLanes, 0);
    for (; i + 2 * kBlock <= end; i += kBlock) {
      if constexpr (kPrefetch) {
        const std::size_t ahead = i + a.prefetch_elems;
        prefetch(a.params, ahead * 4);
        prefetch(a.params, ahead * 4 + 64);
        prefetch(a.m, ahead * 4);
        prefetch(a.m, ahead * 4 + 64);
        prefetch(a.v, ahead * 4);
        prefetch(a.v, ahead * 4 + 64);
        prefetch(a.grads, ahead * grad_bytes<G>());
        if constexpr (G == ElementType::kF32) prefetch(a.grads, ahead * 4 + 64);
      }
      const In y0 = load_in<G, false>(a, i + kBlock, 0);
      const In y1 = load_in<G, false>(a, i + kBlock + kLanes, 0);
      finish<D, O, kOut, false>(a, c, x0, i, 0);
      finish<D, O, kOut, false>(a, c, x1, i + kLanes, 0);
      x0 = y0;
      x1 = y1;
    }
    finish<D, O, kOut, false>(a, c, x0, i, 0);
    finish<D, O, kOut, false>(a, c, x1, i + kLanes, 0);
    i += kBlock;
  }
  for (; i + kLanes <= end; i += kLanes) update<D, G, O, kOut, false>(a, c, i, 0);
  if (i < end) {
    const auto k = static_cast<__mmask16>((1u << (end - i)) - 1u);
    update<D, G, O, kOut, true>(a, c, i, k);
  }
}

}  // namespace
}  // namespace zinf::adam::detail
