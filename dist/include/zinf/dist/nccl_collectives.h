// SPDX-License-Identifier: Apache-2.0
// The NCCL adapter: Collectives on device memory over a zinf::cuda::Communicator (NCCL where
// the build has it), each call enqueued on one stream and waited for with an event polled until
// a deadline. For code written against Collectives; stream-ordered work with no host wait calls
// the Communicator directly. Part of zinf::dist (docs/distributed.md).
#pragma once

#include <chrono>
#include <memory>

#include "zinf/cuda/communicator.h"
#include "zinf/cuda/device.h"
#include "zinf/dist/collectives.h"

namespace zinf::dist {

struct NcclCollectivesOptions {
  /// How long one collective may take, from enqueue to completion on `stream`, before it fails
  /// with kTimedOut (as MpiCollectivesOptions::timeout, and as generous by default).
  std::chrono::milliseconds timeout = std::chrono::minutes(10);
};

/// Makes the adapter over `communicator` (name and rank/size are its own), issuing on `stream`
/// of `device`. memory() is kDevice: every span holds addresses of `device`'s memory (a
/// DeviceBuffer's, or memory adopt_device_memory accepts), never read on the host.
///
/// Each call checks its arguments (UsageError as the Collectives contract), enqueues the
/// Communicator's collective on `stream` (barrier: an all-reduce of 4 bytes of the adapter's
/// own device memory), records an event after it and polls the event, sleeping at most 1 ms
/// between polls, until `options.timeout`. Work enqueued on `stream` before the call runs first
/// and counts toward the timeout. A timeout throws CollectiveError (kTimedOut) naming the
/// operation, the rank and the timeout; a failed enqueue or stream error passes on as the
/// DeviceError the Communicator or Device throws. Either way the adapter is failed, and since
/// an NCCL collective cannot be withdrawn from a stream, the process must end the job.
///
/// Lifetime: `device`, `communicator` and the stream behind `stream` outlive the adapter.
/// Throws UsageError if `stream` is not a stream of `device`, DeviceError if the 4 bytes of
/// barrier memory cannot be allocated, and UsageError for a non-positive timeout.
std::unique_ptr<Collectives> make_nccl_collectives(cuda::Device& device,
                                                   cuda::Communicator& communicator,
                                                   cuda::StreamRef stream,
                                                   const NcclCollectivesOptions& options = {});

}  // namespace zinf::dist
