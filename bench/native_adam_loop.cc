// SPDX-License-Identifier: Apache-2.0
// Built with -O3 -march=native (bench/CMakeLists.txt): what a user gets from writing Adam as a
// loop and letting the compiler tune it for this exact CPU.
#include "native_adam_loop.h"

#include <cmath>

namespace zinf::bench {

void native_adam_loop(float* p, float* m, float* v, const float* g, std::size_t n, float lr,
                      float beta1, float beta2, float eps, float bias_correction1,
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
