// SPDX-License-Identifier: Apache-2.0
// "Did you mean": the nearest known word to a mistyped one, for the messages that refuse an
// unknown config key or command-line option. Part of zinf::common.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace zinf {

/// Levenshtein distance: the fewest single-character insertions, deletions and substitutions
/// that turn `a` into `b`. O(|a| * |b|) time and O(|b|) memory: meant for words, so callers
/// bound the length of input from outside before asking.
std::size_t edit_distance(std::string_view a, std::string_view b);

/// How many edits still count as a typo of `word` rather than another word: 2, or
/// word.size() / `per_edit` where that is more (one edit per `per_edit` characters).
constexpr std::size_t typo_distance(std::string_view word, std::size_t per_edit) noexcept {
  const std::size_t proportional = per_edit == 0 ? 0 : word.size() / per_edit;
  return proportional > 2 ? proportional : 2;
}

/// The candidate nearest to `word` by edit_distance, the first in order among equals, or ""
/// when even that one is more than `max_distance` edits away (nothing close enough to
/// suggest). The result views the chosen candidate's characters. A candidate whose length
/// differs from `word`'s by more than `max_distance` is skipped without computing anything, so
/// a word far longer than every candidate costs nothing.
std::string_view closest_match(std::string_view word, std::span<const std::string_view> candidates,
                               std::size_t max_distance);
/// The same over owned strings.
std::string_view closest_match(std::string_view word, std::span<const std::string> candidates,
                               std::size_t max_distance);

}  // namespace zinf
