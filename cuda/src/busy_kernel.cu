// SPDX-License-Identifier: Apache-2.0
// The busy kernel behind CudaDevice::enqueue_busy: one thread reads %globaltimer (nanoseconds,
// the same clock on every SM) until the duration has passed, napping with __nanosleep between
// reads so that it takes no issue slots from real kernels sharing the GPU.
#include "busy_kernel.h"

namespace zinf::cuda::detail {
namespace {

__device__ __forceinline__ unsigned long long global_timer_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void busy_kernel(unsigned long long nanoseconds) {
  const unsigned long long start = global_timer_ns();
  // The timer ticks every microsecond or so on current GPUs; a 1 us nap keeps the error of the
  // simulated compute at that order while polling only about once per tick.
  while (global_timer_ns() - start < nanoseconds) __nanosleep(1000);
}

}  // namespace

cudaError_t launch_busy_kernel(cudaStream_t stream, std::uint64_t nanoseconds) noexcept {
  busy_kernel<<<1, 1, 0, stream>>>(static_cast<unsigned long long>(nanoseconds));
  return cudaGetLastError();
}

}  // namespace zinf::cuda::detail
