// SPDX-License-Identifier: Apache-2.0
// How `zinf tune` picks its answer from repeated measurements: a setting replaces zinf's
// default only if it beats the default by more than the noise both were measured with, so that
// a 1% "win" on a shared machine does not change a user's config. Pure functions of the figures,
// so the rule is tested on synthetic measurements.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace zinf::tools::tune {

/// The figures of one setting's repeated passes.
struct Measured {
  double median_gbps = 0;
  /// max - min of its passes (0 for a single pass).
  double spread_gbps = 0;
  std::size_t passes = 0;
};

/// Builds a Measured from the per-pass figures.
Measured measured(const std::vector<double>& runs);

/// What choose() decided.
struct Choice {
  std::size_t chosen = 0;      ///< index of the setting to use
  std::size_t best = 0;        ///< the highest median measured twice (the default on a tie)
  double margin_gbps = 0;      ///< best's median - the default's
  double noise_gbps = 0;       ///< the larger of the two spreads
  bool beats_default = false;  ///< chosen != default because margin > noise
};

/// Picks among `settings`, `default_index` being zinf's default. The best is the highest
/// median of the default and the settings measured at least twice (one pass has no spread to
/// judge it by); ties go to the default, then to the earlier setting. It replaces the default
/// only if its median beats the default's by more than the larger of the two spreads;
/// otherwise the default is chosen. Needs default_index < settings.size().
Choice choose(const std::vector<Measured>& settings, std::size_t default_index);

/// The line that states the outcome, e.g. "uring 1M qd16 beats the default (threads 1M qd16
/// t16) by 0.40 GB/s (12.0%), more than the spread 0.10 GB/s: chosen".
std::string choice_line(const Choice& c, const std::vector<Measured>& settings,
                        const std::vector<std::string>& names, std::size_t default_index);

}  // namespace zinf::tools::tune
