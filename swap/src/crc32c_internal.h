// SPDX-License-Identifier: Apache-2.0
// The pieces shared by the portable CRC32C (crc32c.cc) and the SSE4.2 one (crc32c_sse42.cc,
// compiled with -msse4.2 and called only after a run-time CPU check). They work on the raw
// register: no initial or final inversion. Private to zinf::swap.
#pragma once

#include <cstddef>
#include <cstdint>

namespace zinf::swap::detail {

/// Lane length of the interleaved hardware loop: three lanes of this many bytes are summed at
/// once and joined with crc32c_shift_lane. 4 KiB keeps the join cost (8 table lookups) per
/// 12 KiB negligible while inputs of a few pages still take the fast path.
inline constexpr std::size_t kCrc32cLaneBytes = 4096;

/// Feeds `n` bytes into the raw register `state` with the portable tables.
std::uint32_t crc32c_table_update(std::uint32_t state, const std::byte* data,
                                  std::size_t n) noexcept;

/// Returns the raw register after kCrc32cLaneBytes zero bytes are fed into `state` (the CRC is
/// linear over GF(2), so a lane summed from zero joins its predecessor as
/// shift(previous) ^ lane).
std::uint32_t crc32c_shift_lane(std::uint32_t state) noexcept;

/// True if the SSE4.2 code was compiled in (x86-64 builds).
bool crc32c_sse42_compiled() noexcept;
/// Feeds `n` bytes into the raw register with SSE4.2; call only where the CPU has SSE4.2.
std::uint32_t crc32c_sse42_update(std::uint32_t state, const std::byte* data,
                                  std::size_t n) noexcept;

/// True if the ARMv8 CRC32 code was compiled in (aarch64 builds).
bool crc32c_arm_compiled() noexcept;
/// Feeds `n` bytes into the raw register with the ARMv8 CRC32 instructions; call only where
/// the CPU has them (HWCAP_CRC32).
std::uint32_t crc32c_arm_update(std::uint32_t state, const std::byte* data, std::size_t n) noexcept;

/// Shorter inputs go to the SSE4.2 path: the folding's setup and reduction are not worth it.
inline constexpr std::size_t kCrc32cAvx512MinBytes = 256;
/// True if the AVX-512 VPCLMULQDQ code was compiled in (x86-64 builds).
bool crc32c_avx512_compiled() noexcept;
/// Feeds `n` bytes into the raw register by VPCLMULQDQ folding (crc32c_avx512.cc); call only
/// where the CPU has AVX-512F, VPCLMULQDQ and SSE4.2 and the OS saves AVX-512 state.
std::uint32_t crc32c_avx512_update(std::uint32_t state, const std::byte* data,
                                   std::size_t n) noexcept;

}  // namespace zinf::swap::detail
