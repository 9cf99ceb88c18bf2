// SPDX-License-Identifier: Apache-2.0
// What the x86 CpuAdam kernels (cpu_adam_avx2.cc, cpu_adam_avx512_impl.h) share that does not
// depend on the vector width: the software prefetch (its distance, KernelArgs::prefetch_elems,
// is chosen at run time by prefetch_tuner.h) and the gradient element size. Everything has
// internal linkage, so each kernel TU keeps its own copy built with its own -m flags.
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "cpu_adam_kernel.h"

namespace zinf::adam::detail {
namespace {

// Prefetches one cache line; the address is formed as an integer because it may lie past the
// end of the array (prefetch never faults, but pointer arithmetic there would be undefined).
inline void prefetch(const void* base, std::size_t byte_offset) {
  const std::uintptr_t addr = reinterpret_cast<std::uintptr_t>(base) + byte_offset;
  _mm_prefetch(reinterpret_cast<const char*>(addr), _MM_HINT_T0);
}

template <ElementType G>
constexpr std::size_t grad_bytes() {
  return G == ElementType::kF32 ? 4 : 2;
}

}  // namespace
}  // namespace zinf::adam::detail
