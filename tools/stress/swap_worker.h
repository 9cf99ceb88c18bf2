// SPDX-License-Identifier: Apache-2.0
// `zinf stress`'s swap worker.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "tally.h"
#include "worker.h"

namespace zinf::tools::stress {

/// Swaps random-size tensors and ranges of them out and in through its own engine and store,
/// one operation at a time, checking every byte read back (swap_worker.cc).
class SwapWorker {
 public:
  SwapWorker(const Shared& sh, std::size_t index);
  ~SwapWorker();
  SwapWorker(const SwapWorker&) = delete;
  SwapWorker& operator=(const SwapWorker&) = delete;

  /// Until sh.running() says stop; a throw is caught by guarded().
  void run();
  Tally& tally();
  std::string engine_name() const;
  /// With --plant-corruption, what worker 0 flipped; "" otherwise.
  const std::string& planted() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zinf::tools::stress
