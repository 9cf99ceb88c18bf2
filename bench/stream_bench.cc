// SPDX-License-Identifier: Apache-2.0
// The memory-bandwidth reference on its own: StreamRmw (a[i] = a[i] + s*b[i], which like Adam
// reads every array it writes) across sizes and thread counts, so a user can see where the
// caches end and what main memory delivers on their machine.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <vector>

#include "zinf/adam/reference_kernels.h"

namespace {

using zinf::adam::StreamRmw;

void BM_StreamRmw(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  StreamRmw rmw(static_cast<std::size_t>(state.range(1)));
  std::vector<float> a(n, 1.0f), b(n, 0.5f);
  float sign = 1.0f;
  for (auto _ : state) {
    rmw.run(a, b, sign);  // alternating signs keep a[] bounded
    sign = -sign;
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(n) *
                          static_cast<std::int64_t>(StreamRmw::kBytesPerElement));
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(n));
}

BENCHMARK(BM_StreamRmw)
    ->ArgNames({"numel", "threads"})
    ->ArgsProduct({{1 << 16, 1 << 20, 1 << 24, 100'000'000}, {1, 2}})
    ->UseRealTime();

}  // namespace
