// SPDX-License-Identifier: Apache-2.0
// The AVX2 codec of compact Adam moments: compact_codec_x86.h over 8-lane vectors. Built with
// -mavx2 -mfma -mf16c only on x86 (adam/CMakeLists.txt).
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "bf16_x86.h"
#include "compact_codec_x86.h"

namespace zinf::adam::detail {
namespace {

// Eight int32 lanes (each in [-127, 255]) to eight bytes, saturating as int8 or uint8.
template <bool kSigned>
inline void store_bytes(void* dst, __m256i q) {
  const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
  const __m128i b = kSigned ? _mm_packs_epi16(w, w) : _mm_packus_epi16(w, w);
  _mm_storel_epi64(static_cast<__m128i*>(dst), b);
}

struct Avx2 {
  using F = __m256;
  using I = __m256i;
  static constexpr std::size_t kLanes = 8;
  static F load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, F x) { _mm256_storeu_ps(p, x); }
  static F set1(float x) { return _mm256_set1_ps(x); }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F sub(F a, F b) { return _mm256_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F min(F a, F b) { return _mm256_min_ps(a, b); }
  static F max(F a, F b) { return _mm256_max_ps(a, b); }
  static F sqrt(F a) { return _mm256_sqrt_ps(a); }
  static F magnitude(F x) {
    return _mm256_and_ps(x, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)));
  }
  static float reduce_max(F x) {
    __m128 r = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    r = _mm_max_ps(r, _mm_movehl_ps(r, r));
    r = _mm_max_ss(r, _mm_shuffle_ps(r, r, 1));
    return _mm_cvtss_f32(r);
  }
  static I trunc(F x) { return _mm256_cvttps_epi32(x); }
  static F to_float(I x) { return _mm256_cvtepi32_ps(x); }
  static I mullo(I a, I b) { return _mm256_mullo_epi32(a, b); }
  static I abs_i(I a) { return _mm256_abs_epi32(a); }
  static I negate_where_negative(I q, F x) {
    const I neg = _mm256_castps_si256(_mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ));
    return _mm256_blendv_epi8(q, _mm256_sub_epi32(_mm256_setzero_si256(), q), neg);
  }
  static I load_i8(const std::int8_t* p) {
    return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  }
  static I load_u8(const std::uint8_t* p) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  }
  static void store_i8(std::int8_t* p, I q) { store_bytes<true>(p, q); }
  static void store_u8(std::uint8_t* p, I q) { store_bytes<false>(p, q); }
  static F widen_bf16(const std::uint16_t* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  static void store_bf16(std::uint16_t* p, F x) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), bf16_round_256(x));
  }
};

}  // namespace

void decode_avx2(const CompactMoments& c, std::size_t begin, std::size_t end, float* m, float* v) {
  decode_range<Avx2>(c, begin, end, m, v);
}

void encode_avx2(const CompactMoments& c, std::size_t begin, std::size_t end, const float* m,
                 const float* v) {
  encode_range<Avx2>(c, begin, end, m, v);
}

}  // namespace zinf::adam::detail
