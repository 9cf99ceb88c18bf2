// SPDX-License-Identifier: Apache-2.0
// CRC32C with the ARMv8 CRC32 instructions (CRC32CB/CRC32CX through arm_acle.h). The only file
// built with -march=armv8-a+crc, and only for aarch64 (swap/CMakeLists.txt): the extension is
// optional before ARMv8.1, so crc32c.cc calls this only where the kernel reports HWCAP_CRC32.
// The same three-lane scheme as the SSE4.2 path (crc32c_sse42.cc): CRC32CX has a latency of
// several cycles and a throughput of one per cycle on common cores, so three independent
// chains are summed and joined by linearity.
#include "crc32c_internal.h"

#include <cstring>

#if defined(__aarch64__) && defined(__ARM_FEATURE_CRC32)
#include <arm_acle.h>
#endif

#include "zinf/common/check.h"

namespace zinf::swap::detail {

#if defined(__aarch64__) && defined(__ARM_FEATURE_CRC32)

bool crc32c_arm_compiled() noexcept { return true; }

namespace {

std::uint64_t load64(const std::byte* p) noexcept {
  std::uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

std::uint32_t update_bytes(std::uint32_t state, const std::byte* p, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) state = __crc32cb(state, static_cast<std::uint8_t>(p[i]));
  return state;
}

}  // namespace

std::uint32_t crc32c_arm_update(std::uint32_t state, const std::byte* p, std::size_t n) noexcept {
  // Align to 8 so the 64-bit steps read aligned words.
  std::size_t head = (8 - reinterpret_cast<std::uintptr_t>(p) % 8) % 8;
  if (head > n) head = n;
  state = update_bytes(state, p, head);
  p += head;
  n -= head;

  constexpr std::size_t kLane = kCrc32cLaneBytes;
  std::uint32_t a = state;
  while (n >= 3 * kLane) {
    std::uint32_t b = 0;
    std::uint32_t c = 0;
    for (std::size_t i = 0; i < kLane; i += 8) {
      a = __crc32cd(a, load64(p + i));
      b = __crc32cd(b, load64(p + kLane + i));
      c = __crc32cd(c, load64(p + 2 * kLane + i));
    }
    a = crc32c_shift_lane(crc32c_shift_lane(a) ^ b) ^ c;
    p += 3 * kLane;
    n -= 3 * kLane;
  }
  while (n >= 8) {
    a = __crc32cd(a, load64(p));
    p += 8;
    n -= 8;
  }
  return update_bytes(a, p, n);
}

#else

bool crc32c_arm_compiled() noexcept { return false; }

std::uint32_t crc32c_arm_update(std::uint32_t, const std::byte*, std::size_t) noexcept {
  ZINF_CHECK(false, "crc32c: ARMv8 CRC32 path called in a build without it");
  return 0;
}

#endif

}  // namespace zinf::swap::detail
