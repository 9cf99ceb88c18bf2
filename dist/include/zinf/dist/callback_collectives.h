// SPDX-License-Identifier: Apache-2.0
// The callback adapter: Collectives over primitives the caller already has, given as
// std::function (a torch.distributed process group on gloo, a test's threads). Emulates
// reduce_scatter with all_reduce where the caller has none, and averages on the host where the
// caller's all_reduce cannot. Part of zinf::dist (docs/distributed.md).
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>

#include "zinf/dist/collectives.h"

namespace zinf::dist {

/// The caller's primitives and its place in the group. Each callback has the meaning of the
/// Collectives call of the same name, must block until its result is in place, and signals a
/// failure by throwing (anything; see make_callback_collectives). The adapter checks every
/// call's arguments before it calls a callback, so a callback sees only well-formed requests.
struct CollectiveCallbacks {
  int rank = 0;                   ///< this process's rank, 0 <= rank < size
  int size = 1;                   ///< ranks in the group
  std::string name = "callback";  ///< the backend name in logs and errors (e.g. "gloo")
  /// kHost, or kDevice when the callbacks take device addresses (then reduce_scatter must be
  /// given: its emulation copies through host memory).
  MemoryKind memory = MemoryKind::kHost;

  /// Required. recv = every rank's send, in rank order; recv.size() == send.size() * size.
  /// `send` may be this rank's block of recv.
  std::function<void(std::span<const std::byte> send, std::span<std::byte> recv)> all_gather;
  /// Required. In place. On host memory `op` is kSum, kMax or kMin, never kAvg (the adapter
  /// sums and divides); on device memory it may be kAvg (the adapter cannot divide there).
  std::function<void(std::span<std::byte> data, ElementType type, ReduceOp op)> all_reduce;
  /// Required. In place from `root`.
  std::function<void(std::span<std::byte> data, int root)> broadcast;
  /// Required.
  std::function<void()> barrier;
  /// Optional; kAvg as for all_reduce. Without it, reduce_scatter is all_reduce on a host copy of
  /// send (send.size() bytes of scratch per call) and a slice of it: correct, but it moves
  /// size() times the bytes of a native reduce-scatter.
  std::function<void(std::span<const std::byte> send, std::span<std::byte> recv, ElementType type,
                     ReduceOp op)>
      reduce_scatter;
};

/// Makes the adapter. Throws UsageError if a required callback is empty, rank is outside
/// [0, size), or memory is kDevice without reduce_scatter.
///
/// Errors: a callback that throws fails the collective. A zinf::Error passes through as it is;
/// any other exception becomes a CollectiveError naming the operation, this rank, the bytes and
/// the exception's text. Either way the adapter is then failed (Collectives contract). Timeouts
/// are the callbacks' own (gloo's and NCCL's process groups have one): the adapter adds none.
/// Threads: the callbacks run on the thread that issues the collective.
std::unique_ptr<Collectives> make_callback_collectives(CollectiveCallbacks callbacks);

}  // namespace zinf::dist
