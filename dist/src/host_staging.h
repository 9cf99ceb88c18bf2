// SPDX-License-Identifier: Apache-2.0
// Collectives on host data over a backend of either memory kind, so that the sharded engine's
// host-side collectives (gradients, master weights, failure flags, norms, checkpoint
// agreement) are one code path for MPI, callbacks and NCCL. Internal to zinf::dist.
#pragma once

#include <cstddef>
#include <span>
#include <string_view>

#include "zinf/cuda/device.h"
#include "zinf/dist/collectives.h"

namespace zinf::dist::detail {

/// Host-memory Collectives over `inner`. If inner.memory() is kHost, every call is inner's
/// own. If it is kDevice, each call copies its host input into a device buffer of `device` on
/// `stream`, waits for the copy, runs inner's call on device memory (which blocks until its
/// result is in place, Collectives' contract) and copies the result back, waiting again: the
/// bytes crossing PCIe per call are the input's and the output's. The device buffer is grown
/// to the largest call so far (send and recv side by side) and kept.
///
/// Errors are inner's (checks, CollectiveError, EngineFailed), or the DeviceError of a failed
/// allocation or copy; the latter leaves the other ranks waiting in the collective, so, as
/// after a failed collective, the job must end. name(), rank() and size() are inner's; memory() is kHost.
/// Threads and lifetime: one thread, as Collectives; `inner`, `device` and the stream outlive
/// this object.
class HostStaging final : public Collectives {
 public:
  HostStaging(Collectives& inner, cuda::Device& device, cuda::StreamRef stream);

  std::string_view name() const noexcept override { return inner_.name(); }
  int rank() const noexcept override { return inner_.rank(); }
  int size() const noexcept override { return inner_.size(); }
  MemoryKind memory() const noexcept override { return MemoryKind::kHost; }

  void all_gather(std::span<const std::byte> send, std::span<std::byte> recv) override;
  void reduce_scatter(std::span<const std::byte> send, std::span<std::byte> recv, ElementType type,
                      ReduceOp op) override;
  void all_reduce(std::span<std::byte> data, ElementType type, ReduceOp op) override;
  void broadcast(std::span<std::byte> data, int root) override;
  void barrier() override { inner_.barrier(); }

 private:
  // The device copies of a call's send and recv sides: send at the start of the staging
  // buffer, recv after it (at an offset aligned for every element type), or the same bytes for
  // an in-place call. Copies `send` in and waits for it.
  struct Staged {
    std::span<std::byte> send;
    std::span<std::byte> recv;
  };
  Staged stage(std::span<const std::byte> send, std::size_t recv_bytes, bool in_place);
  // Copies the device result `from` into `to` and waits for it.
  void unstage(std::span<const std::byte> from, std::span<std::byte> to);

  Collectives& inner_;
  cuda::Device& device_;
  const cuda::StreamRef stream_;
  cuda::DeviceBuffer staging_;
};

}  // namespace zinf::dist::detail
