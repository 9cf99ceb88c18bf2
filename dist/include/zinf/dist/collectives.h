// SPDX-License-Identifier: Apache-2.0
// Collectives: the operations ranks of a data-parallel job run together (all-gather,
// reduce-scatter, all-reduce, broadcast, barrier), behind one interface so that the sharded
// engine does not care whether MPI, NCCL or the trainer's own process group moves the bytes.
// LocalCollectives is world size 1. Part of zinf::dist (docs/distributed.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "zinf/common/element_type.h"
#include "zinf/common/error.h"
#include "zinf/common/status.h"

namespace zinf::dist {

/// The element type of a reduction (all_gather and broadcast move bytes and need none) and the
/// reduction: zinf::common's (element_type.h), shared with zinf::cuda's Communicator. The
/// collectives reduce kF32, kF64, kI32, kI64 and kU8 (bf16 and fp16 are a UsageError: widen
/// them to fp32 first); kAvg is the sum divided by size(), for kF32 and kF64 only (an integer
/// average would round, so it is a UsageError).
using zinf::element_size;
using zinf::element_type_name;
using zinf::ElementType;
using zinf::reduce_op_name;
using zinf::ReduceOp;

/// Where a backend's buffers live: host memory (LocalCollectives, MPI, callbacks by default) or
/// device memory of one CUDA device (NCCL; the spans then hold device addresses, never read on
/// the host).
enum class MemoryKind : std::uint8_t { kHost, kDevice };

/// A collective that failed or timed out across ranks (not a local misuse, which is a
/// UsageError). Its Status has the operation ("all_reduce", ...), the backend, the bytes of
/// this rank's buffer as `length`, code kTimedOut for a timeout (else kIo), and a message that
/// starts with "rank R of N". Caught as IoError, so status_from_current_exception keeps it.
class CollectiveError : public IoError {
 public:
  explicit CollectiveError(Status status) : IoError(std::move(status)) {}
};

/// Collectives across the `size()` ranks of one group; this process is rank `rank()`.
///
/// Contract, for every backend:
/// - Every rank calls the same operations in the same order with the same sizes, types, ops and
///   root (the MPI/NCCL rule). A mismatch between ranks cannot always be detected: it may hang
///   until the backend's timeout, fail, or corrupt data.
/// - Each call blocks until this rank's part is complete: on return, the output buffer holds the
///   result and the input may be reused. No call keeps a span after it returns, except after a
///   timeout (below).
/// - Buffers are memory of kind memory(); alignment: the element type's natural alignment is
///   enough everywhere (no backend needs more). Sizes are in bytes and must be whole elements.
/// - Blocks are equal: all_gather and reduce_scatter give every rank the same block size; a
///   caller with uneven shards pads them to the largest.
/// - Local misuse (sizes that do not match, a root outside [0, size()), kAvg on integers,
///   overlapping buffers where not allowed) throws UsageError naming the operation, the rank and
///   the sizes, before anything is sent; the object stays usable.
/// - A failure across ranks (a peer died, a backend error, a timeout) throws CollectiveError.
///   The group is then in an unknown state: the object is failed, and every later call throws
///   EngineFailed quoting that first error. The job must abort (MPI_Abort, or exit and let the
///   launcher end the other ranks): neither MPI nor NCCL can resume a group after a peer is lost.
/// - Threads: one thread issues a Collectives' calls (not thread-safe); rank(), size(), name()
///   and memory() may be called from any thread.
class Collectives {
 public:
  virtual ~Collectives() = default;
  Collectives(const Collectives&) = delete;
  Collectives& operator=(const Collectives&) = delete;

  /// The backend: "local", "mpi", "callback" (or the name the caller gave), "nccl".
  virtual std::string_view name() const noexcept = 0;
  /// This process's rank, 0 <= rank() < size().
  virtual int rank() const noexcept = 0;
  /// Ranks in the group (>= 1).
  virtual int size() const noexcept = 0;
  /// Where this backend's buffers must live.
  virtual MemoryKind memory() const noexcept = 0;

  /// recv becomes the ranks' `send` blocks concatenated in rank order. recv.size() must be
  /// send.size() * size(). `send` may be this rank's own block of `recv` (in place); otherwise
  /// the two must not overlap.
  virtual void all_gather(std::span<const std::byte> send, std::span<std::byte> recv) = 0;

  /// The ranks' `send` buffers are reduced elementwise with `op`; rank r receives block r of
  /// the result in `recv`. send.size() must be recv.size() * size(); they must not overlap.
  virtual void reduce_scatter(std::span<const std::byte> send, std::span<std::byte> recv,
                              ElementType type, ReduceOp op) = 0;

  /// `data` becomes, on every rank, the elementwise `op` of all ranks' `data` (in place).
  virtual void all_reduce(std::span<std::byte> data, ElementType type, ReduceOp op) = 0;

  /// `data` becomes, on every rank, rank `root`'s `data` (in place).
  virtual void broadcast(std::span<std::byte> data, int root) = 0;

  /// Returns once every rank has entered the barrier.
  virtual void barrier() = 0;

 protected:
  Collectives() = default;
};

/// The ElementType of a C++ element type (float, double, int32_t, int64_t, uint8_t).
template <class T>
constexpr ElementType element_type_of() noexcept {
  using U = std::remove_cv_t<T>;
  static_assert(std::is_same_v<U, float> || std::is_same_v<U, double> ||
                    std::is_same_v<U, std::int32_t> || std::is_same_v<U, std::int64_t> ||
                    std::is_same_v<U, std::uint8_t>,
                "zinf::dist reduces float, double, int32_t, int64_t and uint8_t");
  if constexpr (std::is_same_v<U, float>)
    return ElementType::kF32;
  else if constexpr (std::is_same_v<U, double>)
    return ElementType::kF64;
  else if constexpr (std::is_same_v<U, std::int32_t>)
    return ElementType::kI32;
  else if constexpr (std::is_same_v<U, std::int64_t>)
    return ElementType::kI64;
  else
    return ElementType::kU8;
}

/// Typed forms of the calls above (same contract; sizes in elements of T).
template <class T>
void all_gather(Collectives& c, std::span<const T> send, std::span<T> recv) {
  c.all_gather(std::as_bytes(send), std::as_writable_bytes(recv));
}
template <class T>
void reduce_scatter(Collectives& c, std::span<const T> send, std::span<T> recv, ReduceOp op) {
  c.reduce_scatter(std::as_bytes(send), std::as_writable_bytes(recv), element_type_of<T>(), op);
}
template <class T>
void all_reduce(Collectives& c, std::span<T> data, ReduceOp op) {
  c.all_reduce(std::as_writable_bytes(data), element_type_of<T>(), op);
}
template <class T>
void broadcast(Collectives& c, std::span<T> data, int root) {
  c.broadcast(std::as_writable_bytes(data), root);
}

/// The group of one rank (rank 0, size 1) on host memory: all_gather, reduce_scatter and
/// broadcast copy send to recv (nothing when they are the same memory), all_reduce and barrier
/// return at once. Checks its arguments as every backend does, so code written against it does
/// not break on the first multi-rank run. What the engine uses when no group is given.
std::unique_ptr<Collectives> make_local_collectives();

}  // namespace zinf::dist
