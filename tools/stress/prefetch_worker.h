// SPDX-License-Identifier: Apache-2.0
// `zinf stress`'s prefetch worker.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "tally.h"
#include "worker.h"

namespace zinf::tools::stress {

/// Reads layers through a LayerPrefetcher and checks every acquired byte, with faults judged
/// per segment (prefetch_worker.cc).
class PrefetchWorker {
 public:
  explicit PrefetchWorker(const Shared& sh);
  ~PrefetchWorker();
  PrefetchWorker(const PrefetchWorker&) = delete;
  PrefetchWorker& operator=(const PrefetchWorker&) = delete;

  void run();
  Tally& tally();
  /// The prefetcher's staging arena, reserved whole.
  std::uint64_t staging_bytes() const;
  /// The most the prefetcher held at once, over every segment.
  std::uint64_t peak_held() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zinf::tools::stress
