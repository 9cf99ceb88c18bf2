// SPDX-License-Identifier: Apache-2.0
// The simple loop built with -O3 -fno-math-errno for the baseline ISA (x86-64: SSE2, no FMA;
// bench/CMakeLists.txt): the reference for CpuAdam's portable path, which is what runs on a
// CPU without AVX2.
#include <cmath>

#include "native_adam_loop.h"

namespace zinf::bench {

void simple_adam_loop_baseline(float* p, float* m, float* v, const float* g, std::size_t n,
                               float lr, float beta1, float beta2, float eps,
                               float bias_correction1, float bias_correction2)
#include "simple_adam_loop.inc"

}  // namespace zinf::bench
