// SPDX-License-Identifier: Apache-2.0
// CRC32C against the memory it reads. With checksums on (the default) the offloaded optimizer
// sums every byte it reads from and writes to a swap file inside its update (12 B each way per
// fp32 element, 6.1 B int8), so the checksum's rate, hot (the piece the kernel is about to
// touch or just wrote) and cold (bytes a drive just put in memory), sets part of a step's CPU
// time. BM_ReadBound is the reference: one 64-byte load per line over the same bytes.
#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "zinf/swap/crc32c.h"

namespace {

using zinf::swap::Crc32cImpl;

constexpr std::size_t kColdBytes = std::size_t{512} << 20;  // far beyond any L3 here

std::vector<std::byte> pattern(std::size_t n) {
  std::vector<std::byte> b(n);
  for (std::size_t i = 0; i < n; ++i) b[i] = static_cast<std::byte>((i * 131u + 7u) >> 3);
  return b;
}

// Sums `piece`-byte pieces of the buffer in order, as the optimizer's hooks do. Hot: a buffer
// of `piece` bytes summed again and again; cold: pieces walked over 512 MiB.
void run(benchmark::State& state, Crc32cImpl impl, bool cold) {
  if (!zinf::swap::crc32c_impl_available(impl)) {
    state.SkipWithError("this CPU lacks the implementation");
    return;
  }
  const auto piece = static_cast<std::size_t>(state.range(0));
  const std::vector<std::byte> buf = pattern(cold ? kColdBytes : piece);
  std::size_t at = 0;
  std::uint32_t crc = 0;
  for (auto _ : state) {
    crc = zinf::swap::crc32c_with(impl, std::span(buf).subspan(at, piece), crc);
    if (cold) at = at + 2 * piece > buf.size() ? 0 : at + piece;
  }
  benchmark::DoNotOptimize(crc);
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(piece));
}

void BM_Crc32cHot(benchmark::State& state) {
  run(state, static_cast<Crc32cImpl>(state.range(1)), false);
}
void BM_Crc32cCold(benchmark::State& state) {
  run(state, static_cast<Crc32cImpl>(state.range(1)), true);
}

// The bound for a cold sum: touching every 64-byte line of the same 512 MiB in order.
void BM_ReadBound(benchmark::State& state) {
  const auto piece = static_cast<std::size_t>(state.range(0));
  const std::vector<std::byte> buf = pattern(kColdBytes);
  std::size_t at = 0;
  std::uint64_t acc = 0;
  for (auto _ : state) {
    for (std::size_t i = 0; i < piece; i += 64) {
      std::uint64_t w;
      std::memcpy(&w, buf.data() + at + i, sizeof w);
      acc += w;
    }
    at = at + 2 * piece > buf.size() ? 0 : at + piece;
  }
  benchmark::DoNotOptimize(acc);
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(piece));
}

constexpr auto kAvx512 = static_cast<std::int64_t>(Crc32cImpl::kAvx512);
constexpr auto kHardware = static_cast<std::int64_t>(Crc32cImpl::kHardware);

// 2 KiB: an int8 moment piece; 64 KiB: an fp32 piece of the hooks (kHookPieceElements x 4);
// 1 MiB: a stripe unit as bench io sums it.
BENCHMARK(BM_Crc32cHot)
    ->ArgNames({"bytes", "impl"})
    ->ArgsProduct({{2048, 65536, 1 << 20}, {kAvx512, kHardware}});
BENCHMARK(BM_Crc32cCold)
    ->ArgNames({"bytes", "impl"})
    ->ArgsProduct({{2048, 65536, 1 << 20}, {kAvx512, kHardware}});
BENCHMARK(BM_ReadBound)->ArgNames({"bytes"})->Arg(65536);

}  // namespace
