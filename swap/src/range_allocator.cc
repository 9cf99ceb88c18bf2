// SPDX-License-Identifier: Apache-2.0
// First-fit range allocation with coalescing. The free list is a sorted vector: the owners hold
// at most a few thousand live runs, where a linear scan beats a tree and, unlike a tree, lets
// free() be made allocation-free by reserving ahead (BufferPool releases from noexcept paths).
#include "range_allocator.h"

#include <algorithm>

#include "zinf/common/align.h"
#include "zinf/common/check.h"

namespace zinf::swap::detail {

RangeAllocator::RangeAllocator(std::uint64_t total) : total_(total), free_units_(total) {
  if (total > 0) free_.push_back({0, total});
}

void RangeAllocator::take(std::size_t index, std::uint64_t start, std::uint64_t n) {
  UnitRange r = free_[index];
  UnitRange head{r.start, start - r.start};
  UnitRange tail{start + n, r.end() - (start + n)};
  if (head.length > 0 && tail.length > 0) {
    free_[index] = head;
    free_.insert(free_.begin() + static_cast<std::ptrdiff_t>(index) + 1, tail);
  } else if (head.length > 0) {
    free_[index] = head;
  } else if (tail.length > 0) {
    free_[index] = tail;
  } else {
    free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(index));
  }
  free_units_ -= n;
}

std::optional<std::uint64_t> RangeAllocator::allocate(std::uint64_t n, std::uint64_t align) {
  ZINF_CHECK(n > 0 && align > 0, "RangeAllocator::allocate of zero units or zero alignment");
  if (n > free_units_) return std::nullopt;
  for (std::size_t i = 0; i < free_.size(); ++i) {
    const UnitRange& r = free_[i];
    const std::uint64_t start = align_up(r.start, align);
    if (start < r.end() && r.end() - start >= n) {
      // Grow before changing anything, so a bad_alloc leaves the list as it was.
      if (free_.size() == free_.capacity()) free_.reserve(free_.size() * 2 + 1);
      take(i, start, n);
      return start;
    }
  }
  return std::nullopt;
}

std::optional<std::vector<UnitRange>> RangeAllocator::allocate_scattered(std::uint64_t n) {
  ZINF_CHECK(n > 0, "RangeAllocator::allocate_scattered of zero units");
  if (n > free_units_) return std::nullopt;
  std::vector<UnitRange> out;
  std::uint64_t left = n;
  for (const UnitRange& r : free_) {
    std::uint64_t take_n = std::min(left, r.length);
    out.push_back({r.start, take_n});
    left -= take_n;
    if (left == 0) break;
  }
  // Whole runs are removed from the front; only the last piece may split (shrink) a run.
  std::size_t whole = 0;
  while (whole < out.size() && out[whole].length == free_[whole].length) ++whole;
  if (whole < out.size()) {
    free_[whole].start += out[whole].length;
    free_[whole].length -= out[whole].length;
  }
  free_.erase(free_.begin(), free_.begin() + static_cast<std::ptrdiff_t>(whole));
  free_units_ -= n;
  return out;
}

void RangeAllocator::free(std::uint64_t start, std::uint64_t n) {
  ZINF_CHECK(n > 0 && start + n <= total_ && start + n > start,
             "RangeAllocator::free out of range");
  auto next = std::lower_bound(free_.begin(), free_.end(), start,
                               [](const UnitRange& r, std::uint64_t s) { return r.start < s; });
  bool merge_prev = false;
  if (next != free_.begin()) {
    const UnitRange& prev = *(next - 1);
    ZINF_CHECK(prev.end() <= start, "RangeAllocator::free of units that are already free");
    merge_prev = prev.end() == start;
  }
  bool merge_next = false;
  if (next != free_.end()) {
    ZINF_CHECK(start + n <= next->start, "RangeAllocator::free of units that are already free");
    merge_next = start + n == next->start;
  }
  if (merge_prev && merge_next) {
    (next - 1)->length += n + next->length;
    free_.erase(next);
  } else if (merge_prev) {
    (next - 1)->length += n;
  } else if (merge_next) {
    next->start = start;
    next->length += n;
  } else {
    free_.insert(next, UnitRange{start, n});
  }
  free_units_ += n;
}

std::uint64_t RangeAllocator::largest_free_run() const noexcept {
  std::uint64_t best = 0;
  for (const UnitRange& r : free_) best = std::max(best, r.length);
  return best;
}

}  // namespace zinf::swap::detail
