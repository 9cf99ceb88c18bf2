// SPDX-License-Identifier: Apache-2.0
// UnitSums: the CRC32C of each stripe unit of one buffer, summed from pieces that threads
// add in any order, for a caller that folds the swap store's checksums into its own pass over
// the bytes (SwapStore::swap_in_unchecked / swap_out_summed). Part of zinf::swap.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <span>
#include <vector>

namespace zinf::swap {

class UnitSums {
 public:
  /// Starts over for a buffer of `bytes` (> 0) cut into units of `unit_bytes` (> 0; the last
  /// unit may be shorter), keeping the memory of earlier rounds. `pieces_hint` reserves room
  /// for that many add() pieces so that add() does not allocate while threads wait on it.
  /// Not thread-safe (call between rounds).
  void reset(std::uint64_t bytes, std::uint64_t unit_bytes, std::size_t pieces_hint = 0);
  /// Sums buffer bytes [offset, offset + length), which start at base + offset, split at
  /// unit boundaries. Every byte of the buffer must be added exactly once per round, by any
  /// thread, in any order. Thread-safe; the CRC work runs outside the lock.
  void add(const std::byte* base, std::uint64_t offset, std::uint64_t length);
  /// Joins the pieces and returns each unit's CRC32C (valid until the next reset). Throws
  /// zinf::Error if the pieces did not cover the buffer exactly once (a bug of the caller's:
  /// a sum over a gap or overlap would later read as corruption). Not thread-safe with add.
  std::span<const std::uint32_t> finish();

 private:
  struct Piece {
    std::uint64_t offset;
    std::uint64_t length;
    std::uint32_t crc;
  };
  std::uint64_t bytes_ = 0;
  std::uint64_t unit_ = 0;
  std::mutex mu_;
  std::vector<Piece> pieces_;  // guarded by mu_
  std::vector<std::uint32_t> sums_;
};

}  // namespace zinf::swap
