// SPDX-License-Identifier: Apache-2.0
// The AVX2 + FMA + F16C CpuAdam kernel. Built with -mavx2 -mfma -mf16c only on x86
// (adam/CMakeLists.txt) and called only when cpuid says the CPU and OS support it.
//
// 8 floats per vector. AVX2 has no masked 16-bit loads, so the tail (fewer than 8 elements)
// is copied into zero-padded local vectors, updated by the same code as the body, and copied
// back: a tail element gets exactly the arithmetic of a body one.
//
// The vectors are visited in one of two orders, chosen per call from the arrays' addresses so
// that no load waits on a store it only seems to depend on (Avx2Kernel::loop says why).
#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "bf16_x86.h"
#include "cpu_adam_kernel.h"
#include "cpu_adam_x86_common.h"

namespace zinf::adam::detail {
namespace {

constexpr std::size_t kLanes = 8;
constexpr std::uint32_t kVectorBytes = kLanes * 4;

// The windowed order (Avx2Kernel::loop): each window of 1024 elements, 4 KiB of an fp32 array,
// is walked as 8 streams 128 elements (512 bytes) apart, one vector of each stream in turn.
constexpr std::size_t kStreams = 8;
constexpr std::size_t kStride = 128;
constexpr std::size_t kWindow = kStreams * kStride;
constexpr std::uint32_t kStrideBytes = kStride * 4;

// A load waits for an older store still in flight whose address agrees with its own in the
// low 12 bits (4K aliasing: the core compares only those bits at first), and a store here
// leaves only after its vector's sqrt and divide. A load this many vectors or more after such a
// store, in loop order, no longer slows the loop: in the offset sweep of docs/benchmarks.md
// (issue #37) the sequential loop ran at 0.14x of its best with the nearest aliasing pair one
// vector apart, 0.5x two, 0.73x three, 0.95x four and 0.96-1.0x five or more.
constexpr std::size_t kSafeDistance = 5;

// True if a 32-byte store `delta` bytes past a 32-byte load mod 4 KiB, taken `at` bytes
// further on, shares bytes with it in the low 12 address bits.
constexpr bool aliases(std::uint32_t delta, std::uint32_t at) {
  const std::uint32_t d = (delta - at) & 4095u;
  return d < kVectorBytes || d > 4096u - kVectorBytes;
}

// The nearest distance d, in vectors of loop order (1 to kSafeDistance), at which a load of
// one array follows a store to another that lies `delta` bytes past it mod 4 KiB. Sequential
// order: the vector d places on is 32 bytes per place further. Windowed order: the vector d
// streams on in the same round is 512 bytes per stream further, and one that wraps into the
// next round is 32 bytes beyond that (8 streams x 512 bytes = 4 KiB).
constexpr std::size_t alias_distance(bool windowed, std::uint32_t delta) {
  for (std::size_t d = 1; d < kSafeDistance; ++d) {
    const auto u = static_cast<std::uint32_t>(d);
    if (!windowed && aliases(delta, u * kVectorBytes)) return d;
    if (windowed &&
        (aliases(delta, u * kStrideBytes) || aliases(delta, u * kStrideBytes + kVectorBytes))) {
      return d;
    }
  }
  return kSafeDistance;
}

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

template <ElemType G>
inline __m256 load_grad(const void* g) {
  if constexpr (G == ElemType::kF32) {
    return _mm256_loadu_ps(static_cast<const float*>(g));
  } else {
    const __m128i h = _mm_loadu_si128(static_cast<const __m128i*>(g));
    if constexpr (G == ElemType::kBF16) {
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    } else {
      return _mm256_cvtph_ps(h);
    }
  }
}

template <DecayKind D, ElemType G, ElemType O, bool kOut>
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
    if constexpr (O == ElemType::kBF16) {
      h = bf16_round_256(p);
    } else {
      h = _mm256_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(l.out), h);
  }
}

// The loop dispatch() instantiates (cpu_adam_kernel.h), one per combination of choices.
struct Avx2Kernel {
  template <DecayKind D, ElemType G, ElemType O, bool kOut>
  static void run(const KernelArgs& a, std::size_t begin, std::size_t end);
  template <DecayKind D, ElemType G, ElemType O, bool kOut, bool kPrefetch>
  static void loop(const KernelArgs& a, std::size_t begin, std::size_t end);
};

template <DecayKind D, ElemType G, ElemType O, bool kOut>
void Avx2Kernel::run(const KernelArgs& a, std::size_t begin, std::size_t end) {
  if (a.prefetch_elems == 0) return loop<D, G, O, kOut, false>(a, begin, end);
  loop<D, G, O, kOut, true>(a, begin, end);
}

// True if this call should walk its range in the windowed order: some array it reads lies a
// few vectors before an array it writes mod 4 KiB, and the windowed order takes that pair
// further apart. Narrow gradients (2 bytes an element) drift against the 4-byte arrays along
// the loop, so no order keeps them clear and they are left out.
template <ElemType G>
bool use_windowed_order(const KernelArgs& a) {
  const auto addr = [](const void* q) {
    return static_cast<std::uint32_t>(reinterpret_cast<std::uintptr_t>(q));
  };
  const std::uint32_t stores[] = {addr(a.params), addr(a.m), addr(a.v)};
  const std::uint32_t loads[] = {addr(a.params), addr(a.m), addr(a.v), addr(a.grads)};
  std::size_t sequential = kSafeDistance;
  std::size_t windowed = kSafeDistance;
  for (std::size_t x = 0; x < (G == ElemType::kF32 ? 4 : 3); ++x) {
    for (std::size_t y = 0; y < 3; ++y) {
      if (x == y) continue;
      const std::uint32_t delta = (stores[y] - loads[x]) & 4095u;
      sequential = std::min(sequential, alias_distance(false, delta));
      windowed = std::min(windowed, alias_distance(true, delta));
    }
  }
  return windowed > sequential;
}

template <DecayKind D, ElemType G, ElemType O, bool kOut, bool kPrefetch>
void Avx2Kernel::loop(const KernelArgs& a, std::size_t begin, std::size_t end) {
  const Consts c(a);
  const auto* grads = static_cast<const unsigned char*>(a.grads);
  auto* out = static_cast<std::uint16_t*>(a.out);
  auto lanes_at = [&](std::size_t i) {
    return Lanes{a.params + i, a.m + i, a.v + i, grads + i * grad_bytes<G>(),
                 kOut ? out + i : nullptr};
  };
  std::size_t i = begin;
  // In sequential order the loads of vector j+1 follow the stores of vector j, so an array
  // read 32 to ~150 bytes before one written, mod 4 KiB, makes almost every load wait on a
  // store of the last few vectors (kSafeDistance). AVX-512's cure, loading a block ahead, needs
  // more vectors held than AVX2's 16 registers have for the same reach in bytes. The windowed
  // order instead puts 8 vectors of other streams between a vector and the next one of its
  // stream; a load that now aliases a recent store is one a multiple of 512 bytes away, which
  // the choice avoids. Both orders update every element once with the same operations.
  if (use_windowed_order<G>(a)) {
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
