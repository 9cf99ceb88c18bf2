// SPDX-License-Identifier: Apache-2.0
// The AVX-512 (F, BW, VL, DQ) codec of compact Adam moments, used by the avx512 and
// avx512bf16 paths: compact_codec_x86.h over 16-lane vectors. Built with the AVX-512 flags
// only on x86 (adam/CMakeLists.txt).
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "bf16_x86.h"
#include "compact_codec_x86.h"

namespace zinf::adam::detail {
namespace {

struct Avx512 {
  using F = __m512;
  using I = __m512i;
  static constexpr std::size_t kLanes = 16;
  static F load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, F x) { _mm512_storeu_ps(p, x); }
  static F set1(float x) { return _mm512_set1_ps(x); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F min(F a, F b) { return _mm512_min_ps(a, b); }
  static F max(F a, F b) { return _mm512_max_ps(a, b); }
  static F sqrt(F a) { return _mm512_sqrt_ps(a); }
  static F magnitude(F x) {
    return _mm512_castsi512_ps(
        _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(0x7fffffff)));
  }
  static float reduce_max(F x) { return _mm512_reduce_max_ps(x); }
  static I trunc(F x) { return _mm512_cvttps_epi32(x); }
  static F to_float(I x) { return _mm512_cvtepi32_ps(x); }
  static I mullo(I a, I b) { return _mm512_mullo_epi32(a, b); }
  static I abs_i(I a) { return _mm512_abs_epi32(a); }
  static I negate_where_negative(I q, F x) {
    const __mmask16 neg = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ);
    return _mm512_mask_sub_epi32(q, neg, _mm512_setzero_si512(), q);
  }
  static I load_i8(const std::int8_t* p) {
    return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static I load_u8(const std::uint8_t* p) {
    return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  // Every lane is in [-127, 255]: the truncating narrowing keeps its low byte.
  static void store_i8(std::int8_t* p, I q) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtepi32_epi8(q));
  }
  static void store_u8(std::uint8_t* p, I q) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtepi32_epi8(q));
  }
  static F widen_bf16(const std::uint16_t* p) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static void store_bf16(std::uint16_t* p, F x) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), bf16_round_512(x));
  }
};

}  // namespace

void decode_avx512(const CompactMoments& c, std::size_t begin, std::size_t end, float* m,
                   float* v) {
  decode_range<Avx512>(c, begin, end, m, v);
}

void encode_avx512(const CompactMoments& c, std::size_t begin, std::size_t end, const float* m,
                   const float* v) {
  encode_range<Avx512>(c, begin, end, m, v);
}

}  // namespace zinf::adam::detail
