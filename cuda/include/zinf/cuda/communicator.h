// SPDX-License-Identifier: Apache-2.0
// Communicator: collectives across ranks on device memory, enqueued on a Device stream:
// all-gather of each rank's parameter shard into a whole layer on every GPU, reduce-scatter of
// gradients back into shards (ZeRO-Infinity's bandwidth-centric partitioning: each rank reads
// 1/N of a layer from its own drives); all-reduce and broadcast for norms, overflow flags and
// initial state. NCCL backend where NCCL is found. Part of zinf::cuda;
// never includes nccl.h or cuda_runtime.h.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "zinf/common/element_type.h"
#include "zinf/cuda/device.h"

namespace zinf::cuda {

/// The element type and the operation of a reduction, and element_size: zinf::common's
/// (element_type.h), shared with zinf::dist.
using zinf::element_size;
using zinf::ElementType;
using zinf::ReduceOp;

/// Names one communicator group: NCCL's unique id as opaque bytes. Rank 0 makes it with
/// make_communicator_id() and sends it to every other rank out of band.
struct CommunicatorId {
  std::array<std::byte, 128> bytes{};
};

struct CommunicatorOptions {
  int rank = 0;        ///< this process's rank, 0 <= rank < world_size
  int world_size = 1;  ///< ranks in the group
  CommunicatorId id;   ///< the same on every rank
};

/// Collectives on device memory of one CUDA Device, enqueued on one of its streams.
///
/// Contract: every call enqueues and returns (the host does not wait for the collective or for
/// the other ranks); order it with the stream's events like any device work. Every rank must
/// make the same calls in the same order with matching sizes (NCCL's rule; a mismatch hangs or
/// fails on the device, it cannot be detected here). Spans must be memory of this
/// communicator's Device (UsageError otherwise, and for sizes that do not match). A failed
/// NCCL call throws DeviceError naming the call, the NCCL error and its last message. Not
/// thread-safe: one thread issues a communicator's collectives. The Device and the streams
/// used must outlive the communicator; the destructor frees the NCCL communicator.
class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  /// "nccl"; shown in logs and errors.
  virtual std::string_view name() const noexcept = 0;
  virtual int rank() const noexcept = 0;
  virtual int world_size() const noexcept = 0;

  /// Enqueues an all-gather on `stream`: `recv` becomes the ranks' `send` spans concatenated
  /// in rank order. recv.size() must be send.size() * world_size(). `send` may be this rank's
  /// slot of `recv` (in place).
  virtual void all_gather(StreamRef stream, DeviceSpan send, DeviceSpan recv) = 0;
  /// Enqueues a reduce-scatter on `stream`: the ranks' `send` spans are reduced elementwise
  /// with `op` and rank r receives block r of the result in `recv`. send.size() must be
  /// recv.size() * world_size(), and recv.size() a multiple of element_size(type).
  virtual void reduce_scatter(StreamRef stream, DeviceSpan send, DeviceSpan recv, ElementType type,
                              ReduceOp op) = 0;
  /// Enqueues an all-reduce on `stream`: every rank's `data` becomes the elementwise `op` of
  /// all ranks' `data` (in place). data.size() must be a multiple of element_size(type).
  virtual void all_reduce(StreamRef stream, DeviceSpan data, ElementType type, ReduceOp op) = 0;
  /// Enqueues a broadcast on `stream`: every rank's `data` becomes rank `root`'s (in place).
  /// `root` must be in [0, world_size()); every rank passes the same size.
  virtual void broadcast(StreamRef stream, DeviceSpan data, int root) = 0;

 protected:
  Communicator() = default;
};

/// Returns "" if this build has NCCL, else why not (e.g. "zinf was built without NCCL ...").
std::string nccl_unavailable_reason();

/// Makes a new group id (ncclGetUniqueId). Throws DeviceError in a build without NCCL, or if
/// NCCL fails (it opens its bootstrap socket here).
CommunicatorId make_communicator_id();

/// Joins the group `options.id` as `options.rank` on `device` (ncclCommInitRank: blocks until
/// every rank has joined). Throws DeviceError in a build without NCCL ("zinf was built without
/// NCCL ..."), UsageError for a device that is not CUDA (the host simulation has no NCCL) or a
/// rank outside [0, world_size), and DeviceError if NCCL fails.
std::unique_ptr<Communicator> make_nccl_communicator(Device& device,
                                                     const CommunicatorOptions& options);

}  // namespace zinf::cuda
