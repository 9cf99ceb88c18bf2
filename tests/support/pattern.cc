// SPDX-License-Identifier: Apache-2.0
#include "support/pattern.h"

#include <cstring>
#include <sstream>

namespace zinf::test {
namespace {

// 64-bit word at absolute byte position `pos`: high 16 bits file id, next 12 generation, low
// 36 the word index, then mixed so that neighbouring words and zero pages never look alike.
std::uint64_t word_at(std::uint32_t file_id, std::uint64_t pos, std::uint32_t generation) {
  std::uint64_t w = (std::uint64_t{file_id & 0xffff} << 48) |
                    (std::uint64_t{generation & 0xfff} << 36) | ((pos / 8) & 0xfffffffffull);
  return w ^ 0x9e3779b97f4a7c15ull;
}

}  // namespace

void fill_pattern(std::span<std::byte> buf, std::uint32_t file_id, std::uint64_t offset,
                  std::uint32_t generation) {
  for (std::size_t i = 0; i < buf.size(); ++i) {
    std::uint64_t pos = offset + i;
    std::uint64_t w = word_at(file_id, pos, generation);
    buf[i] = static_cast<std::byte>(w >> (8 * (pos % 8)));
  }
}

std::string check_pattern(std::span<const std::byte> buf, std::uint32_t file_id,
                          std::uint64_t offset, std::uint32_t generation) {
  for (std::size_t i = 0; i < buf.size(); ++i) {
    std::uint64_t pos = offset + i;
    std::uint64_t w = word_at(file_id, pos, generation);
    auto expected = static_cast<std::byte>(w >> (8 * (pos % 8)));
    if (buf[i] != expected) {
      std::ostringstream os;
      os << "mismatch at buffer byte " << i << " (file offset " << pos << ", file " << file_id
         << ", generation " << generation << "): expected 0x" << std::hex
         << static_cast<int>(expected) << " found 0x" << static_cast<int>(buf[i]);
      std::size_t word_start = i - (pos % 8);
      if (pos % 8 <= i && word_start + 8 <= buf.size()) {
        std::uint64_t found = 0;
        std::memcpy(&found, buf.data() + word_start, 8);
        found ^= 0x9e3779b97f4a7c15ull;
        os << std::dec << "; found word decodes to file " << (found >> 48) << " generation "
           << ((found >> 36) & 0xfff) << " offset " << ((found & 0xfffffffffull) * 8);
      }
      return os.str();
    }
  }
  return {};
}

}  // namespace zinf::test
