// SPDX-License-Identifier: Apache-2.0
// HostStaging: host data through a device-memory backend, one copy in and one copy out per
// collective; a host backend is called as it is.
#include "host_staging.h"

#include <algorithm>

namespace zinf::dist::detail {
namespace {

// The recv side starts at a multiple of this in the staging buffer: the natural alignment of
// every element type (Collectives' contract) and the device's allocation granule.
constexpr std::size_t kAlign = 256;

std::size_t align_up(std::size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

}  // namespace

HostStaging::HostStaging(Collectives& inner, cuda::Device& device, cuda::StreamRef stream)
    : inner_(inner), device_(device), stream_(stream) {}

HostStaging::Staged HostStaging::stage(std::span<const std::byte> send, std::size_t recv_bytes,
                                       bool in_place) {
  const std::size_t recv_at = in_place ? 0 : align_up(send.size());
  const std::size_t need = std::max(recv_at + recv_bytes, send.size());
  if (staging_.size() < need) {
    staging_.reset();  // nothing on the stream uses it: every call waited for its copies
    staging_ = device_.allocate(need);
  }
  if (!send.empty()) {
    device_.copy_to_device(stream_, staging_.span(0, send.size()), send);
    device_.synchronize(stream_);
  }
  return {std::span(staging_.data(), send.size()), std::span(staging_.data() + recv_at, recv_bytes)};
}

void HostStaging::unstage(std::span<const std::byte> from, std::span<std::byte> to) {
  if (to.empty()) return;
  device_.copy_to_host(stream_, to,
                       staging_.span(static_cast<std::size_t>(from.data() - staging_.data()),
                                     from.size()));
  device_.synchronize(stream_);
}

void HostStaging::all_gather(std::span<const std::byte> send, std::span<std::byte> recv) {
  if (inner_.memory() == MemoryKind::kHost) return inner_.all_gather(send, recv);
  const Staged d = stage(send, recv.size(), false);
  inner_.all_gather(d.send, d.recv);
  unstage(d.recv, recv);
}

void HostStaging::reduce_scatter(std::span<const std::byte> send, std::span<std::byte> recv,
                                 ElementType type, ReduceOp op) {
  if (inner_.memory() == MemoryKind::kHost) return inner_.reduce_scatter(send, recv, type, op);
  const Staged d = stage(send, recv.size(), false);
  inner_.reduce_scatter(d.send, d.recv, type, op);
  unstage(d.recv, recv);
}

void HostStaging::all_reduce(std::span<std::byte> data, ElementType type, ReduceOp op) {
  if (inner_.memory() == MemoryKind::kHost) return inner_.all_reduce(data, type, op);
  const Staged d = stage(data, data.size(), true);
  inner_.all_reduce(d.recv, type, op);
  unstage(d.recv, data);
}

void HostStaging::broadcast(std::span<std::byte> data, int root) {
  if (inner_.memory() == MemoryKind::kHost) return inner_.broadcast(data, root);
  const Staged d = stage(data, data.size(), true);
  inner_.broadcast(d.recv, root);
  unstage(d.recv, data);
}

}  // namespace zinf::dist::detail
