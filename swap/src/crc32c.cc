// SPDX-License-Identifier: Apache-2.0
// CRC32C: the portable slicing-by-8 tables, the lane-join table of the hardware path, and the
// run-time choice between them (cpuid through __builtin_cpu_supports on x86, the auxiliary
// vector's HWCAP on aarch64, checked once).
// Hand-written because no packaged library does it here: Google's crc32c is not in Debian 12,
// and zlib's crc32 is the other polynomial.
#include "zinf/swap/crc32c.h"

#include <array>
#include <string>

#include "crc32c_internal.h"
#include "zinf/common/error.h"

#if defined(__aarch64__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif

namespace zinf::swap {
namespace detail {
namespace {

constexpr std::uint32_t kPolyReflected = 0x82F63B78u;  // 0x1EDC6F41 bit-reversed

using Tables = std::array<std::array<std::uint32_t, 256>, 8>;

// Table k maps a byte to its contribution k bytes further back, so eight bytes are folded with
// eight independent lookups (slicing-by-8).
constexpr Tables make_tables() {
  Tables t{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int b = 0; b < 8; ++b) c = (c >> 1) ^ ((c & 1u) != 0 ? kPolyReflected : 0u);
    t[0][i] = c;
  }
  for (std::size_t k = 1; k < 8; ++k) {
    for (std::size_t i = 0; i < 256; ++i) t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xffu];
  }
  return t;
}

constexpr Tables kTables = make_tables();

std::uint32_t step_byte(std::uint32_t state, std::uint8_t byte) noexcept {
  return kTables[0][(state ^ byte) & 0xffu] ^ (state >> 8);
}

// The linear map "feed kCrc32cLaneBytes zero bytes", as four byte-indexed tables built from
// the images of the 32 basis vectors.
struct ShiftTable {
  std::array<std::array<std::uint32_t, 256>, 4> t{};
  ShiftTable() {
    std::array<std::uint32_t, 32> basis{};
    for (std::size_t bit = 0; bit < 32; ++bit) {
      std::uint32_t s = 1u << bit;
      for (std::size_t i = 0; i < kCrc32cLaneBytes; ++i) s = step_byte(s, 0);
      basis[bit] = s;
    }
    for (std::size_t k = 0; k < 4; ++k) {
      for (std::size_t v = 0; v < 256; ++v) {
        std::uint32_t image = 0;
        for (std::size_t b = 0; b < 8; ++b) {
          if ((v >> b) & 1u) image ^= basis[k * 8 + b];
        }
        t[k][v] = image;
      }
    }
  }
};

}  // namespace

std::uint32_t crc32c_table_update(std::uint32_t state, const std::byte* data,
                                  std::size_t n) noexcept {
  const auto* p = reinterpret_cast<const std::uint8_t*>(data);
  while (n >= 8) {
    // Assembled byte by byte so the result does not depend on host byte order; compilers turn
    // this into one load on little-endian machines.
    std::uint32_t lo = (std::uint32_t{p[0]} | std::uint32_t{p[1]} << 8 | std::uint32_t{p[2]} << 16 |
                        std::uint32_t{p[3]} << 24) ^
                       state;
    std::uint32_t hi = std::uint32_t{p[4]} | std::uint32_t{p[5]} << 8 | std::uint32_t{p[6]} << 16 |
                       std::uint32_t{p[7]} << 24;
    state = kTables[7][lo & 0xffu] ^ kTables[6][(lo >> 8) & 0xffu] ^
            kTables[5][(lo >> 16) & 0xffu] ^ kTables[4][lo >> 24] ^ kTables[3][hi & 0xffu] ^
            kTables[2][(hi >> 8) & 0xffu] ^ kTables[1][(hi >> 16) & 0xffu] ^ kTables[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  while (n-- > 0) state = step_byte(state, *p++);
  return state;
}

std::uint32_t crc32c_shift_lane(std::uint32_t state) noexcept {
  static const ShiftTable table;  // built once (thread-safe static), ~0.3 ms
  return table.t[0][state & 0xffu] ^ table.t[1][(state >> 8) & 0xffu] ^
         table.t[2][(state >> 16) & 0xffu] ^ table.t[3][state >> 24];
}

}  // namespace detail

namespace {

// The CPU's own crc32c instruction: SSE4.2 on x86, the ARMv8 CRC32 extension (optional before
// ARMv8.1, so asked of the kernel) on aarch64.
bool hardware_available() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  static const bool available = detail::crc32c_sse42_compiled() && __builtin_cpu_supports("sse4.2");
  return available;
#elif defined(__aarch64__)
  static const bool available =
      detail::crc32c_arm_compiled() && (getauxval(AT_HWCAP) & HWCAP_CRC32) != 0;
  return available;
#else
  return false;
#endif
}

std::uint32_t hardware_update(std::uint32_t state, const std::byte* data, std::size_t n) noexcept {
#if defined(__aarch64__)
  return detail::crc32c_arm_update(state, data, n);
#else
  return detail::crc32c_sse42_update(state, data, n);
#endif
}

// AVX-512F and VPCLMULQDQ (libgcc's check of AVX-512 includes the OS saving its state), with
// SSE4.2 for the short inputs and the final step.
bool avx512_available() noexcept {
#if defined(__x86_64__)
  static const bool available = detail::crc32c_avx512_compiled() && hardware_available() &&
                                __builtin_cpu_supports("avx512f") &&
                                __builtin_cpu_supports("vpclmulqdq");
  return available;
#else
  return false;
#endif
}

std::uint32_t run(Crc32cImpl impl, std::span<const std::byte> data, std::uint32_t crc) noexcept {
  std::uint32_t state = ~crc;
  if (impl == Crc32cImpl::kAvx512) {
    state = detail::crc32c_avx512_update(state, data.data(), data.size());
  } else if (impl == Crc32cImpl::kHardware) {
    state = hardware_update(state, data.data(), data.size());
  } else {
    state = detail::crc32c_table_update(state, data.data(), data.size());
  }
  return ~state;
}

}  // namespace

