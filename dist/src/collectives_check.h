// SPDX-License-Identifier: Apache-2.0
// What every Collectives backend shares: the argument checks (so that every backend refuses
// the same misuse with the same words), the CollectiveError text, the average computed on the
// host, and the failed state a cross-rank error leaves behind. Private to zinf::dist.
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "zinf/common/status.h"
#include "zinf/dist/collectives.h"

namespace zinf::dist::detail {

/// Who is calling, for messages: "<op> (rank R of N, backend B)".
struct Caller {
  std::string_view backend;
  int rank;
  int size;
};

/// Throws UsageError unless recv.size() == send.size() * size and `send` is either recv's block
/// `rank` or does not overlap recv.
void check_all_gather(const Caller& who, std::span<const std::byte> send,
                      std::span<const std::byte> recv);
/// Throws UsageError unless send.size() == recv.size() * size, recv is whole elements, the two
/// do not overlap and `op` suits `type`.
void check_reduce_scatter(const Caller& who, std::span<const std::byte> send,
                          std::span<const std::byte> recv, ElementType type, ReduceOp op);
/// Throws UsageError unless data is whole elements and `op` suits `type`.
void check_all_reduce(const Caller& who, std::span<const std::byte> data, ElementType type,
                      ReduceOp op);
/// Throws UsageError unless root is in [0, size).
void check_broadcast(const Caller& who, int root);

/// The CollectiveError for `op` on `who` with this rank's `bytes`: message
/// "rank R of N: <detail>", code `code` (kTimedOut for a timeout, kIo otherwise).
CollectiveError collective_error(const Caller& who, std::string_view op, std::size_t bytes,
                                 ErrorCode code, const std::string& detail);

/// Divides each element of host memory `data` by `divisor` (kAvg computed as a sum first;
/// floating types only, checked before).
void divide_in_place(std::span<std::byte> data, ElementType type, int divisor);

/// The failed state of a backend after a cross-rank error (the Collectives contract).
class FailedState {
 public:
  /// Throws EngineFailed quoting the first failure, if there was one.
  void throw_if_failed() const;
  /// Records `status` unless a failure is already recorded.
  void fail(const Status& status);
  bool failed() const noexcept { return cause_.has_value(); }

 private:
  std::optional<Status> cause_;
};

}  // namespace zinf::dist::detail
