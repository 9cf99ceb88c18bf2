// SPDX-License-Identifier: Apache-2.0
// The x86 codecs of compact Adam moments, written once over a vector-width traits type `V`
// that each codec TU (compact_codec_avx2.cc, compact_codec_avx512.cc) defines in its unnamed
// namespace with its own -m flags: every instantiation then has internal linkage, as
// cpu_adam_kernel.h's dispatch does. Each lane performs the scalar codec's operations in the
// same order (compact_codec_scalar.cc), so the paths agree bitwise; a short last block, and
// the bf16 tail, go to the scalar codec.
//
// V provides: F (float vector), I (int32 vector), kLanes, and static load, store, set1, add,
// sub, mul, min, max, sqrt, magnitude, reduce_max, trunc (F -> I), to_float (I -> F), mullo,
// abs_i, negate_where_negative(I q, F x), load_i8, load_u8, store_i8, store_u8, widen_bf16,
// store_bf16.
#pragma once

#include <cstddef>
#include <cstdint>

#include "compact_codec.h"

namespace zinf::adam::detail {
namespace {

template <class V>
inline typename V::F round_even(typename V::F x) {
  const typename V::F big = V::set1(0x1p23f);
  return V::sub(V::add(x, big), big);
}

template <class V>
void encode_int8_block(const CompactMoments& c, std::size_t b, const float* m, const float* v) {
  constexpr std::size_t kVectors = kInt8Block / V::kLanes;
  typename V::F am = V::set1(0.0f);
  typename V::F av = V::set1(0.0f);
  for (std::size_t k = 0; k < kVectors; ++k) {
    am = V::max(am, V::magnitude(V::load(m + k * V::kLanes)));
    av = V::max(av, V::load(v + k * V::kLanes));
  }
  const BlockScale sm = block_scale(V::reduce_max(am), kMLevels);
  const BlockScale sv = block_scale(V::reduce_max(av), kVLevels);
  c.m_scale[b / kInt8Block] = sm.scale;
  c.v_scale[b / kInt8Block] = sv.scale;
  const typename V::F inv_m = V::set1(sm.inv);
  const typename V::F inv_v = V::set1(sv.inv);
  auto* qm = static_cast<std::int8_t*>(c.m) + b;
  auto* qv = static_cast<std::uint8_t*>(c.v) + b;
  for (std::size_t k = 0; k < kVectors; ++k) {
    const typename V::F x = V::load(m + k * V::kLanes);
    const typename V::F a =
        V::min(round_even<V>(V::sqrt(V::mul(V::magnitude(x), inv_m))), V::set1(127.0f));
    V::store_i8(qm + k * V::kLanes, V::negate_where_negative(V::trunc(a), x));
    const typename V::F y = V::load(v + k * V::kLanes);
    const typename V::F r =
        V::min(round_even<V>(V::sqrt(V::sqrt(V::mul(y, inv_v)))), V::set1(255.0f));
    V::store_u8(qv + k * V::kLanes, V::trunc(r));
  }
}

template <class V>
void decode_int8_block(const CompactMoments& c, std::size_t b, float* m, float* v) {
  const typename V::F sm = V::set1(c.m_scale[b / kInt8Block]);
  const typename V::F sv = V::set1(c.v_scale[b / kInt8Block]);
  const auto* qm = static_cast<const std::int8_t*>(c.m) + b;
  const auto* qv = static_cast<const std::uint8_t*>(c.v) + b;
  for (std::size_t k = 0; k < kInt8Block / V::kLanes; ++k) {
    const typename V::I a = V::load_i8(qm + k * V::kLanes);
    V::store(m + k * V::kLanes, V::mul(V::to_float(V::mullo(a, V::abs_i(a))), sm));
    const typename V::I q = V::load_u8(qv + k * V::kLanes);
    const typename V::F w = V::to_float(V::mullo(q, q));
    V::store(v + k * V::kLanes, V::mul(V::mul(w, w), sv));
  }
}

template <class V>
void decode_range(const CompactMoments& c, std::size_t begin, std::size_t end, float* m,
                  float* v) {
  std::size_t i = begin;
  if (c.precision == StatePrecision::kBF16) {
    for (; i + V::kLanes <= end; i += V::kLanes) {
      V::store(m + (i - begin), V::widen_bf16(static_cast<const std::uint16_t*>(c.m) + i));
      V::store(v + (i - begin), V::widen_bf16(static_cast<const std::uint16_t*>(c.v) + i));
    }
  } else if (c.precision == StatePrecision::kInt8) {
    for (; i + kInt8Block <= end; i += kInt8Block) {
      decode_int8_block<V>(c, i, m + (i - begin), v + (i - begin));
    }
  }
  if (i < end) decode_scalar(c, i, end, m + (i - begin), v + (i - begin));
}

template <class V>
void encode_range(const CompactMoments& c, std::size_t begin, std::size_t end, const float* m,
                  const float* v) {
  std::size_t i = begin;
  if (c.precision == StatePrecision::kBF16) {
    for (; i + V::kLanes <= end; i += V::kLanes) {
      V::store_bf16(static_cast<std::uint16_t*>(c.m) + i, V::load(m + (i - begin)));
      V::store_bf16(static_cast<std::uint16_t*>(c.v) + i, V::load(v + (i - begin)));
    }
  } else if (c.precision == StatePrecision::kInt8) {
    for (; i + kInt8Block <= end; i += kInt8Block) {
      encode_int8_block<V>(c, i, m + (i - begin), v + (i - begin));
    }
  }
  if (i < end) encode_scalar(c, i, end, m + (i - begin), v + (i - begin));
}

}  // namespace
}  // namespace zinf::adam::detail
