// SPDX-License-Identifier: Apache-2.0
// `zinf stress`'s optimizer worker.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "tally.h"
#include "worker.h"

namespace zinf::tools::stress {

/// Steps an NVMe-offloaded optimizer against an in-memory CpuAdam, bitwise, after every step
/// (optimizer_worker.cc).
class OptimizerWorker {
 public:
  explicit OptimizerWorker(const Shared& sh);
  ~OptimizerWorker();
  OptimizerWorker(const OptimizerWorker&) = delete;
  OptimizerWorker& operator=(const OptimizerWorker&) = delete;

  void run();
  Tally& tally();
  /// The optimizer's pinned memory at its peak, over every optimizer built.
  std::uint64_t pinned_peak() const;
  /// Device memory the worker holds for its gradients, whatever the seed.
  static std::uint64_t device_bytes();

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zinf::tools::stress
