// SPDX-License-Identifier: Apache-2.0
// What the stress workers share: the run they belong to, their fault plans, engines and stores,
// and how an operation's outcome is judged against the faults injected into it.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "interrupt.h"
#include "options.h"
#include "tally.h"
#include "zinf/common/error.h"
#include "zinf/common/status.h"
#include "zinf/cuda/device.h"
#include "zinf/swap/buffer_pool.h"
#include "zinf/swap/fault_injection.h"
#include "zinf/swap/io_engine.h"
#include "zinf/swap/swap_store.h"

namespace zinf::tools::stress {

using Clock = std::chrono::steady_clock;

/// What every worker reads; set up by stress_main before the threads start.
struct Shared {
  const StressOptions* cfg = nullptr;
  Clock::time_point deadline;
  // Until the deadline, or a signal (the workers then finish their operation in hand and
  // return; stress_main stops without a report).
  bool running() const { return Clock::now() < deadline && !interrupted(); }
  std::vector<std::string> store_dirs;  // cfg.dirs, doubled when there is only one
  swap::BufferPool* swap_pool = nullptr;
  std::uint64_t max_tensor = 0;
  std::uint64_t opt_budget = 0;
  std::uint64_t prefetch_budget = 0;
  /// The device both device-side workers use (thread-safe; each makes its own streams), and
  /// the device memory the prefetch window may hold (the optimizer's gradients take the rest).
  cuda::Device* device = nullptr;
  std::uint64_t prefetch_device_bytes = 0;
  /// Bytes verified so far by every worker, read by the sampler of the rate over time.
  std::atomic<std::uint64_t>* verified_live = nullptr;
  void verified(std::uint64_t bytes) const {
    if (verified_live != nullptr) verified_live->fetch_add(bytes, std::memory_order_relaxed);
  }
};

/// The faults `plan` injected so far, by kind (none for a null plan).
FaultCounts counts_of(const swap::FaultPlan* plan);
/// The mix of faults at `rate` per piece attempt (see worker.cc); null for rate 0.
std::shared_ptr<swap::FaultPlan> make_plan(double rate, std::uint64_t seed);

// An operation's failure as the caller saw it.
struct OpError {
  bool failed = false;
  ErrorCode code = ErrorCode::kOk;
  std::string text;
};

OpError error_of(const Status& st);
/// From a catch block only: the code comes from the exception being handled.
OpError error_of(const std::exception& e);

/// Judges one operation `what` by the hard faults injected while it ran (`delta`) and the
/// error it returned, into `t` (see worker.cc).
void judge_operation(Tally& t, const std::string& what, const FaultCounts& delta,
                     const OpError& err);

/// A worker's engine options: --engine, small pieces, and its fault plan.
swap::IoOptions io_options(const StressOptions& cfg, std::shared_ptr<swap::FaultPlan> plan);

inline constexpr std::uint32_t kStripe = 64u << 10;

/// A worker's own swap store of `capacity` bytes over the run's directories.
std::unique_ptr<swap::SwapStore> make_store(const Shared& sh, swap::IoEngine& engine,
                                            std::uint64_t capacity);

// Runs `body` and turns anything it throws into a problem of `tally` (a worker must never take
// the process down, and an exception that escapes is itself a finding).
template <typename Body>
void guarded(Tally& tally, const char* who, Body body) {
  try {
    body();
  } catch (const std::exception& e) {
    ++tally.unexpected_errors;
    tally.problem(std::string(who) + " stopped: " + e.what());
  }
}

}  // namespace zinf::tools::stress
