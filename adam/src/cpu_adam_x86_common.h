// SPDX-License-Identifier: Apache-2.0
// What the x86 CpuAdam kernels (cpu_adam_avx2.cc, cpu_adam_avx512_impl.h) share that does not
// depend on the vector width: the software prefetch and the gradient element size. Everything
// has internal linkage, so each kernel TU keeps its own copy built with its own -m flags.
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "cpu_adam_kernel.h"

namespace zinf::adam::detail {
namespace {

// Software prefetch distance, in elements. On one thread, where a core's outstanding misses
// limit bandwidth, prefetching (into L1) beats none by 3-12% (100M elements, Zen 4, AVX-512).
// 256 elements (1 KiB per fp32 stream) ahead measured ~7% faster than 512 against the
// -O3 -march=native loop (median ratio 1.110 vs 1.038, 3 alternated adam_bench runs on a
// shared machine; the AVX2 path gained too); 128-384 were within noise of 256, 1024 and an
// extra L2 prefetch further ahead were slower. Two threads were not re-measured at 256.
constexpr std::size_t kPrefetchElems = 256;

// Prefetches one cache line; the address is formed as an integer because it may lie past the
// end of the array (prefetch never faults, but pointer arithmetic there would be undefined).
inline void prefetch(const void* base, std::size_t byte_offset) {
  const std::uintptr_t addr = reinterpret_cast<std::uintptr_t>(base) + byte_offset;
  _mm_prefetch(reinterpret_cast<const char*>(addr), _MM_HINT_T0);
}

template <ElemType G>
constexpr std::size_t grad_bytes() {
  return G == ElemType::kF32 ? 4 : 2;
}

}  // namespace
}  // namespace zinf::adam::detail
