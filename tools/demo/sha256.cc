// SPDX-License-Identifier: Apache-2.0
// Sha256 over Nettle's sha256_* functions.
#include "sha256.h"

#include <nettle/sha2.h>

#include <cstdint>
#include <string>

#include "zinf/common/error.h"

namespace zinf::tools {

Sha256::Sha256() : ctx_(std::make_unique<sha256_ctx>()) { sha256_init(ctx_.get()); }

Sha256::~Sha256() = default;

void Sha256::update(std::span<const std::byte> bytes) {
  if (finished_) throw UsageError("Sha256::update after finish()");
  sha256_update(ctx_.get(), bytes.size(), reinterpret_cast<const std::uint8_t*>(bytes.data()));
}

void Sha256::update(std::string_view text) {
  update(std::as_bytes(std::span<const char>(text.data(), text.size())));
}

Sha256::Digest Sha256::finish() {
  if (finished_) throw UsageError("Sha256::finish called twice");
  finished_ = true;
  Digest out;
  // sha256_digest also resets the context; finished_ keeps it from being fed again.
  sha256_digest(ctx_.get(), out.size(), out.data());
  return out;
}

std::string to_hex(const Sha256::Digest& digest) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s;
  s.reserve(64);
  for (std::uint8_t b : digest) {
    s += kDigits[b >> 4];
    s += kDigits[b & 15];
  }
  return s;
}

std::string sha256_hex(std::string_view text) {
  Sha256 h;
  h.update(text);
  return to_hex(h.finish());
}

}  // namespace zinf::tools
