// SPDX-License-Identifier: Apache-2.0
#include "io_pattern.h"

#include <array>
#include <cstring>

namespace zinf::tools {
namespace {

constexpr std::size_t kHeader = 16;
constexpr std::uint64_t kMagic = 0x7a696e66'00000000ull;  // "zinf"

using Body = std::array<std::byte, kPatternSector - kHeader>;

// The body of `generation`, built once per thread and generation (xorshift64*).
const Body& body_for(std::uint32_t generation) {
  thread_local Body body{};
  thread_local std::uint32_t built = 0;
  if (built != generation) {
    std::uint64_t x = 0x9e3779b97f4a7c15ull ^ (std::uint64_t{generation} * 0xbf58476d1ce4e5b9ull);
    for (std::size_t i = 0; i < body.size(); i += 8) {
      x ^= x >> 12;
      x ^= x << 25;
      x ^= x >> 27;
      std::uint64_t w = x * 0x2545f4914f6cdd1dull;
      std::memcpy(body.data() + i, &w, std::min<std::size_t>(8, body.size() - i));
    }
    built = generation;
  }
  return body;
}

void header_for(std::uint32_t file, std::uint64_t sector_offset, std::uint32_t generation,
                std::byte out[kHeader]) {
  std::uint64_t a = kMagic ^ (std::uint64_t{file} << 32) ^ generation;
  std::memcpy(out, &a, 8);
  std::memcpy(out + 8, &sector_offset, 8);
}

}  // namespace

void fill_bulk(std::span<std::byte> buf, std::uint32_t generation) {
  const Body& body = body_for(generation);
  for (std::size_t s = 0; s + kPatternSector <= buf.size(); s += kPatternSector) {
    std::memcpy(buf.data() + s + kHeader, body.data(), body.size());
  }
}

void stamp_headers(std::span<std::byte> buf, std::uint32_t file, std::uint64_t offset,
                   std::uint32_t generation) {
  for (std::size_t s = 0; s + kPatternSector <= buf.size(); s += kPatternSector) {
    header_for(file, offset + s, generation, buf.data() + s);
  }
}

std::string verify_block(std::span<const std::byte> buf, std::uint32_t file, std::uint64_t offset,
                         std::uint32_t generation) {
  const Body& body = body_for(generation);
  for (std::size_t s = 0; s + kPatternSector <= buf.size(); s += kPatternSector) {
    std::byte want[kHeader];
    header_for(file, offset + s, generation, want);
    if (std::memcmp(buf.data() + s, want, kHeader) != 0) {
      std::uint64_t got_a = 0, got_off = 0;
      std::memcpy(&got_a, buf.data() + s, 8);
      std::memcpy(&got_off, buf.data() + s + 8, 8);
      got_a ^= kMagic;
      return "sector at file offset " + std::to_string(offset + s) + " has the header of file " +
             std::to_string(got_a >> 32) + " generation " + std::to_string(got_a & 0xffffffffu) +
             " offset " + std::to_string(got_off) + " (expected file " + std::to_string(file) +
             " generation " + std::to_string(generation) + ")";
    }
    if (std::memcmp(buf.data() + s + kHeader, body.data(), body.size()) != 0) {
      for (std::size_t i = 0; i < body.size(); ++i) {
        if (buf[s + kHeader + i] != body[i]) {
          return "byte at file offset " + std::to_string(offset + s + kHeader + i) +
                 " differs from what was written";
        }
      }
    }
  }
  return {};
}

}  // namespace zinf::tools
