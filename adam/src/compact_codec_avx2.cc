// SPDX-License-Identifier: Apache-2.0
// The AVX2 codec of compact Adam moments. Built with -mavx2 -mfma -mf16c only on x86
// (adam/CMakeLists.txt). Each lane performs the scalar codec's operations in the same order
// (compact_codec_scalar.cc), so the results agree bitwise; a short last block goes to the
// scalar codec.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "bf16_x86.h"
#include "compact_codec.h"

namespace zinf::adam::detail {
namespace {

constexpr std::size_t kLanes = 8;
constexpr std::size_t kBlockVectors = kInt8Block / kLanes;

inline __m256 round_even(__m256 x) {
  const __m256 big = _mm256_set1_ps(0x1p23f);
  return _mm256_sub_ps(_mm256_add_ps(x, big), big);
}

inline __m256 magnitude(__m256 x) {
  return _mm256_and_ps(x, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)));
}

inline float reduce_max(__m256 x) {
  __m128 r = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  r = _mm_max_ps(r, _mm_movehl_ps(r, r));
  r = _mm_max_ss(r, _mm_shuffle_ps(r, r, 1));
  return _mm_cvtss_f32(r);
}

// Eight int32 lanes (each in [-127, 255]) to eight bytes, saturating as int8 or uint8.
template <bool kSigned>
inline void store_bytes(void* dst, __m256i q) {
  const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
  const __m128i b = kSigned ? _mm_packs_epi16(w, w) : _mm_packus_epi16(w, w);
  _mm_storel_epi64(static_cast<__m128i*>(dst), b);
}

void encode_int8_block(const CompactMoments& c, std::size_t b, const float* m, const float* v) {
  __m256 am = _mm256_setzero_ps();
  __m256 av = _mm256_setzero_ps();
  for (std::size_t k = 0; k < kBlockVectors; ++k) {
    am = _mm256_max_ps(am, magnitude(_mm256_loadu_ps(m + k * kLanes)));
    av = _mm256_max_ps(av, _mm256_loadu_ps(v + k * kLanes));
  }
  const BlockScale sm = block_scale(reduce_max(am), kMLevels);
  const BlockScale sv = block_scale(reduce_max(av), kVLevels);
  c.m_scale[b / kInt8Block] = sm.scale;
  c.v_scale[b / kInt8Block] = sv.scale;
  const __m256 inv_m = _mm256_set1_ps(sm.inv);
  const __m256 inv_v = _mm256_set1_ps(sv.inv);
  auto* qm = static_cast<std::int8_t*>(c.m) + b;
  auto* qv = static_cast<std::uint8_t*>(c.v) + b;
  for (std::size_t k = 0; k < kBlockVectors; ++k) {
    const __m256 x = _mm256_loadu_ps(m + k * kLanes);
    const __m256 a = _mm256_min_ps(round_even(_mm256_sqrt_ps(_mm256_mul_ps(magnitude(x), inv_m))),
                                   _mm256_set1_ps(127.0f));
    __m256i q = _mm256_cvttps_epi32(a);
    const __m256i neg = _mm256_castps_si256(_mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ));
    q = _mm256_blendv_epi8(q, _mm256_sub_epi32(_mm256_setzero_si256(), q), neg);
    store_bytes<true>(qm + k * kLanes, q);
    const __m256 y = _mm256_loadu_ps(v + k * kLanes);
    const __m256 r = _mm256_min_ps(
        round_even(_mm256_sqrt_ps(_mm256_sqrt_ps(_mm256_mul_ps(y, inv_v)))),
        _mm256_set1_ps(255.0f));
    store_bytes<false>(qv + k * kLanes, _mm256_cvttps_epi32(r));
  }
}

void decode_int8_block(const CompactMoments& c, std::size_t b, float* m, float* v) {
  const __m256 sm = _mm256_set1_ps(c.m_scale[b / kInt8Block]);
  const __m256 sv = _mm256_set1_ps(c.v_scale[b / kInt8Block]);
  const auto* qm = static_cast<const std::int8_t*>(c.m) + b;
  const auto* qv = static_cast<const std::uint8_t*>(c.v) + b;
  for (std::size_t k = 0; k < kBlockVectors; ++k) {
    const __m256i a =
        _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qm + k * kLanes)));
    const __m256 x = _mm256_cvtepi32_ps(_mm256_mullo_epi32(a, _mm256_abs_epi32(a)));
    _mm256_storeu_ps(m + k * kLanes, _mm256_mul_ps(x, sm));
    const __m256i q =
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qv + k * kLanes)));
    const __m256 w = _mm256_cvtepi32_ps(_mm256_mullo_epi32(q, q));
    _mm256_storeu_ps(v + k * kLanes, _mm256_mul_ps(_mm256_mul_ps(w, w), sv));
  }
}

}  // namespace

void decode_avx2(const CompactMoments& c, std::size_t begin, std::size_t end, float* m, float* v) {
  std::size_t i = begin;
  if (c.precision == StatePrecision::kBF16) {
    const auto* hm = static_cast<const std::uint16_t*>(c.m);
    const auto* hv = static_cast<const std::uint16_t*>(c.v);
    for (; i + kLanes <= end; i += kLanes) {
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(hm + i));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(hv + i));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(m + (i - begin)),
                          _mm256_slli_epi32(_mm256_cvtepu16_epi32(a), 16));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(v + (i - begin)),
                          _mm256_slli_epi32(_mm256_cvtepu16_epi32(b), 16));
    }
  } else if (c.precision == StatePrecision::kInt8) {
    for (; i + kInt8Block <= end; i += kInt8Block) {
      decode_int8_block(c, i, m + (i - begin), v + (i - begin));
    }
  }
  if (i < end) decode_scalar(c, i, end, m + (i - begin), v + (i - begin));
}

void encode_avx2(const CompactMoments& c, std::size_t begin, std::size_t end, const float* m,
                 const float* v) {
  std::size_t i = begin;
  if (c.precision == StatePrecision::kBF16) {
    auto* hm = static_cast<std::uint16_t*>(c.m);
    auto* hv = static_cast<std::uint16_t*>(c.v);
    for (; i + kLanes <= end; i += kLanes) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(hm + i),
                       bf16_round_256(_mm256_loadu_ps(m + (i - begin))));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(hv + i),
                       bf16_round_256(_mm256_loadu_ps(v + (i - begin))));
    }
  } else if (c.precision == StatePrecision::kInt8) {
    for (; i + kInt8Block <= end; i += kInt8Block) {
      encode_int8_block(c, i, m + (i - begin), v + (i - begin));
    }
  }
  if (i < end) encode_scalar(c, i, end, m + (i - begin), v + (i - begin));
}

}  // namespace zinf::adam::detail
