// SPDX-License-Identifier: Apache-2.0
// The stress workers' data: every 8-byte word stamped with where it belongs, so that a mismatch
// says which tensor, which write and which place the bytes found came from.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace zinf::tools::stress {

// Every 8-byte word at tensor offset o encodes (tensor uid, generation, o / 8), so a mismatch
// says which tensor, which write and which place the found bytes came from.
constexpr std::uint64_t kStampMagic = 0xa5c3'0000'0000'0000ull;

inline std::uint64_t stamp(std::uint32_t uid, std::uint32_t gen, std::uint64_t offset) {
  return kStampMagic ^ (static_cast<std::uint64_t>(uid & 0xffffu) << 48) ^
         (static_cast<std::uint64_t>(gen & 0xffffu) << 32) ^ ((offset / 8) & 0xffffffffu);
}

inline std::string decode(std::uint64_t w) {
  const std::uint64_t x = w ^ kStampMagic;
  return "uid=" + std::to_string(x >> 48) + " gen=" + std::to_string((x >> 32) & 0xffffu) +
         " offset=" + std::to_string((x & 0xffffffffu) * 8);
}

// Fills `buf` (a multiple of 8 bytes) as tensor bytes from `offset` of generation `gen`.
inline void fill(std::span<std::byte> buf, std::uint32_t uid, std::uint32_t gen,
                 std::uint64_t offset) {
  auto* w = reinterpret_cast<std::uint64_t*>(buf.data());
  const std::size_t n = buf.size() / 8;
  for (std::size_t i = 0; i < n; ++i) w[i] = stamp(uid, gen, offset + i * 8);
}

// Checks `buf` against tensor bytes from `offset`, whose generation per `unit`-byte block is
// gen_of(block). Returns "" or the first mismatch.
template <typename GenOf>
std::string check(std::span<const std::byte> buf, std::uint32_t uid, std::uint64_t offset,
                  std::uint64_t unit, GenOf gen_of) {
  const auto* w = reinterpret_cast<const std::uint64_t*>(buf.data());
  const std::size_t n = buf.size() / 8;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t o = offset + i * 8;
    const std::uint64_t want = stamp(uid, gen_of(o / unit), o);
    if (w[i] != want) {
      return "tensor offset " + std::to_string(o) + ": expected (" + decode(want) + "), found (" +
             decode(w[i]) + ")";
    }
  }
  // A tail shorter than a word (layer sizes that are not multiples of 8) is compared bytewise.
  for (std::size_t b = n * 8; b < buf.size(); ++b) {
    const std::uint64_t o = offset + b;
    const std::uint64_t want = stamp(uid, gen_of(o / unit), o - o % 8);
    const auto want_byte = static_cast<std::byte>(want >> (8 * (o % 8)));
    if (buf[b] != want_byte) return "tensor offset " + std::to_string(o) + ": tail byte differs";
  }
  return {};
}

}  // namespace zinf::tools::stress
