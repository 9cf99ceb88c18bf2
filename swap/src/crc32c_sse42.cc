// SPDX-License-Identifier: Apache-2.0
// CRC32C with the SSE4.2 crc32 instruction. The only file built with -msse4.2 (swap/
// CMakeLists.txt); called only after crc32c.cc has checked the CPU, so no SSE4.2 code runs on
// a CPU without it.
#include "crc32c_internal.h"

#include <cstring>

#if defined(__SSE4_2__)
#include <nmmintrin.h>
#endif

#include "zinf/common/check.h"

namespace zinf::swap::detail {

#if defined(__SSE4_2__)

bool crc32c_sse42_compiled() noexcept { return true; }

namespace {

std::uint64_t load64(const std::byte* p) noexcept {
  std::uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

std::uint32_t update_bytes(std::uint32_t state, const std::byte* p, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) state = _mm_crc32_u8(state, static_cast<std::uint8_t>(p[i]));
  return state;
}

}  // namespace

// crc32 has a latency of 3 cycles and a throughput of 1 per cycle on recent x86 cores, so one
// dependent chain runs at a third of the speed. Three lanes of kCrc32cLaneBytes are summed in
// parallel (the second and third from zero) and joined by linearity:
//   state(a, A|B|C) = shift(shift(a') ^ b') ^ c'  where a' = state(a, A), b', c' from zero.
std::uint32_t crc32c_sse42_update(std::uint32_t state, const std::byte* p, std::size_t n) noexcept {
  // Align to 8 so the 64-bit steps read aligned words.
  std::size_t head = (8 - reinterpret_cast<std::uintptr_t>(p) % 8) % 8;
  if (head > n) head = n;
  state = update_bytes(state, p, head);
  p += head;
  n -= head;

  constexpr std::size_t kLane = kCrc32cLaneBytes;
  std::uint64_t a = state;
  while (n >= 3 * kLane) {
    std::uint64_t b = 0;
    std::uint64_t c = 0;
    for (std::size_t i = 0; i < kLane; i += 8) {
      a = _mm_crc32_u64(a, load64(p + i));
      b = _mm_crc32_u64(b, load64(p + kLane + i));
      c = _mm_crc32_u64(c, load64(p + 2 * kLane + i));
    }
    std::uint32_t joined =
        crc32c_shift_lane(static_cast<std::uint32_t>(a)) ^ static_cast<std::uint32_t>(b);
    a = crc32c_shift_lane(joined) ^ static_cast<std::uint32_t>(c);
    p += 3 * kLane;
    n -= 3 * kLane;
  }
  while (n >= 8) {
    a = _mm_crc32_u64(a, load64(p));
    p += 8;
    n -= 8;
  }
  return update_bytes(static_cast<std::uint32_t>(a), p, n);
}

#else

bool crc32c_sse42_compiled() noexcept { return false; }

std::uint32_t crc32c_sse42_update(std::uint32_t, const std::byte*, std::size_t) noexcept {
  ZINF_CHECK(false, "crc32c: SSE4.2 path called in a build without it");
  return 0;
}

#endif

}  // namespace zinf::swap::detail
