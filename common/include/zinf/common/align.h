// SPDX-License-Identifier: Apache-2.0
// Rounding sizes and offsets to a multiple of an alignment (blocks, stripes, pages). The one
// copy every layer uses, so that the overflow rule below is the same everywhere. Part of
// zinf::common.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>

#include "zinf/common/check.h"

namespace zinf {

/// `value` rounded up to a multiple of `alignment`, or nullopt when that multiple does not fit
/// in a uint64 (a size from outside, such as a budget or a tensor's bytes, can be that large).
/// `alignment` need not be a power of two but must be > 0 (a bug otherwise: ZINF_CHECK).
constexpr std::optional<std::uint64_t> checked_align_up(std::uint64_t value,
                                                        std::uint64_t alignment) noexcept {
  ZINF_CHECK(alignment > 0, "checked_align_up: alignment 0");
  const std::uint64_t rest = value % alignment;
  if (rest == 0) return value;
  const std::uint64_t up = alignment - rest;
  if (value > std::numeric_limits<std::uint64_t>::max() - up) return std::nullopt;
  return value + up;
}

/// `value` rounded up to a multiple of `alignment` (> 0). For sizes the caller has already
/// bounded: a result that would not fit in a uint64 is a bug and aborts (ZINF_CHECK) rather
/// than wrapping to a small number; use checked_align_up() for sizes from outside.
constexpr std::uint64_t align_up(std::uint64_t value, std::uint64_t alignment) noexcept {
  const std::optional<std::uint64_t> up = checked_align_up(value, alignment);
  ZINF_CHECK(up.has_value(), "align_up: the rounded value does not fit in 64 bits");
  return *up;
}

/// `value` rounded down to a multiple of `alignment` (> 0). Never overflows.
constexpr std::uint64_t align_down(std::uint64_t value, std::uint64_t alignment) noexcept {
  ZINF_CHECK(alignment > 0, "align_down: alignment 0");
  return value - value % alignment;
}

/// True when `value` is a multiple of `alignment` (> 0).
constexpr bool is_aligned(std::uint64_t value, std::uint64_t alignment) noexcept {
  ZINF_CHECK(alignment > 0, "is_aligned: alignment 0");
  return value % alignment == 0;
}

}  // namespace zinf
