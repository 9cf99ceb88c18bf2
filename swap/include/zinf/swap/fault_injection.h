// SPDX-License-Identifier: Apache-2.0
// FaultPlan: deterministic faults applied to raw piece results inside an IoEngine backend, for
// tests and `zinf stress`. Part of zinf::swap.
//
// Why inside the backend rather than a decorator over IoEngine: the code that must be proven is
// each backend's own handling of EIO, ENOSPC, short transfers and EAGAIN storms. A decorator
// above the interface could only fake their end results and would never run that code.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <vector>

#include "zinf/swap/io_engine.h"

namespace zinf::swap {

/// An attempt is a piece's first submission or the resubmission of its remainder after a
/// short transfer; EINTR/EAGAIN retries of an attempt do not consult the plan again.
enum class FaultKind : std::uint8_t {
  kError,   ///< the attempt fails with `err` (EIO, ENOSPC, ...) without doing any I/O, for
            ///< reads and writes alike: nothing is transferred
  kShort,   ///< the I/O is done in full but only `short_bytes` are reported done; the backend
            ///< must resubmit the rest (from the aligned point below, for O_DIRECT files).
            ///< short_bytes 0 reports zero bytes: the request fails with kShortTransfer
  kEagain,  ///< the attempt reports -EAGAIN `count` times in a row (no I/O) before going
            ///< through; beyond IoOptions::max_eagain_retries the request fails (kTimedOut)
  kDelay,   ///< the attempt's completion is delayed by `delay` after its I/O is done
};

/// One rule. A piece matches when its op, file and offset fall in the rule's filter; the rule
/// fires on the matching pieces numbered [first_match, first_match + times) (0-based), or on
/// each matching piece with probability `probability` when that is > 0 (seeded, reproducible).
struct FaultRule {
  FaultKind kind = FaultKind::kError;
  std::optional<IoOp> op;          ///< unset: reads and writes
  std::optional<FileId> file;      ///< unset: every file
  std::uint64_t offset_begin = 0;  ///< piece offset in [offset_begin, offset_end)
  std::uint64_t offset_end = ~std::uint64_t{0};
  std::uint64_t first_match = 0;
  std::uint64_t times = 1;
  double probability = 0.0;
  int err = 5;                         ///< EIO
  std::uint32_t short_bytes = 0;       ///< kShort: bytes reported done (rounded down to 512)
  std::uint32_t count = 1;             ///< kEagain: consecutive EAGAINs
  std::chrono::microseconds delay{0};  ///< kDelay
};

/// What happened to one piece, decided by FaultPlan::decide.
struct FaultDecision {
  bool fired = false;
  FaultKind kind = FaultKind::kError;
  int err = 0;
  std::uint32_t short_bytes = 0;
  std::uint32_t eagain_count = 0;
  std::chrono::microseconds delay{0};
};

/// A set of rules plus counters. Thread-safe; shared by the engine and the test that reads
/// the counters.
struct FaultPlan {
  explicit FaultPlan(std::vector<FaultRule> rules = {}, std::uint64_t seed = 1);

  /// Called by a backend once per piece attempt with the op, file and the attempt's offset.
  /// When several rules match, each counts the match and the first (in order) that fires decides.
  FaultDecision decide(IoOp op, FileId file, std::uint64_t offset);

  std::uint64_t injected() const noexcept { return injected_.load(); }
  std::uint64_t injected_errors() const noexcept { return injected_errors_.load(); }
  std::uint64_t seed() const noexcept { return seed_; }
  /// Times rule `index` (in construction order) has decided a piece attempt, i.e. its faults
  /// injected so far; 0 for an index past the rules. For callers that count faults by kind
  /// (`zinf stress`: one rule per kind). Thread-safe.
  std::uint64_t fired(std::size_t index) const;

 private:
  mutable std::mutex mu_;
  std::vector<FaultRule> rules_;
  std::vector<std::uint64_t> fired_;
  std::vector<std::uint64_t> matches_;
  std::uint64_t seed_;
  std::uint64_t rng_state_;
  std::atomic<std::uint64_t> injected_{0};
  std::atomic<std::uint64_t> injected_errors_{0};
};

}  // namespace zinf::swap
