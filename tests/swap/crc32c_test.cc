// SPDX-License-Identifier: Apache-2.0
// CRC32C: known vectors, incremental updates, and the hardware path agreeing with the table
// path on every length and misalignment the lane and tail logic distinguish.
#include "zinf/swap/crc32c.h"

#include <cstring>
#include <random>
#include <string_view>
#include <vector>

#if defined(__aarch64__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif

#include <gtest/gtest.h>

#include "zinf/common/error.h"

namespace zinf::swap {
namespace {

std::span<const std::byte> bytes_of(std::string_view s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

std::vector<Crc32cImpl> available_impls() {
  std::vector<Crc32cImpl> out{Crc32cImpl::kTable};
  if (crc32c_impl_available(Crc32cImpl::kHardware)) out.push_back(Crc32cImpl::kHardware);
  if (crc32c_impl_available(Crc32cImpl::kAvx512)) out.push_back(Crc32cImpl::kAvx512);
  return out;
}

TEST(Crc32c, KnownVectors) {
  for (Crc32cImpl impl : available_impls()) {
    SCOPED_TRACE(std::string(crc32c_impl_name(impl)));
    EXPECT_EQ(crc32c_with(impl, bytes_of("123456789")), 0xE3069283u);
    EXPECT_EQ(crc32c_with(impl, bytes_of("")), 0u);
    EXPECT_EQ(crc32c_with(impl, bytes_of("a")), 0xC1D04330u);
    // RFC 3720 (iSCSI) B.4: 32 bytes of zeros, of 0xff, ascending and descending.
    std::vector<std::byte> buf(32);
    EXPECT_EQ(crc32c_with(impl, buf), 0x8A9136AAu);
    std::memset(buf.data(), 0xff, buf.size());
    EXPECT_EQ(crc32c_with(impl, buf), 0x62A8AB43u);
    for (std::size_t i = 0; i < 32; ++i) buf[i] = static_cast<std::byte>(i);
    EXPECT_EQ(crc32c_with(impl, buf), 0x46DD794Eu);
    for (std::size_t i = 0; i < 32; ++i) buf[i] = static_cast<std::byte>(31 - i);
    EXPECT_EQ(crc32c_with(impl, buf), 0x113FDB5Cu);
  }
}

TEST(Crc32c, DefaultUsesHardwareWhereAvailable) {
  // What the CPU says, asked here independently of the library: SSE4.2 (x86) or the ARMv8
  // CRC32 extension (aarch64).
#if defined(__x86_64__) || defined(__i386__)
  const bool cpu_has_crc = __builtin_cpu_supports("sse4.2");
#elif defined(__aarch64__)
  const bool cpu_has_crc = (getauxval(AT_HWCAP) & HWCAP_CRC32) != 0;
#else
  const bool cpu_has_crc = false;
#endif
  if (crc32c_impl_available(Crc32cImpl::kAvx512)) {
    EXPECT_TRUE(cpu_has_crc);
    EXPECT_EQ(crc32c_active_impl(), Crc32cImpl::kAvx512);
  } else if (cpu_has_crc) {
    EXPECT_EQ(crc32c_active_impl(), Crc32cImpl::kHardware);
  } else {
    EXPECT_EQ(crc32c_active_impl(), Crc32cImpl::kTable);
    EXPECT_THROW((void)crc32c_with(Crc32cImpl::kHardware, bytes_of("x")), UsageError);
  }
  EXPECT_EQ(crc32c(bytes_of("123456789")), 0xE3069283u);
}

TEST(Crc32c, IncrementalEqualsWhole) {
  std::mt19937_64 rng(42);
  std::vector<std::byte> data(100000);
  for (auto& b : data) b = static_cast<std::byte>(rng());
  std::span<const std::byte> all(data);
  for (Crc32cImpl impl : available_impls()) {
    SCOPED_TRACE(std::string(crc32c_impl_name(impl)));
    const std::uint32_t whole = crc32c_with(impl, all);
    for (std::size_t cut : {0ul, 1ul, 7ul, 8ul, 4095ul, 12288ul, 12289ul, 50000ul, 100000ul}) {
      std::uint32_t first = crc32c_with(impl, all.first(cut));
      EXPECT_EQ(crc32c_with(impl, all.subspan(cut), first), whole) << "cut at " << cut;
    }
    // Many small pieces.
    std::uint32_t running = 0;
    for (std::size_t off = 0; off < data.size(); off += 333) {
      running = crc32c_with(impl, all.subspan(off, std::min<std::size_t>(333, data.size() - off)),
                            running);
    }
    EXPECT_EQ(running, whole);
  }
}

// crc32c_combine joins the CRCs of two pieces into the CRC of both, for every cut, including
// empty pieces and lengths with many set bits.
TEST(Crc32c, CombineEqualsTheCrcOfTheConcatenation) {
  std::mt19937_64 rng(7);
  std::vector<std::byte> data(200000);
  for (auto& b : data) b = static_cast<std::byte>(rng());
  std::span<const std::byte> all(data);
  const std::uint32_t whole = crc32c(all);
  for (std::size_t cut : {0ul, 1ul, 3ul, 4096ul, 65535ul, 65536ul, 131071ul, 199999ul, 200000ul}) {
    const std::uint32_t a = crc32c(all.first(cut));
    const std::uint32_t b = crc32c(all.subspan(cut));
    EXPECT_EQ(crc32c_combine(a, b, data.size() - cut), whole) << "cut at " << cut;
  }
  // Three pieces joined right to left give the same as left to right.
  const std::uint32_t p1 = crc32c(all.first(1000));
  const std::uint32_t p2 = crc32c(all.subspan(1000, 77777));
  const std::uint32_t p3 = crc32c(all.subspan(78777));
  EXPECT_EQ(crc32c_combine(crc32c_combine(p1, p2, 77777), p3, data.size() - 78777), whole);
  EXPECT_EQ(crc32c_combine(p1, crc32c_combine(p2, p3, data.size() - 78777), data.size() - 1000),
            whole);
}

// The hardware path has a byte head (to 8-byte alignment), a 3-lane loop over 12 KiB chunks,
// an 8-byte loop and a byte tail: lengths and start offsets around each boundary.
TEST(Crc32c, HardwareMatchesTableOnAllPaths) {
  if (!crc32c_impl_available(Crc32cImpl::kHardware)) {
    GTEST_SKIP() << "no crc32c instruction (SSE4.2 or ARMv8 CRC32) on this CPU";
  }
  std::mt19937_64 rng(7);
  std::vector<std::byte> data(5 * 12288 + 64);
  for (auto& b : data) b = static_cast<std::byte>(rng());
  std::span<const std::byte> all(data);
  std::vector<std::size_t> lengths;
  for (std::size_t n = 0; n < 40; ++n) lengths.push_back(n);
  for (std::size_t base : {4096ul, 8192ul, 12288ul, 24576ul, 3 * 12288ul}) {
    for (std::size_t d = 0; d < 18; ++d) {
      lengths.push_back(base - 9 + d);
    }
  }
  for (std::size_t start = 0; start < 9; ++start) {
    for (std::size_t len : lengths) {
      auto piece = all.subspan(start, len);
      std::uint32_t seed = static_cast<std::uint32_t>(rng());
      ASSERT_EQ(crc32c_with(Crc32cImpl::kHardware, piece, seed),
                crc32c_with(Crc32cImpl::kTable, piece, seed))
          << "start " << start << " length " << len;
    }
  }
}

// The folding path takes 256-byte blocks, then 64-byte, then 16-byte ones and hands the rest
// (and inputs under 256 bytes) to SSE4.2: lengths around each boundary, at odd start offsets
// and with any incoming register, against the table.
TEST(Crc32c, Avx512MatchesTableOnAllPaths) {
  if (!crc32c_impl_available(Crc32cImpl::kAvx512)) GTEST_SKIP() << "no AVX-512 VPCLMULQDQ here";
  std::mt19937_64 rng(11);
  std::vector<std::byte> data((1 << 20) + 4096);
  for (auto& b : data) b = static_cast<std::byte>(rng());
  std::span<const std::byte> all(data);
  std::vector<std::size_t> lengths;
  for (std::size_t base : {0ul, 16ul, 64ul, 256ul, 320ul, 512ul, 4096ul, 12288ul, 65536ul}) {
    for (std::size_t d = 0; d < 40; ++d) {
      if (base + d >= 20) lengths.push_back(base + d - 20);
    }
  }
  lengths.push_back(1 << 20);
  for (std::size_t start : {0ul, 1ul, 3ul, 8ul, 17ul, 63ul}) {
    for (std::size_t len : lengths) {
      auto piece = all.subspan(start, len);
      const std::uint32_t seed = static_cast<std::uint32_t>(rng());
      ASSERT_EQ(crc32c_with(Crc32cImpl::kAvx512, piece, seed),
                crc32c_with(Crc32cImpl::kTable, piece, seed))
          << "start " << start << " length " << len;
    }
  }
}

TEST(Crc32c, DetectsSingleBitFlips) {
  std::vector<std::byte> data(1 << 20);
  std::mt19937_64 rng(3);
  for (auto& b : data) b = static_cast<std::byte>(rng());
  const std::uint32_t good = crc32c(data);
  for (std::size_t pos : {0ul, 1ul, 4096ul, 12287ul, 524288ul, (1ul << 20) - 1}) {
    data[pos] ^= std::byte{0x10};
    EXPECT_NE(crc32c(data), good) << "flip at " << pos;
    data[pos] ^= std::byte{0x10};
  }
  EXPECT_EQ(crc32c(data), good);
}

}  // namespace
}  // namespace zinf::swap