namespace {

// Polynomials over GF(2) modulo the CRC's polynomial, in the bit order of the CRC register
// (reflected): bit 31 holds x^0 and bit 0 x^31.
constexpr std::uint32_t kOne = 1u << 31;

constexpr std::uint32_t times_x(std::uint32_t a) noexcept {
  return (a >> 1) ^ ((a & 1u) != 0 ? detail::kPolyReflected : 0u);
}

constexpr std::uint32_t multiply(std::uint32_t a, std::uint32_t b) noexcept {
  std::uint32_t product = 0;
  for (int bit = 31; bit >= 0; --bit) {  // the coefficient of x^(31 - bit) in a
    if (((a >> bit) & 1u) != 0) product ^= b;
    b = times_x(b);
  }
  return product;
}

// kBytePowers[k] = x^(8 * 2^k): feeding 2^k zero bytes through the register multiplies it by
// that, so a shift by n bytes is the product of the powers of n's set bits.
constexpr std::array<std::uint32_t, 64> make_byte_powers() {
  std::array<std::uint32_t, 64> p{};
  std::uint32_t x8 = kOne;
  for (int i = 0; i < 8; ++i) x8 = times_x(x8);
  p[0] = x8;
  for (std::size_t k = 1; k < p.size(); ++k) p[k] = multiply(p[k - 1], p[k - 1]);
  return p;
}

constexpr std::array<std::uint32_t, 64> kBytePowers = make_byte_powers();

}  // namespace

std::uint32_t crc32c_combine(std::uint32_t crc_a, std::uint32_t crc_b,
                             std::uint64_t length_b) noexcept {
  // The register after a is crc_a's; b's bytes then shift it by x^(8 |b|) while adding b's
  // own sum. The initial and final inversions cancel out in this form (they are the same
  // constant on both sides), so the stored CRC values combine directly.
  std::uint32_t shift = kOne;
  for (std::size_t k = 0; length_b != 0; ++k, length_b >>= 1) {
    if ((length_b & 1u) != 0) shift = multiply(shift, kBytePowers[k]);
  }
  return multiply(crc_a, shift) ^ crc_b;
}

std::uint32_t crc32c(std::span<const std::byte> data, std::uint32_t crc) noexcept {
  return run(crc32c_active_impl(), data, crc);
}

Crc32cImpl crc32c_active_impl() noexcept {
  if (avx512_available()) return Crc32cImpl::kAvx512;
  return hardware_available() ? Crc32cImpl::kHardware : Crc32cImpl::kTable;
}

std::string_view crc32c_impl_name(Crc32cImpl impl) noexcept {
  switch (impl) {
#if defined(__aarch64__)
    case Crc32cImpl::kHardware: return "armv8-crc32";
#else
    case Crc32cImpl::kHardware: return "sse4.2";
#endif
    case Crc32cImpl::kAvx512: return "avx512-vpclmul";
    case Crc32cImpl::kTable: break;
  }
  return "table";
}

bool crc32c_impl_available(Crc32cImpl impl) noexcept {
  switch (impl) {
    case Crc32cImpl::kHardware: return hardware_available();
    case Crc32cImpl::kAvx512: return avx512_available();
    case Crc32cImpl::kTable: break;
  }
  return true;
}

std::uint32_t crc32c_with(Crc32cImpl impl, std::span<const std::byte> data, std::uint32_t crc) {
  if (!crc32c_impl_available(impl)) {
    throw UsageError("crc32c: implementation " + std::string(crc32c_impl_name(impl)) +
                     " is not available on this CPU or build");
  }
  return run(impl, data, crc);
}

}  // namespace zinf::swap
