// SPDX-License-Identifier: Apache-2.0
// The order in which a CpuAdam kernel visits its range, chosen per call from the arrays'
// addresses: sequential, or in windows of 4 KiB of fp32 walked as 8 interleaved streams. Shared
// by the AVX2 and portable paths (cpu_adam_avx2.cc, cpu_adam_scalar.cc), which update one piece
// of 8 elements (32 bytes of fp32) at a time in either order. Everything has internal linkage,
// so each kernel TU keeps its own copy built with its own flags.
//
// Why two orders: a load waits for an older store still in flight that it seems to overlap
// when compared on part of the address only, and a store here leaves only after its element's
// sqrt and divide. On the Intel Xeon (Emerald Rapids) this was measured on, the part is the low
// 20 bits of the physical address (x86's "4K aliasing", with bits 12-19 too): arrays a few
// vectors apart mod 1 MiB on 2 MiB pages collide, the same gap plus any power of two from
// 4 KiB to 512 KiB does not, and on 4 KiB pages (random physical bits 12-19) neither does
// (docs/benchmarks.md, issue #37). In sequential order the loads of piece j+1 follow the stores
// of piece j, so an array read 16 to ~150 bytes before an array written made almost every
// load wait on a recent store (0.14x on AVX2, 0.1x on the portable path). The AVX-512 path
// cures that by loading a block ahead; AVX2 has too few registers to hold that many bytes
// ahead, and the portable loop is the compiler's. The windowed order puts 7 pieces of other
// streams between a piece and the next one of its stream; the loads that then follow a recent
// store they may collide with are those 512 bytes (or 512 bytes less a window) per stream
// away, so each call takes the order whose nearest such pair is furthest. The choice reads the
// virtual address, which on 2 MiB pages has the physical bits 0-20. Both orders update every
// element once with the same operations: the bits never change.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "cpu_adam_kernel.h"

namespace zinf::adam::detail {
namespace {

// The unit both orders step by, in elements: one AVX2 vector, two SSE vectors.
constexpr std::size_t kPiece = 8;
constexpr std::uint32_t kPieceBytes = kPiece * 4;

// The windowed order: each window of 1024 elements (4 KiB of an fp32 array) is walked as
// kStreams streams kStride elements (512 bytes) apart, one piece of each stream in turn.
constexpr std::size_t kStreams = 8;
constexpr std::size_t kStride = 128;
constexpr std::size_t kWindow = kStreams * kStride;
constexpr std::uint32_t kStrideBytes = kStride * 4;

// The address bits compared: a collision needs equal addresses mod 1 MiB.
constexpr std::uint32_t kAliasMask = (std::uint32_t{1} << 20) - 1;

// True if a piece `delta` bytes past another mod 1 MiB, moved on by `at` bytes, shares bytes
// with it in the compared address bits.
constexpr bool aliases(std::uint32_t delta, std::uint32_t at) {
  const std::uint32_t d = (delta - at) & kAliasMask;
  return d < kPieceBytes || d > kAliasMask + 1 - kPieceBytes;
}

// The nearest distance d, in pieces of loop order (1 to `safe`), at which a load of one array
// follows a store to another that lies `delta` bytes past it mod 1 MiB. Sequential order: the
// piece d places on is 32 bytes per place further. Windowed order: the piece d streams on in
// the same round is 512 bytes per stream further, and one that wraps into the next round is
// 32 bytes beyond that less a window (4 KiB).
constexpr std::size_t alias_distance(bool windowed, std::uint32_t delta, std::size_t safe) {
  constexpr std::uint32_t kWindowBytes = kWindow * 4;
  for (std::size_t d = 1; d < safe; ++d) {
    const auto u = static_cast<std::uint32_t>(d);
    if (!windowed && aliases(delta, u * kPieceBytes)) return d;
    if (windowed && (aliases(delta, u * kStrideBytes) ||
                     aliases(delta, u * kStrideBytes + kPieceBytes - kWindowBytes))) {
      return d;
    }
  }
  return safe;
}

// True if this call should walk its range in the windowed order: some array it reads lies
// fewer than `safe` pieces before an array it writes mod 1 MiB, and the windowed order takes
// the nearest such pair further apart. `safe` is the kernel's own: the distance from which, in
// its offset sweep (docs/benchmarks.md), a load after a store it may collide with no longer
// slowed it. Narrow gradients (2 bytes an element) drift against the 4-byte arrays along the
// loop, so no order keeps them clear and they are left out.
inline bool use_windowed_order(const KernelArgs& a, std::size_t safe) {
  const auto addr = [](const void* q) {
    return static_cast<std::uint32_t>(reinterpret_cast<std::uintptr_t>(q));
  };
  const std::uint32_t stores[] = {addr(a.params), addr(a.m), addr(a.v)};
  const std::uint32_t loads[] = {addr(a.params), addr(a.m), addr(a.v), addr(a.grads)};
  const std::size_t n_loads = a.grad_type == ElementType::kF32 ? 4 : 3;
  std::size_t sequential = safe;
  std::size_t windowed = safe;
  for (std::size_t x = 0; x < n_loads; ++x) {
    for (std::size_t y = 0; y < 3; ++y) {
      if (x == y) continue;
      const std::uint32_t delta = (stores[y] - loads[x]) & kAliasMask;
      sequential = std::min(sequential, alias_distance(false, delta, safe));
      windowed = std::min(windowed, alias_distance(true, delta, safe));
    }
  }
  return windowed > sequential;
}

}  // namespace
}  // namespace zinf::adam::detail
