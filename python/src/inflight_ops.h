// SPDX-License-Identifier: Apache-2.0
// InflightOps: the bookkeeping of an aio handle's asynchronous operations (aio_handle.cc) when
// several threads submit and wait on one handle, as DeepSpeed's swappers do. Kept apart from
// the pybind11 code (only the standard library) so that a unit test runs it under TSan.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <set>
#include <utility>
#include <vector>

namespace zinf::python {

/// Operations submitted and not yet finished, each numbered in submission order. A waiter
/// claims every operation nobody has claimed yet, finishes them (outside the lock), reports
/// them finished, and then blocks until every operation submitted before its claim has been
/// finished, by it or by another waiter. So a wait() returns only once the operations its
/// thread submitted before it are complete, whoever completed them, and an operation (with
/// whatever it keeps alive) is dropped only by the waiter that finished it. Thread-safe.
template <class Op>
class InflightOps {
 public:
  /// What claim() hands a waiter: its operations with their numbers, and the number of the
  /// first operation submitted after the claim (what wait_finished() waits up to).
  struct Claim {
    std::vector<std::pair<std::uint64_t, Op>> ops;
    std::uint64_t upto = 0;
  };

  /// Adds `op`, unfinished until finished() is called with its number; returns the number.
  std::uint64_t add(Op op) {
    std::lock_guard lk(mu_);
    const std::uint64_t n = next_++;
    unclaimed_.emplace_back(n, std::move(op));
    unfinished_.insert(n);
    return n;
  }

  /// Takes every operation not claimed yet (none, if another waiter took them).
  Claim claim() {
    std::lock_guard lk(mu_);
    Claim c;
    c.ops = std::move(unclaimed_);
    unclaimed_.clear();
    c.upto = next_;
    return c;
  }

  /// Reports the claimed operations numbered `numbers` finished.
  void finished(const std::vector<std::uint64_t>& numbers) {
    {
      std::lock_guard lk(mu_);
      for (const std::uint64_t n : numbers) unfinished_.erase(n);
    }
    cv_.notify_all();
  }

  /// Blocks until every operation numbered below `upto` is finished.
  void wait_finished(std::uint64_t upto) {
    std::unique_lock lk(mu_);
    cv_.wait(lk, [&] { return unfinished_.empty() || *unfinished_.begin() >= upto; });
  }

  /// Operations added and not finished yet.
  std::size_t unfinished() const {
    std::lock_guard lk(mu_);
    return unfinished_.size();
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::uint64_t next_ = 0;
  std::vector<std::pair<std::uint64_t, Op>> unclaimed_;
  std::set<std::uint64_t> unfinished_;
};

}  // namespace zinf::python
