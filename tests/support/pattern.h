// SPDX-License-Identifier: Apache-2.0
// Stamped data for round-trip tests: every 8-byte word encodes (file id, offset, generation),
// so a mismatch says which block came back from where and when (docs/style.md section 7).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace zinf::test {

/// Fills `buf` as the bytes that belong at `offset` of file `file_id` in `generation`.
void fill_pattern(std::span<std::byte> buf, std::uint32_t file_id, std::uint64_t offset,
                  std::uint32_t generation);

/// Returns "" if `buf` holds exactly that pattern, else a description of the first mismatch
/// (byte offset, expected and found words, and what the found word decodes to).
std::string check_pattern(std::span<const std::byte> buf, std::uint32_t file_id,
                          std::uint64_t offset, std::uint32_t generation);

}  // namespace zinf::test
