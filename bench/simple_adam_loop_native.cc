// SPDX-License-Identifier: Apache-2.0
// The simple loop built with -O3 -march=native -fno-math-errno (bench/CMakeLists.txt): what a
// user gets from writing Adam plainly and letting the compiler tune it for this exact CPU
// (vectorised, with FMA contraction where the CPU has it).
#include <cmath>

#include "native_adam_loop.h"

namespace zinf::bench {

void simple_adam_loop_native(float* p, float* m, float* v, const float* g, std::size_t n, float lr,
                             float beta1, float beta2, float eps, float bias_correction1,
                             float bias_correction2)
#include "simple_adam_loop.inc"

}  // namespace zinf::bench
