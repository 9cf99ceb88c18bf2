// SPDX-License-Identifier: Apache-2.0
// SHA-256 for the fingerprints the zinf tool prints (`zinf demo`'s weights_sha256), computed by
// Nettle (nettle-dev): a maintained, tested implementation rather than one of our own.
// Incremental: update() any number of times, then finish(). Nettle stays private to
// sha256.cc, so users of this header need only the C++ standard library.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

struct sha256_ctx;  // Nettle's state (<nettle/sha2.h>), allocated by Sha256

namespace zinf::tools {

/// An incremental SHA-256 (FIPS 180-4). Not thread-safe; one message per object.
class Sha256 {
 public:
  using Digest = std::array<std::uint8_t, 32>;

  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  /// Appends `bytes` to the message. UsageError if called after finish().
  void update(std::span<const std::byte> bytes);
  /// Appends the bytes of `text`.
  void update(std::string_view text);
  /// Pads the message and returns its digest; the object then accepts no more input.
  /// UsageError if called twice.
  Digest finish();

 private:
  std::unique_ptr<sha256_ctx> ctx_;
  bool finished_ = false;
};

/// Returns the digest as 64 lower-case hex digits.
std::string to_hex(const Sha256::Digest& digest);
/// Returns the hex SHA-256 of `text` (one call).
std::string sha256_hex(std::string_view text);

}  // namespace zinf::tools
