// SPDX-License-Identifier: Apache-2.0
// The references the issue names for single-thread speed: a plain Adam loop, compiled alone
// with -O3 -march=native (bench only; product code never uses -march=native), as written and
// in a form the compiler can vectorise.
#pragma once

#include <cstddef>

namespace zinf::bench {

/// One Adam step (PyTorch semantics, no weight decay) over n fp32 elements, written the
/// obvious way and left to the compiler.
void native_adam_loop(float* p, float* m, float* v, const float* g, std::size_t n, float lr,
                      float beta1, float beta2, float eps, float bias_correction1,
                      float bias_correction2);

/// The same loop with restrict-qualified pointers, built with -O3 -march=native
/// -fno-math-errno so that the compiler can vectorise sqrt: the stronger reference.
void native_adam_loop_vectorized(float* p, float* m, float* v, const float* g, std::size_t n,
                                 float lr, float beta1, float beta2, float eps,
                                 float bias_correction1, float bias_correction2);

/// The simple form the issue names as the reference: each element's p, g, m, v loaded once,
/// updated in registers and stored once, one division per element; built with -O3
/// -march=native -fno-math-errno (the target for CpuAdam at one thread).
void simple_adam_loop_native(float* p, float* m, float* v, const float* g, std::size_t n,
                             float lr, float beta1, float beta2, float eps,
                             float bias_correction1, float bias_correction2);

/// The same source built with -O3 -fno-math-errno for the baseline ISA (no -march): the
/// target for CpuAdam's portable (scalar) path.
void simple_adam_loop_baseline(float* p, float* m, float* v, const float* g, std::size_t n,
                               float lr, float beta1, float beta2, float eps,
                               float bias_correction1, float bias_correction2);

}  // namespace zinf::bench
