// SPDX-License-Identifier: Apache-2.0
// Built with -O3 -march=native -fno-math-errno (bench/CMakeLists.txt): the plain loop with
// restrict pointers, so GCC vectorises it for this exact CPU (sqrt needs no errno check).
#include <cmath>

#include "native_adam_loop.h"

namespace zinf::bench {

void native_adam_loop_vectorized(float* __restrict p, float* __restrict m, float* __restrict v,
                                 const float* __restrict g, std::size_t n, float lr, float beta1,
                                 float beta2, float eps, float bias_correction1,
                                 float bias_correction2) {
  const float step_size = lr / bias_correction1;
  const float bc2_sqrt = std::sqrt(bias_correction2);
  for (std::size_t i = 0; i < n; ++i) {
    m[i] = beta1 * m[i] + (1.0f - beta1) * g[i];
    v[i] = beta2 * v[i] + (1.0f - beta2) * g[i] * g[i];
    const float denom = std::sqrt(v[i]) / bc2_sqrt + eps;
    p[i] = p[i] - step_size * m[i] / denom;
  }
}

}  // namespace zinf::bench
