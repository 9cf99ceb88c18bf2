// SPDX-License-Identifier: Apache-2.0
// The portable codec of compact Adam moments (compact_state.h's encodings), any CPU. Built
// with -ffp-contract=off like the scalar kernel, so that each operation is the single fp32
// operation the vector codecs perform and the paths agree bitwise. The vector codecs call
// it for a short last block.
#include <bit>
#include <cmath>
#include <cstdint>

#include "compact_codec.h"

namespace zinf::adam::detail {
namespace {

// Round half to even of 0 <= x < 2^22: adding 2^23 leaves no fraction bits, so the sum is
// rounded by the FPU's default mode (nearest even), exactly as the vector codecs' explicit
// _MM_FROUND_TO_NEAREST_INT; cheaper than std::nearbyint, a libm call on baseline x86-64.
float round_even(float x) { return (x + 0x1p23f) - 0x1p23f; }

float widen_bf16(std::uint16_t h) { return std::bit_cast<float>(std::uint32_t{h} << 16); }

// fp32 -> bf16 round to nearest even; a NaN stays a (quiet) NaN.
std::uint16_t narrow_bf16(float f) {
  const auto u = std::bit_cast<std::uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
  return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

float largest(const float* x, std::size_t n, bool magnitude) {
  float a = 0.0f;
  for (std::size_t i = 0; i < n; ++i) {
    const float y = magnitude ? std::fabs(x[i]) : x[i];
    if (y > a) a = y;
  }
  return a;
}

// One block of int8 codes from fp32 m and v (n <= kInt8Block elements).
void encode_block(std::int8_t* qm, std::uint8_t* qv, float* m_scale, float* v_scale,
                  const float* m, const float* v, std::size_t n) {
  const float am = largest(m, n, true);
  const float av = largest(v, n, false);
  const BlockScale sm = block_scale(am, kMLevels);
  const BlockScale sv = block_scale(av, kVLevels);
  *m_scale = sm.scale;
  *v_scale = sv.scale;
  const float inv_m = sm.inv;
  const float inv_v = sv.inv;
  for (std::size_t i = 0; i < n; ++i) {
    float a = round_even(std::sqrt(std::fabs(m[i]) * inv_m));
    a = a < 127.0f ? a : 127.0f;
    const int q = static_cast<int>(a);
    qm[i] = static_cast<std::int8_t>(m[i] < 0.0f ? -q : q);
    float b = round_even(std::sqrt(std::sqrt(v[i] * inv_v)));
    b = b < 255.0f ? b : 255.0f;
    qv[i] = static_cast<std::uint8_t>(static_cast<int>(b));
  }
}

}  // namespace

BlockScale block_scale(float largest, float levels) {
  if (!(largest >= kTinyBlock)) return {0.0f, 0.0f};
  return {largest / levels, levels / largest};
}

void decode_scalar(const CompactMoments& c, std::size_t begin, std::size_t end, float* m,
                   float* v) {
  switch (c.precision) {
    case StatePrecision::kF32:
      for (std::size_t i = begin; i < end; ++i) {
        m[i - begin] = static_cast<const float*>(c.m)[i];
        v[i - begin] = static_cast<const float*>(c.v)[i];
      }
      return;
    case StatePrecision::kBF16:
      for (std::size_t i = begin; i < end; ++i) {
        m[i - begin] = widen_bf16(static_cast<const std::uint16_t*>(c.m)[i]);
        v[i - begin] = widen_bf16(static_cast<const std::uint16_t*>(c.v)[i]);
      }
      return;
    case StatePrecision::kInt8:
      for (std::size_t i = begin; i < end; ++i) {
        const std::size_t b = i / kInt8Block;
        const int qm = static_cast<const std::int8_t*>(c.m)[i];
        const int qv = static_cast<const std::uint8_t*>(c.v)[i];
        m[i - begin] = static_cast<float>(qm * (qm < 0 ? -qm : qm)) * c.m_scale[b];
        const auto w = static_cast<float>(qv * qv);
        v[i - begin] = (w * w) * c.v_scale[b];
      }
      return;
  }
}

void encode_scalar(const CompactMoments& c, std::size_t begin, std::size_t end, const float* m,
                   const float* v) {
  switch (c.precision) {
    case StatePrecision::kF32:
      for (std::size_t i = begin; i < end; ++i) {
        static_cast<float*>(c.m)[i] = m[i - begin];
        static_cast<float*>(c.v)[i] = v[i - begin];
      }
      return;
    case StatePrecision::kBF16:
      for (std::size_t i = begin; i < end; ++i) {
        static_cast<std::uint16_t*>(c.m)[i] = narrow_bf16(m[i - begin]);
        static_cast<std::uint16_t*>(c.v)[i] = narrow_bf16(v[i - begin]);
      }
      return;
    case StatePrecision::kInt8:
      for (std::size_t b = begin; b < end; b += kInt8Block) {
        const std::size_t n = end - b < kInt8Block ? end - b : kInt8Block;
        encode_block(static_cast<std::int8_t*>(c.m) + b, static_cast<std::uint8_t*>(c.v) + b,
                     c.m_scale + b / kInt8Block, c.v_scale + b / kInt8Block, m + (b - begin),
                     v + (b - begin), n);
      }
      return;
  }
}

}  // namespace zinf::adam::detail
