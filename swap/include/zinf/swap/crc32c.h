// SPDX-License-Identifier: Apache-2.0
// CRC32C (Castagnoli): the checksum of swap-store stripe units and offload checkpoints. Uses
// AVX-512 VPCLMULQDQ folding where the CPU has it, else the CPU's crc32c instruction (SSE4.2 on
// x86-64, the ARMv8 CRC32 extension on aarch64), else a table (chosen at run time). Part of
// zinf::swap.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

namespace zinf::swap {

/// Returns the CRC32C (polynomial 0x1EDC6F41, reflected, initial value and final xor
/// 0xFFFFFFFF, as in iSCSI and ext4) of `data` following bytes whose CRC32C is `crc` (0 for
/// none), so that crc32c(b, crc32c(a)) == crc32c(a + b). crc32c("123456789") == 0xE3069283.
/// Thread-safe, never blocks; any alignment and length.
std::uint32_t crc32c(std::span<const std::byte> data, std::uint32_t crc = 0) noexcept;

/// Returns crc32c(a + b) from crc_a = crc32c(a), crc_b = crc32c(b) and b's length, without
/// the bytes: how CRCs summed over pieces of a buffer in any order (by several threads) are
/// joined into the CRC of the whole. A few hundred cycles per set bit of `length_b` plus
/// one; thread-safe, never blocks.
std::uint32_t crc32c_combine(std::uint32_t crc_a, std::uint32_t crc_b,
                             std::uint64_t length_b) noexcept;

/// The implementations of crc32c().
enum class Crc32cImpl : std::uint8_t {
  /// The CPU's crc32c instruction, three interleaved streams: SSE4.2 crc32 (x86-64 with
  /// SSE4.2) or ARMv8 CRC32CX (aarch64 with HWCAP_CRC32).
  kHardware,
  kTable,     ///< portable slicing-by-8 tables
  /// Carry-less multiplication folding, 256 bytes per step (x86-64 with AVX-512F, VPCLMULQDQ
  /// and SSE4.2, and an OS that saves AVX-512 state); inputs under 256 bytes go to kHardware.
  /// ~4-7x kHardware's rate on hot data here; every byte read back from or written to a swap
  /// file is summed (checksums on by default), so it is the default where available.
  kAvx512,
};

/// Returns the implementation crc32c() uses on this CPU.
Crc32cImpl crc32c_active_impl() noexcept;
/// Returns "sse4.2" (aarch64 builds: "armv8-crc32"), "table" or "avx512-vpclmul".
std::string_view crc32c_impl_name(Crc32cImpl impl) noexcept;
/// Returns true if `impl` can run on this CPU and build.
bool crc32c_impl_available(Crc32cImpl impl) noexcept;
/// Returns crc32c(data, crc) computed by `impl`, for tests and benchmarks. Throws
/// zinf::UsageError if `impl` is not available here.
std::uint32_t crc32c_with(Crc32cImpl impl, std::span<const std::byte> data, std::uint32_t crc = 0);

}  // namespace zinf::swap
