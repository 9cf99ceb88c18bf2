// SPDX-License-Identifier: Apache-2.0
// The state behind an IoTicket: what the ticket's holder waits on and the completer fills in.
// Shared by the IoEngine backends (whose batches extend it with their requests) and SwapStore
// (whose swap tickets complete over several engine batches), so that neither reaches into the
// other's internals. Private to zinf::swap.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>

#include "zinf/common/status.h"
#include "zinf/swap/io_engine.h"

namespace zinf::swap::detail {

/// The shared state behind an IoTicket.
///
/// Completion protocol: whoever finishes the work records completed_at, runs the callback,
/// then sets `done` under `mu` and notifies, so a waiter released by wait() knows that the
/// callback has returned.
struct TicketState {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;                   // guarded by mu
  Status status;                       // first failure; guarded by mu
  std::atomic<bool> done_flag{false};  // poll() without the lock
  std::atomic<std::int64_t> completed_at_ns{kNotCompleted};
  std::atomic<std::uint64_t> bytes_done{0};
  std::atomic<std::uint64_t> pieces_left{0};
  IoCallback callback;

  static constexpr std::int64_t kNotCompleted = INT64_MIN;

  /// Keeps `failure` if it is the ticket's first.
  void record_failure(const Status& failure);
  /// Marks the ticket complete (the caller finished its last piece of work). Never throws.
  void complete() noexcept;
};

}  // namespace zinf::swap::detail
