// SPDX-License-Identifier: Apache-2.0
// RangeAllocator: first-fit allocation of unit ranges from [0, total) over a sorted free list
// with coalescing. Private to zinf::swap; BufferPool carves its arena with it and SwapStore its
// striped address space. Not thread-safe: the owner locks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace zinf::swap::detail {

/// A run of units [start, start + length).
struct UnitRange {
  std::uint64_t start = 0;
  std::uint64_t length = 0;
  std::uint64_t end() const noexcept { return start + length; }
};

class RangeAllocator {
 public:
  /// Starts with every unit of [0, total) free.
  explicit RangeAllocator(std::uint64_t total);

  /// Returns the start of the lowest free run of `n` units (n > 0) whose start is a multiple of
  /// `align`, or nothing if none fits. Throws std::bad_alloc only when it must grow its list.
  std::optional<std::uint64_t> allocate(std::uint64_t n, std::uint64_t align = 1);

  /// Takes `n` units from the lowest free runs, splitting the last one: for callers that can use
  /// scattered pieces. Returns nothing (and takes nothing) if fewer than `n` units are free.
  std::optional<std::vector<UnitRange>> allocate_scattered(std::uint64_t n);

  /// Returns a run to the free list, merging it with free neighbours. A run that overlaps free
  /// units is a caller bug (ZINF_CHECK). Never allocates if reserve_for(live) was called with
  /// live >= the number of runs allocated now (a free list never holds more than live + 1 runs).
  void free(std::uint64_t start, std::uint64_t n);

  /// Makes room so that free() cannot allocate while at most `live` runs are outstanding.
  void reserve_for(std::size_t live) { free_.reserve(live + 1); }

  std::uint64_t total_units() const noexcept { return total_; }
  std::uint64_t free_units() const noexcept { return free_units_; }
  /// The longest free run (0 when full).
  std::uint64_t largest_free_run() const noexcept;
  std::size_t free_run_count() const noexcept { return free_.size(); }

 private:
  void take(std::size_t index, std::uint64_t start, std::uint64_t n);

  std::uint64_t total_;
  std::uint64_t free_units_;
  std::vector<UnitRange> free_;  // sorted by start, disjoint, never adjacent (always coalesced)
};

}  // namespace zinf::swap::detail
