// SPDX-License-Identifier: Apache-2.0
// The AVX2 + FMA + F16C CpuAdam kernel. Built with -mavx2 -mfma -mf16c only on x86
// (adam/CMakeLists.txt) and called only when cpuid says the CPU and OS support it.
//
// 8 floats per vector. AVX2 has no masked 16-bit loads, so the tail (fewer than 8 elements)
// is copied into zero-padded local vectors, updated by the same code as the body, and copied
// back: a tail element gets exactly the arithmetic of a body one.
//
// The vectors are visited in one of two orders, chosen per call from the arrays' addresses so
// that no load waits on a store it only seems to depend on (loop_order.h).
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "bf16_x86.h"
#include "cpu_adam_kernel.h"
#include "cpu_adam_x86_common.h"
#include "loop_order.h"

namespace zinf::adam::detail {
namespace {

constexpr std::size_t kLanes = 8;

// A load this many vectors or more after a store it may collide with, in loop order, no
// longer slows this loop (loop_order.h): in the offset sweep of docs/benchmarks.md (one
// thread, state in L2) the sequential loop ran at 0.14x of its best with the nearest colliding
// pair one vector apart, 0.5x two, 0.73x three, 0.95x four and 0.96-1.0x five or more.
constexpr std::size_t kAvx2SafeDistance = 5;
struct Consts {
  __m256 grad_scale, weight_decay, decay_factor, beta1, one_minus_beta1, beta2, one_minus_beta2,
      inv_sqrt_bc2, eps, neg_step_size;
  explicit Consts(const KernelArgs& a)
      : grad_scale(_mm256_set1_ps(a.grad_scale)),
        weight_decay(_mm256_set1_ps(a.weight_decay)),
        decay_factor(_mm256_set1_ps(a.decay_factor)),
        beta1(_mm256_set1_ps(a.beta1)),
        one_minus_beta1(_mm256_set1_ps(a.one_minus_beta1)),
        beta2(_mm256_set1_ps(a.beta2)),
        one_minus_beta2(_mm256_set1_ps(a.one_minus_beta2)),
        inv_sqrt_bc2(_mm256_set1_ps(a.inv_sqrt_bc2)),
        eps(_mm256_set1_ps(a.eps)),
        neg_step_size(_mm256_set1_ps(a.neg_step_size)) {}
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
inline __m256 load_grad(const void* g) {
  if constexpr (G == ElementType::kF32) {
    return _mm256_loadu_ps(static_cast<const float*>(g));
  } else {
    const __m128i h = _mm_loadu_si128(static_cast<const __m128i*>(g));
    if constexpr (G == ElementType::kBF16) {
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    } else {
      return _mm256_cvtph_ps(h);
    }
  }
}

template <DecayKind D, ElementType G, ElementType O, bool kOut>
inline void update(const Consts& c, const Lanes& l) {
  __m256 g = _mm256_mul_ps(load_grad<G>(l.g), c.grad_scale);
  __m256 p = _mm256_loadu_ps(l.p);
  __m256 m = _mm256_loadu_ps(l.m);
  __m256 v = _mm256_loadu_ps(l.v);
  if constexpr (D == DecayKind::kL2) g = _mm256_add_ps(g, _mm256_mul_ps(c.weight_decay, p));
  if constexpr (D == DecayKind::kDecoupled) p = _mm256_mul_ps(p, c.decay_factor);
  m = _mm256_add_ps(_mm256_mul_ps(c.beta1, m), _mm256_mul_ps(c.one_minus_beta1, g));
  v = _mm256_add_ps(_mm256_mul_ps(c.beta2, v),
                    _mm256_mul_ps(_mm256_mul_ps(c.one_minus_beta2, g), g));
  const __m256 denom = _mm256_add_ps(_mm256_mul_ps(_mm256_sqrt_ps(v), c.inv_sqrt_bc2), c.eps);
  p = _mm256_add_ps(p, _mm256_mul_ps(c.neg_step_size, _mm256_div_ps(m, denom)));
  _mm256_storeu_ps(l.p, p);
  _mm256_storeu_ps(l.m, m);
  _mm256_storeu_ps(l.v, v);
  if constexpr (kOut) {
    __m128i h;
    if constexpr (O == ElementType::kBF16) {
      h = bf16_round_256(p);
    } else {
      h = _mm256_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(l.out), h);
  }
}

// The loop dispatch() instantiates (cpu_adam_kernel.h), one per combination of choices.
struct Avx2Kernel {
  template <DecayKind D, ElementType G, ElementType O, bool kOut>
  static void run(const KernelArgs& a, std::size_t begin, std::size_t end);
  template <DecayKind D, ElementType G, ElementType O, bool kOut, bool kPrefetch>
  static void loop(const KernelArgs& a, std::size_t begin, std::size_t end);
};

template <DecayKind D, ElementType G, ElementType O, bool kOut>
void Avx2Kernel::run(const KernelArgs& a, std::size_t begin, std::size_t end) {
  if (a.prefetch_elems == 0) return loop<D, G, O, kOut, false>(a, begin, end);
  loop<D, G, O, kOut, true>(a, begin, end);
}

template <DecayKind D, ElementType G, ElementType O, bool kOut, bool kPrefetch>
void Avx2Kernel::loop(const KernelArgs& a, std::size_t begin, std::size_t end) {
  const Consts c(a);
  const auto* grads = static_cast<const unsigned char*>(a.grads);
  auto* out = static_cast<std::uint16_t*>(a.out);
  auto lanes_at = [&](std::size_t i) {
    return Lanes{a.params + i, a.m + i, a.v + i, grads + i * grad_bytes<G>(),
                 kOut ? out + i : nullptr};
  };
  std::size_t i = begin;
  // The order, sequential or windowed, that keeps loads clear of recent stores they may
  // collide with (loop_order.h). The windowed order's piece is one vector.
  static_assert(kPiece == kLanes);
  if (use_windowed_order(a, kAvx2SafeDistance)) {
    for (; i + kWindow <= end; i += kWindow) {
      for (std::size_t k = 0; k < kStride; k += kLanes) {
        if constexpr (kPrefetch) {
          // A round covers 64 elements' worth of lines: 4 of each fp32 array.
          const std::size_t ahead = (i + a.prefetch_elems + k * kStreams) * 4;
          for (std::size_t q = 0; q < 4; ++q) {
            prefetch(a.params, ahead + 64 * q);
            prefetch(a.m, ahead + 64 * q);
            prefetch(a.v, ahead + 64 * q);
          }
          const std::size_t ahead_g = (i + a.prefetch_elems + k * kStreams) * grad_bytes<G>();
          for (std::size_t q = 0; q < grad_bytes<G>(); ++q) prefetch(grads, ahead_g + 64 * q);
        }
        for (std::size_t s = 0; s < kStreams; ++s) {
          update<D, G, O, kOut>(c, lanes_at(i + s * kStride + k));
        }
      }
    }
  }
  for (; i + 2 * kLanes <= end; i += 2 * kLanes) {
    if constexpr (kPrefetch) {
      // One cache line of each fp32 array per iteration.
      const std::size_t ahead = i + a.prefetch_elems;
      prefetch(a.params, ahead * 4);
      prefetch(a.m, ahead * 4);
      prefetch(a.v, ahead * 4);
      prefetch(grads, ahead * grad_bytes<G>());
    }
    update<D, G, O, kOut>(c, lanes_at(i));
    update<D, G, O, kOut>(c, lanes_at(i + kLanes));
  }
  for (; i + kLanes <= end; i += kLanes) update<D, G, O, kOut>(c, lanes_at(i));
  if (i < end) {
    const std::size_t n = end - i;
    alignas(32) float p[kLanes] = {};
    alignas(32) float m[kLanes] = {};
    alignas(32) float v[kLanes] = {};
    alignas(32) unsigned char g[kLanes * 4] = {};
    alignas(32) std::uint16_t o[kLanes] = {};
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

void adam_kernel_avx2(const KernelArgs& args, std::size_t begin, std::size_t end) {
  dispatch<Avx2Kernel>(args, begin, end);
}

}  // namespace zinf::adam::detail
