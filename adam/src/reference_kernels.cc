// SPDX-License-Identifier: Apache-2.0
// StreamRmw: the memory-bound reference kernel, on the same ChunkPool (chunking and threads)
// as CpuAdam so that the two figures differ only in the arithmetic. Not on any training path.
#include "zinf/adam/reference_kernels.h"

#include <cstddef>
#include <memory>
#include <span>
#include <string>

#include "chunk_pool.h"
#include "zinf/common/error.h"

namespace zinf::adam {
namespace {

struct RmwJob {
  float* a;
  const float* b;
  float s;
};

void stream_rmw_kernel(float* a, const float* b, float s, std::size_t begin, std::size_t end) {
  // Plain loop: the compiler vectorises it with the baseline ISA, which is enough to saturate
  // memory; it is a bandwidth reference, not arithmetic. Arguments rather than the job's
  // fields, so that the stores to a[] cannot be taken to alias s and force a reload.
  for (std::size_t i = begin; i < end; ++i) a[i] = a[i] + s * b[i];
}

void run_rmw_chunk(const void* ctx, std::size_t begin, std::size_t end) {
  const auto* job = static_cast<const RmwJob*>(ctx);
  stream_rmw_kernel(job->a, job->b, job->s, begin, end);
}

}  // namespace

struct StreamRmw::Impl {
  explicit Impl(std::size_t threads) : pool(threads) {}
  detail::ChunkPool pool;
};

StreamRmw::StreamRmw(std::size_t threads) : impl_(std::make_unique<Impl>(threads)) {}

StreamRmw::~StreamRmw() = default;

std::size_t StreamRmw::threads() const noexcept { return impl_->pool.threads(); }

void StreamRmw::run(std::span<float> a, std::span<const float> b, float s) {
  if (a.size() != b.size()) {
    throw UsageError("stream rmw: b has " + std::to_string(b.size()) + " elements, a has " +
                     std::to_string(a.size()));
  }
  if (a.empty()) return;
  if (a.data() == nullptr || b.data() == nullptr) throw UsageError("stream rmw: null array");
  RmwJob job{a.data(), b.data(), s};
  impl_->pool.run(a.size(), a.data(), sizeof(float), run_rmw_chunk, &job);
}

}  // namespace zinf::adam
