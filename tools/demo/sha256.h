// SPDX-License-Identifier: Apache-2.0
// SHA-256 (FIPS 180-4), written from the standard, for the fingerprints the zinf tool prints
// (`zinf demo`'s weights_sha256). Incremental: update() any number of times, then finish().
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace zinf::tools {

/// An incremental SHA-256. Not thread-safe; one message per object.
class Sha256 {
 public:
  using Digest = std::array<std::uint8_t, 32>;

  Sha256() noexcept;
  /// Appends `bytes` to the message. UsageError if called after finish().
  void update(std::span<const std::byte> bytes);
  /// Appends the bytes of `text`.
  void update(std::string_view text);
  /// Pads the message and returns its digest; the object then accepts no more input.
  /// UsageError if called twice.
  Digest finish();

 private:
  void compress(const std::uint8_t* block) noexcept;

  std::array<std::uint32_t, 8> state_;
  std::array<std::uint8_t, 64> block_{};
  std::size_t block_used_ = 0;
  std::uint64_t message_bytes_ = 0;
  bool finished_ = false;
};

/// Returns the digest as 64 lower-case hex digits.
std::string to_hex(const Sha256::Digest& digest);
/// Returns the hex SHA-256 of `text` (one call).
std::string sha256_hex(std::string_view text);

}  // namespace zinf::tools
