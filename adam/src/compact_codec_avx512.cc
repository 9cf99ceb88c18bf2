// SPDX-License-Identifier: Apache-2.0
// The AVX-512 (F, BW, VL, DQ) codec of compact Adam moments, used by the avx512 and
// avx512bf16 paths. Built with the AVX-512 flags only on x86 (adam/CMakeLists.txt). Each
// lane performs the scalar codec's operations in the same order (compact_codec_scalar.cc),
// so the results agree bitwise; a short last block goes to the scalar codec.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "bf16_x86.h"
#include "compact_codec.h"

namespace zinf::adam::detail {
namespace {

constexpr std::size_t kLanes = 16;
constexpr std::size_t kBlockVectors = kInt8Block / kLanes;

inline __m512 round_even(__m512 x) {
  const __m512 big = _mm512_set1_ps(0x1p23f);
  return _mm512_sub_ps(_mm512_add_ps(x, big), big);
}

inline __m512 magnitude(__m512 x) {
  return _mm512_castsi512_ps(
      _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(0x7fffffff)));
}

void encode_int8_block(const CompactMoments& c, std::size_t b, const float* m, const float* v) {
  __m512 am = _mm512_setzero_ps();
  __m512 av = _mm512_setzero_ps();
  for (std::size_t k = 0; k < kBlockVectors; ++k) {
    am = _mm512_max_ps(am, magnitude(_mm512_loadu_ps(m + k * kLanes)));
    av = _mm512_max_ps(av, _mm512_loadu_ps(v + k * kLanes));
  }
  const BlockScale sm = block_scale(_mm512_reduce_max_ps(am), kMLevels);
  const BlockScale sv = block_scale(_mm512_reduce_max_ps(av), kVLevels);
  c.m_scale[b / kInt8Block] = sm.scale;
  c.v_scale[b / kInt8Block] = sv.scale;
  const __m512 inv_m = _mm512_set1_ps(sm.inv);
  const __m512 inv_v = _mm512_set1_ps(sv.inv);
  auto* qm = static_cast<std::int8_t*>(c.m) + b;
  auto* qv = static_cast<std::uint8_t*>(c.v) + b;
  for (std::size_t k = 0; k < kBlockVectors; ++k) {
    const __m512 x = _mm512_loadu_ps(m + k * kLanes);
    const __m512 a = _mm512_min_ps(round_even(_mm512_sqrt_ps(_mm512_mul_ps(magnitude(x), inv_m))),
                                   _mm512_set1_ps(127.0f));
    __m512i q = _mm512_cvttps_epi32(a);
    const __mmask16 neg = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ);
    q = _mm512_mask_sub_epi32(q, neg, _mm512_setzero_si512(), q);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(qm + k * kLanes), _mm512_cvtepi32_epi8(q));
    const __m512 y = _mm512_loadu_ps(v + k * kLanes);
    const __m512 r = _mm512_min_ps(
        round_even(_mm512_sqrt_ps(_mm512_sqrt_ps(_mm512_mul_ps(y, inv_v)))),
        _mm512_set1_ps(255.0f));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(qv + k * kLanes),
                     _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(r)));
  }
}

void decode_int8_block(const CompactMoments& c, std::size_t b, float* m, float* v) {
  const __m512 sm = _mm512_set1_ps(c.m_scale[b / kInt8Block]);
  const __m512 sv = _mm512_set1_ps(c.v_scale[b / kInt8Block]);
  const auto* qm = static_cast<const std::int8_t*>(c.m) + b;
  const auto* qv = static_cast<const std::uint8_t*>(c.v) + b;
  for (std::size_t k = 0; k < kBlockVectors; ++k) {
    const __m512i a = _mm512_cvtepi8_epi32(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(qm + k * kLanes)));
    const __m512 x = _mm512_cvtepi32_ps(_mm512_mullo_epi32(a, _mm512_abs_epi32(a)));
    _mm512_storeu_ps(m + k * kLanes, _mm512_mul_ps(x, sm));
    const __m512i q = _mm512_cvtepu8_epi32(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(qv + k * kLanes)));
    const __m512 w = _mm512_cvtepi32_ps(_mm512_mullo_epi32(q, q));
    _mm512_storeu_ps(v + k * kLanes, _mm512_mul_ps(_mm512_mul_ps(w, w), sv));
  }
}

}  // namespace

void decode_avx512(const CompactMoments& c, std::size_t begin, std::size_t end, float* m,
                   float* v) {
  std::size_t i = begin;
  if (c.precision == StatePrecision::kBF16) {
    const auto* hm = static_cast<const std::uint16_t*>(c.m);
    const auto* hv = static_cast<const std::uint16_t*>(c.v);
    for (; i + kLanes <= end; i += kLanes) {
      const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(hm + i));
      const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(hv + i));
      _mm512_storeu_si512(m + (i - begin), _mm512_slli_epi32(_mm512_cvtepu16_epi32(a), 16));
      _mm512_storeu_si512(v + (i - begin), _mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
    }
  } else if (c.precision == StatePrecision::kInt8) {
    for (; i + kInt8Block <= end; i += kInt8Block) {
      decode_int8_block(c, i, m + (i - begin), v + (i - begin));
    }
  }
  if (i < end) decode_scalar(c, i, end, m + (i - begin), v + (i - begin));
}

void encode_avx512(const CompactMoments& c, std::size_t begin, std::size_t end, const float* m,
                   const float* v) {
  std::size_t i = begin;
  if (c.precision == StatePrecision::kBF16) {
    auto* hm = static_cast<std::uint16_t*>(c.m);
    auto* hv = static_cast<std::uint16_t*>(c.v);
    for (; i + kLanes <= end; i += kLanes) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(hm + i),
                          bf16_round_512(_mm512_loadu_ps(m + (i - begin))));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(hv + i),
                          bf16_round_512(_mm512_loadu_ps(v + (i - begin))));
    }
  } else if (c.precision == StatePrecision::kInt8) {
    for (; i + kInt8Block <= end; i += kInt8Block) {
      encode_int8_block(c, i, m + (i - begin), v + (i - begin));
    }
  }
  if (i < end) encode_scalar(c, i, end, m + (i - begin), v + (i - begin));
}

}  // namespace zinf::adam::detail
