// SPDX-License-Identifier: Apache-2.0
// The one kernel of zinf::cuda: a stream kept busy for a given time (Device::enqueue_busy), so
// benchmarks and tests model a trainer's compute on the GPU itself. Private to zinf::cuda; only
// built with CUDA.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace zinf::cuda::detail {

/// Launches a one-thread kernel on `stream` that returns once the GPU's global timer has
/// advanced by `nanoseconds`. Returns the launch's error (cudaGetLastError after the launch),
/// which the caller checks; never throws.
cudaError_t launch_busy_kernel(cudaStream_t stream, std::uint64_t nanoseconds) noexcept;

}  // namespace zinf::cuda::detail
