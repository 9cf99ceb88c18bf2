// SPDX-License-Identifier: Apache-2.0
// Edit distance and the nearest-candidate search behind every "did you mean".
#include "zinf/common/suggest.h"

#include <algorithm>
#include <vector>

namespace zinf {
namespace {

template <typename Candidate>
std::string_view closest_in(std::string_view word, std::span<const Candidate> candidates,
                            std::size_t max_distance) {
  std::string_view best;
  std::size_t best_distance = 0;
  bool found = false;
  for (const Candidate& c : candidates) {
    const std::string_view candidate(c);
    // A length difference alone is that many edits: too far, without filling the table. This
    // also bounds the cost of a hostile word of megabytes to nothing.
    const std::size_t gap = candidate.size() > word.size() ? candidate.size() - word.size()
                                                           : word.size() - candidate.size();
    if (gap > max_distance) continue;
    const std::size_t d = edit_distance(word, candidate);
    if (d <= max_distance && (!found || d < best_distance)) {
      best = candidate;
      best_distance = d;
      found = true;
    }
  }
  return best;
}

}  // namespace

std::size_t edit_distance(std::string_view a, std::string_view b) {
  // One row of the table and the diagonal cell it is about to overwrite.
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t above = row[j];
      const std::size_t substitute = diagonal + (a[i - 1] == b[j - 1] ? 0 : 1);
      row[j] = std::min({above + 1, row[j - 1] + 1, substitute});
      diagonal = above;
    }
  }
  return row[b.size()];
}

std::string_view closest_match(std::string_view word, std::span<const std::string_view> candidates,
                               std::size_t max_distance) {
  return closest_in(word, candidates, max_distance);
}

std::string_view closest_match(std::string_view word, std::span<const std::string> candidates,
                               std::size_t max_distance) {
  return closest_in(word, candidates, max_distance);
}

}  // namespace zinf
