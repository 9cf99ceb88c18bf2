// SPDX-License-Identifier: Apache-2.0
// CRC32C by carry-less multiplication folding with AVX-512 VPCLMULQDQ: 256 bytes per loop
// iteration in four 512-bit accumulators, against the crc32 instruction's 8 bytes per cycle at
// best. The only file built with -mavx512f -mvpclmulqdq (swap/CMakeLists.txt); called only
// after crc32c.cc has checked the CPU and the OS (AVX-512 state), so no such code runs
// elsewhere.
//
// Why: with checksums on by default every byte zinf moves through a swap file is summed once
// (written) and checked once (read); with the crc32 instruction that was ~39% of a `zinf bench
// step` run's CPU samples against ~12% for the Adam kernel itself, and ~27% against ~24% with
// this file (perf, docs/benchmarks.md). 1 MiB units, hot: 44-64 GB/s here against 8.5.
//
// The method. In the reflected bit order of CRC32C a 128-bit little-endian load of 16 message
// bytes holds the coefficient of x^(127-i) in bit i. Folding a 128-bit block A forward over
// D bits (onto the block D bits later) replaces A * x^D by an equal polynomial modulo P of
// degree < 96: with A = Ah * x^64 + Al (Ah in the low qword, Al in the high one),
//   A * x^D = Ah * x^(D+64) + Al * x^D == Ah * (x^(D+64) mod P) + Al * (x^D mod P)  (mod P),
// and a carry-less multiply of two reflected 64-bit values returns their product times x, so
// the constants are x^(D+63) mod P and x^(D-1) mod P, bit-reversed into the qwords' top 32
// bits. What remains at the end is one 128-bit block congruent to the whole message, whose
// CRC the crc32 instruction finishes from a zero register (the CRC of a message is its
// polynomial times x^32 mod P, so congruent messages of the same tail position share it).
#include "crc32c_internal.h"

#if defined(__AVX512F__) && defined(__VPCLMULQDQ__) && defined(__SSE4_2__)
#include <immintrin.h>
#endif

#include "zinf/common/check.h"

namespace zinf::swap::detail {

#if defined(__AVX512F__) && defined(__VPCLMULQDQ__) && defined(__SSE4_2__)

bool crc32c_avx512_compiled() noexcept { return true; }

namespace {

// x^e mod P in the normal order (bit i is the coefficient of x^i), P = 0x1EDC6F41 + x^32.
constexpr std::uint32_t xpow_mod(std::uint32_t e) {
  std::uint32_t r = 1;
  for (std::uint32_t i = 0; i < e; ++i) {
    const bool top = (r & 0x80000000u) != 0;
    r <<= 1;
    if (top) r ^= 0x1EDC6F41u;
  }
  return r;
}

constexpr std::uint64_t reflect_to_qword(std::uint32_t v) {
  std::uint64_t out = 0;
  for (int i = 0; i < 32; ++i) {
    if ((v >> i) & 1u) out |= std::uint64_t{1} << (63 - i);
  }
  return out;
}

// The two qwords that fold a 128-bit block forward over `bits` bits (see the file comment).
struct Fold {
  std::uint64_t lo;  // multiplies the low qword (the block's higher-degree half)
  std::uint64_t hi;  // multiplies the high qword
};
constexpr Fold fold_constants(std::uint32_t bits) {
  return {reflect_to_qword(xpow_mod(bits + 63)), reflect_to_qword(xpow_mod(bits - 1))};
}

constexpr Fold kFold128 = fold_constants(128);
constexpr Fold kFold256 = fold_constants(256);
constexpr Fold kFold384 = fold_constants(384);
constexpr Fold kFold512 = fold_constants(512);
constexpr Fold kFold2048 = fold_constants(2048);

__m128i constants128(const Fold& f) {
  return _mm_set_epi64x(static_cast<long long>(f.hi), static_cast<long long>(f.lo));
}
// Set element by element: GCC 12's broadcast and extract intrinsics trip -Wmaybe-uninitialized
// inside its own headers.
__m512i constants512(const Fold& f) {
  const auto lo = static_cast<long long>(f.lo);
  const auto hi = static_cast<long long>(f.hi);
  return _mm512_set_epi64(hi, lo, hi, lo, hi, lo, hi, lo);
}

__m512i fold512(__m512i acc, __m512i k) {
  return _mm512_xor_si512(_mm512_clmulepi64_epi128(acc, k, 0x00),
                          _mm512_clmulepi64_epi128(acc, k, 0x11));
}
__m128i fold128(__m128i acc, __m128i k) {
  return _mm_xor_si128(_mm_clmulepi64_si128(acc, k, 0x00), _mm_clmulepi64_si128(acc, k, 0x11));
}

__m512i load512(const std::byte* p) { return _mm512_loadu_si512(p); }

}  // namespace

std::uint32_t crc32c_avx512_update(std::uint32_t state, const std::byte* p,
                                   std::size_t n) noexcept {
  if (n < kCrc32cAvx512MinBytes) return crc32c_sse42_update(state, p, n);
  // The register enters as the first 4 message bytes xored with it.
  __m512i x0 = _mm512_xor_si512(load512(p), _mm512_set_epi64(0, 0, 0, 0, 0, 0, 0, state));
  __m512i x1 = load512(p + 64);
  __m512i x2 = load512(p + 128);
  __m512i x3 = load512(p + 192);
  p += 256;
  n -= 256;
  const __m512i k2048 = constants512(kFold2048);
  while (n >= 256) {
    x0 = _mm512_xor_si512(fold512(x0, k2048), load512(p));
    x1 = _mm512_xor_si512(fold512(x1, k2048), load512(p + 64));
    x2 = _mm512_xor_si512(fold512(x2, k2048), load512(p + 128));
    x3 = _mm512_xor_si512(fold512(x3, k2048), load512(p + 192));
    p += 256;
    n -= 256;
  }
  const __m512i k512 = constants512(kFold512);
  x1 = _mm512_xor_si512(fold512(x0, k512), x1);
  x2 = _mm512_xor_si512(fold512(x1, k512), x2);
  x3 = _mm512_xor_si512(fold512(x2, k512), x3);
  while (n >= 64) {
    x3 = _mm512_xor_si512(fold512(x3, k512), load512(p));
    p += 64;
    n -= 64;
  }
  // Four 128-bit lanes, 384, 256 and 128 bits before the last one.
  alignas(64) __m128i lanes[4];
  _mm512_store_si512(lanes, x3);
  __m128i v = lanes[3];
  v = _mm_xor_si128(v, fold128(lanes[0], constants128(kFold384)));
  v = _mm_xor_si128(v, fold128(lanes[1], constants128(kFold256)));
  const __m128i k128 = constants128(kFold128);
  v = _mm_xor_si128(v, fold128(lanes[2], k128));
  while (n >= 16) {
    v = _mm_xor_si128(fold128(v, k128), _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    p += 16;
    n -= 16;
  }
  std::uint64_t crc = _mm_crc32_u64(0, static_cast<std::uint64_t>(_mm_cvtsi128_si64(v)));
  crc = _mm_crc32_u64(crc, static_cast<std::uint64_t>(_mm_extract_epi64(v, 1)));
  return crc32c_sse42_update(static_cast<std::uint32_t>(crc), p, n);
}

#else

bool crc32c_avx512_compiled() noexcept { return false; }

std::uint32_t crc32c_avx512_update(std::uint32_t, const std::byte*, std::size_t) noexcept {
  ZINF_CHECK(false, "crc32c: AVX-512 path called in a build without it");
  return 0;
}

#endif

}  // namespace zinf::swap::detail
