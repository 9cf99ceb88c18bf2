// SPDX-License-Identifier: Apache-2.0
// The host simulation's copy (dma_copy's streaming path) against memcpy across sizes: where
// the caches end, memcpy's stores read each destination line first, streaming stores do not.
// kStreamingCopyThreshold in cuda/src/dma_copy.h comes from this benchmark.
#include <benchmark/benchmark.h>

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
#include <vector>

#include "dma_copy.h"

namespace {

// Eight source/destination pairs, cycled, so that a size that fits in the caches once does
// not look cached when eight copies of it do not fit.
struct Buffers {
  explicit Buffers(std::size_t bytes) : n(bytes) {
    for (int i = 0; i < kPairs; ++i) {
      src[i] = alloc(n);
      dst[i] = alloc(n);
      std::memset(src[i], 1, n);
      std::memset(dst[i], 2, n);
    }
  }
  ~Buffers() {
    for (int i = 0; i < kPairs; ++i) {
      munmap(src[i], n);
      munmap(dst[i], n);
    }
  }
  Buffers(const Buffers&) = delete;
  Buffers& operator=(const Buffers&) = delete;
  static std::byte* alloc(std::size_t n) {
    void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    madvise(p, n, MADV_HUGEPAGE);
    return static_cast<std::byte*>(p);
  }
  static constexpr int kPairs = 8;
  std::size_t n;
  std::byte* src[kPairs];
  std::byte* dst[kPairs];
};

template <bool kStreaming>
void BM_Copy(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  Buffers b(n);
  int k = 0;
  for (auto _ : state) {
    if constexpr (kStreaming) {
      zinf::cuda::detail::streaming_copy(b.dst[k], b.src[k], n);
    } else {
      std::memcpy(b.dst[k], b.src[k], n);
    }
    benchmark::DoNotOptimize(b.dst[k]);
    benchmark::ClobberMemory();
    k = (k + 1) % Buffers::kPairs;
  }
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(n));
}

void BM_Memcpy(benchmark::State& state) { BM_Copy<false>(state); }
void BM_StreamingCopy(benchmark::State& state) { BM_Copy<true>(state); }

BENCHMARK(BM_Memcpy)
    ->ArgName("bytes")
    ->RangeMultiplier(2)
    ->Range(256 << 10, 64 << 20)
    ->UseRealTime();
BENCHMARK(BM_StreamingCopy)
    ->ArgName("bytes")
    ->RangeMultiplier(2)
    ->Range(256 << 10, 64 << 20)
    ->UseRealTime();

}  // namespace
