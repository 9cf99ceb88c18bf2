// SPDX-License-Identifier: Apache-2.0
// fp32 -> bf16 rounding with integer ops for the x86 paths: the kernels' bf16 copy-out
// (cpu_adam_avx2.cc, cpu_adam_avx512_impl.h) and the compact-state codecs' bf16 moments
// (compact_codec_avx2.cc, compact_codec_avx512.cc). Round to nearest even; a NaN is made quiet
// keeping its sign and top payload bits (as the scalar path and VCVTNEPS2BF16). Internal
// linkage: each TU keeps its own copy built with its own -m flags.
#pragma once

#include <immintrin.h>

namespace zinf::adam::detail {
namespace {

inline __m128i bf16_round_256(__m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i hi = _mm256_srli_epi32(u, 16);
  const __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  const __m256i quiet = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
  const __m256i r = _mm256_blendv_epi8(rounded, quiet, nan);
  // Every lane is <= 0xffff, so the unsigned-saturating pack is exact.
  return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

#if defined(__AVX512F__) && defined(__AVX512BW__)
inline __m256i bf16_round_512(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i hi = _mm512_srli_epi32(u, 16);
  const __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
  const __m512i rounded =
      _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  const __m512i quiet = _mm512_or_si512(hi, _mm512_set1_epi32(0x40));
  return _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(rounded, nan, quiet));
}
#endif

}  // namespace
}  // namespace zinf::adam::detail
