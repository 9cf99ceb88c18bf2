// SPDX-License-Identifier: Apache-2.0
// The data pattern `zinf bench io`, `bench prefetch` and `tune` write and verify, cheap enough
// to write and check at drive speed: each 4 KiB sector starts with a 16-byte header (file,
// generation, offset) and carries a per-generation body. Every byte is checked: the header
// exactly, the body with memcmp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace zinf::tools {

inline constexpr std::size_t kPatternSector = 4096;

/// Writes the generation's body into every sector of `buf` (headers are stamped separately).
void fill_bulk(std::span<std::byte> buf, std::uint32_t generation);
/// Stamps each sector header of `buf`, which will land at `offset` of file `file`.
void stamp_headers(std::span<std::byte> buf, std::uint32_t file, std::uint64_t offset,
                   std::uint32_t generation);
/// Returns "" if `buf` is exactly what fill_bulk + stamp_headers wrote, else what differs.
std::string verify_block(std::span<const std::byte> buf, std::uint32_t file, std::uint64_t offset,
                         std::uint32_t generation);

}  // namespace zinf::tools
