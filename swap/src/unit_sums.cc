// SPDX-License-Identifier: Apache-2.0
// Pieces are summed where they are added (the bytes are hot in the adding thread's cache) and
// only joined at the end, with crc32c_combine, which needs the CRCs and lengths, not the bytes.
#include "zinf/swap/unit_sums.h"

#include <algorithm>
#include <string>

#include "zinf/common/error.h"
#include "zinf/swap/crc32c.h"

namespace zinf::swap {

void UnitSums::reset(std::uint64_t bytes, std::uint64_t unit_bytes, std::size_t pieces_hint) {
  if (bytes == 0 || unit_bytes == 0) {
    throw UsageError("UnitSums: a buffer of " + std::to_string(bytes) + " bytes in units of " +
                     std::to_string(unit_bytes));
  }
  bytes_ = bytes;
  unit_ = unit_bytes;
  pieces_.clear();
  pieces_.reserve(pieces_hint + (bytes + unit_bytes - 1) / unit_bytes);
  sums_.clear();
}

void UnitSums::add(const std::byte* base, std::uint64_t offset, std::uint64_t length) {
  while (length > 0) {
    const std::uint64_t n = std::min(length, unit_ - offset % unit_);
    const std::uint32_t crc = crc32c(std::span<const std::byte>(base + offset, n));
    {
      std::lock_guard lock(mu_);
      pieces_.push_back(Piece{offset, n, crc});
    }
    offset += n;
    length -= n;
  }
}

std::span<const std::uint32_t> UnitSums::finish() {
  std::sort(pieces_.begin(), pieces_.end(),
            [](const Piece& a, const Piece& b) { return a.offset < b.offset; });
  sums_.assign((bytes_ + unit_ - 1) / unit_, 0);
  std::uint64_t covered = 0;  // bytes [0, covered) are summed
  for (const Piece& p : pieces_) {
    if (p.offset != covered) {
      throw Error("UnitSums: " + std::string(p.offset < covered ? "overlapping" : "missing") +
                  " bytes at offset " + std::to_string(std::min(p.offset, covered)) +
                  " of a " + std::to_string(bytes_) + "-byte buffer");
    }
    std::uint32_t& sum = sums_[p.offset / unit_];
    sum = p.offset % unit_ == 0 ? p.crc : crc32c_combine(sum, p.crc, p.length);
    covered += p.length;
  }
  if (covered != bytes_) {
    throw Error("UnitSums: missing bytes at offset " + std::to_string(covered) + " of a " +
                std::to_string(bytes_) + "-byte buffer");
  }
  return sums_;
}

}  // namespace zinf::swap
