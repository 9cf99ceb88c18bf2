// SPDX-License-Identifier: Apache-2.0
// Compact Adam moments: how m and v are kept between steps when they are not fp32 (bf16, or
// 8-bit codes with a scale per block of 64 elements), their exact encodings, and the
// conversions to and from fp32. The fp32 master parameters are never compacted. CpuAdam
// reads and writes these forms in its own pass (cpu_adam.h); the offloaded optimizer stores
// them in its records (docs/engine.md, "Compact optimizer state").
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace zinf::adam {

/// How Adam's moments m and v are stored between steps.
enum class StatePrecision : std::uint8_t {
  kF32,   ///< fp32 m and v: 8 bytes per element (12 with the master parameter)
  kBF16,  ///< bf16 m and v, rounded to nearest even: 4 bytes (8 with the master)
  kInt8,  ///< 8-bit codes with an fp32 scale per kInt8Block elements: 2 + 8/64 bytes
};

/// Elements that share one pair of int8 scales (one for m, one for v).
inline constexpr std::size_t kInt8Block = 64;

/// Returns "fp32", "bf16" or "int8".
std::string_view state_precision_name(StatePrecision p) noexcept;
/// Parses a name as state_precision_name() spells it. Throws UsageError "invalid <what>
/// '<text>': expected fp32, bf16 or int8" for anything else.
StatePrecision parse_state_precision(std::string_view text, std::string_view what);
/// Bytes that m and v of `n` elements take together in precision `p`, scales included:
/// 8n, 4n, or 2n + 8 x ceil(n / kInt8Block).
std::uint64_t moment_bytes(StatePrecision p, std::uint64_t n) noexcept;

/// A view of caller-owned compact moments of `size` elements.
///   kF32:  m, v are float[size].
///   kBF16: m, v are std::uint16_t[size] (bf16 bits).
///   kInt8: m is std::int8_t[size], v is std::uint8_t[size], m_scale and v_scale are
///          float[ceil(size / kInt8Block)]; block b covers elements [64b, 64b + 64).
/// int8 encoding of a block (a = the largest |m| of the block, b = the largest v; a block
/// whose a (or b) is below 2^-96 is all zeros with scale 0):
///   m_scale = a / 16129          q_m = sign(m) x min(127, rne(sqrt(|m| x (16129 / a))))
///   v_scale = b / 255^4          q_v = min(255, rne(sqrt(sqrt(v x (255^4 / b)))))
///   m = float(q_m x |q_m|) x m_scale     v = (float(q_v^2) x float(q_v^2)) x v_scale
/// i.e. sqrt(|m|) and v^(1/4) are quantised linearly: the code keeps four (m) and eight (v)
/// binary orders of magnitude below the block's largest value instead of one, so that a
/// small v is never stored as 0 next to a large one (it would divide the update by eps).
/// Every operation is one fp32 operation rounded to nearest even (rne: round half to even);
/// 255^4 is the fp32 nearest to 4228250625. NaN or infinite moments give unspecified codes.
struct CompactMoments {
  StatePrecision precision = StatePrecision::kF32;
  std::size_t size = 0;
  void* m = nullptr;
  void* v = nullptr;
  float* m_scale = nullptr;  ///< kInt8 only
  float* v_scale = nullptr;  ///< kInt8 only
};

/// Lays out the moments of `n` elements in precision `p` in one buffer of moment_bytes(p, n)
/// bytes at `base`: [m | v], or for kInt8 [m scales | v scales | m codes | v codes] (the fp32
/// scales first, so that they are 4-byte aligned if `base` is). The one layout the offloaded
/// optimizer's records and the benchmarks use.
CompactMoments compact_moments_at(StatePrecision p, std::size_t n, std::byte* base) noexcept;

/// Encodes fp32 moments (each `out.size` elements) into `out` exactly as CpuAdam::step
/// stores them after an update. Any precision; kF32 copies. UsageError for a size mismatch
/// or a null pointer with a non-zero size. Runs on the calling thread.
void encode_moments(std::span<const float> m, std::span<const float> v, const CompactMoments& out);
/// Decodes `in` to fp32 (each span `in.size` elements, or empty to skip it) exactly as
/// CpuAdam::step reads them before an update. Same errors as encode_moments.
void decode_moments(const CompactMoments& in, std::span<float> m, std::span<float> v);

}  // namespace zinf::adam
