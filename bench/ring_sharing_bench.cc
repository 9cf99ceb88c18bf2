// SPDX-License-Identifier: Apache-2.0
// One I/O engine per store, or one shared by all: what a parameter fetch costs while the
// optimizer's state streams through the drive at the same time. OffloadEngine gives each of its
// stores (parameters, optimizer state, gradient staging) an engine of its own, each with the
// aio settings' queue depth; this measures that choice against one engine (one io_uring ring,
// one queue depth) serving both.
//
// A "parameter" store of 8 units of 4 MiB is read unit by unit, one read at a time (a fetch
// the compute waits for), while a writer keeps swapping out the "optimizer" store's 8 records
// of 16 MiB (a step's write-back, all in flight at once). Per read: its latency; per run: the
// reads' and the writes' rates. BM_ReadAlone is the reference: the same reads, no writer.
// Scratch folder: $ZINF_BENCH_DIR, else ./zinf-scratch (created).
//   build/release/bench/ring_sharing_bench --benchmark_repetitions=3
#include <benchmark/benchmark.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "zinf/swap/buffer_pool.h"
#include "zinf/swap/io_engine.h"
#include "zinf/swap/swap_store.h"

namespace {

using namespace zinf;
using Clock = std::chrono::steady_clock;

constexpr std::uint64_t kUnit = 4ull << 20;
constexpr std::uint64_t kRecord = 16ull << 20;
constexpr int kUnits = 8;
constexpr int kRecords = 8;

std::string scratch() {
  const char* env = std::getenv("ZINF_BENCH_DIR");
  std::string dir = std::string(env != nullptr && *env != '\0' ? env : "./zinf-scratch");
  std::filesystem::create_directories(dir);
  return dir;
}

std::unique_ptr<swap::SwapStore> make_store(swap::IoEngine& engine, const std::string& prefix,
                                            std::uint64_t bytes, int count) {
  swap::SwapStoreOptions so;
  so.directories = {scratch()};
  const std::vector<std::uint64_t> sizes(static_cast<std::size_t>(count), bytes);
  so.capacity_bytes =
      swap::capacity_for(sizes, so.stripe_bytes, swap::store_alignment(so.directories));
  auto store = std::make_unique<swap::SwapStore>(so, engine);
  for (int i = 0; i < count; ++i) store->allocate(prefix + std::to_string(i), bytes);
  return store;
}

// state.range(0): 0 = one engine per store, 1 = one engine for both; range(1): 1 = a writer
// runs during the reads.
void run(benchmark::State& state) {
  const bool shared = state.range(0) == 1;
  const bool writer_on = state.range(1) == 1;
  swap::IoOptions io;  // the library's defaults: the aio block's defaults
  auto read_engine = swap::make_io_engine(io);
  std::unique_ptr<swap::IoEngine> own_write_engine;
  if (!shared) own_write_engine = swap::make_io_engine(io);
  swap::IoEngine& write_engine = shared ? *read_engine : *own_write_engine;
  auto params = make_store(*read_engine, "unit", kUnit, kUnits);
  auto optimizer = make_store(write_engine, "record", kRecord, kRecords);

  swap::BufferPoolOptions po;
  po.budget_bytes = kUnit + kRecords * kRecord;
  po.huge_pages = false;
  po.prefault = true;
  swap::BufferPool pool(po);
  swap::BufferLease unit_buf = pool.acquire(kUnit);
  std::vector<swap::BufferLease> record_bufs;
  for (int i = 0; i < kRecords; ++i) record_bufs.push_back(pool.acquire(kRecord));
  for (int i = 0; i < kUnits; ++i) {
    params->swap_out("unit" + std::to_string(i), unit_buf.span()).wait();
  }
  for (int i = 0; i < kRecords; ++i) {
    optimizer->swap_out("record" + std::to_string(i), record_bufs[i].span()).wait();
  }

  std::vector<double> latencies;
  std::uint64_t read_bytes = 0, written = 0;
  double read_seconds = 0, write_seconds = 0;
  for (auto _ : state) {
    std::atomic<bool> stop{false};
    std::atomic<std::uint64_t> write_bytes{0};
    const auto start = Clock::now();
    std::thread writer;
    if (writer_on) {
      writer = std::thread([&] {
        while (!stop.load()) {
          std::vector<swap::IoTicket> tickets;
          for (int i = 0; i < kRecords; ++i) {
            tickets.push_back(
                optimizer->swap_out("record" + std::to_string(i), record_bufs[i].span()));
          }
          for (auto& t : tickets) t.wait();
          write_bytes += kRecords * kRecord;
        }
      });
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the writes under way
    }
    const auto reads_start = Clock::now();
    for (int i = 0; i < kUnits; ++i) {
      const auto t0 = Clock::now();
      params->swap_in("unit" + std::to_string(i), unit_buf.span()).wait();
      latencies.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    const auto reads_end = Clock::now();
    stop = true;
    if (writer.joinable()) writer.join();
    read_seconds += std::chrono::duration<double>(reads_end - reads_start).count();
    write_seconds += std::chrono::duration<double>(Clock::now() - start).count();
    read_bytes += kUnits * kUnit;
    written += write_bytes.load();
  }
  std::sort(latencies.begin(), latencies.end());
  const auto pct = [&](double p) {
    return latencies[std::min(latencies.size() - 1,
                              static_cast<std::size_t>(p * static_cast<double>(latencies.size())))];
  };
  state.counters["read_GBps"] = static_cast<double>(read_bytes) / read_seconds / 1e9;
  state.counters["read_p50_ms"] = pct(0.5) * 1e3;
  state.counters["read_p90_ms"] = pct(0.9) * 1e3;
  state.counters["write_GBps"] = writer_on ? static_cast<double>(written) / write_seconds / 1e9 : 0;
  state.SetLabel(std::string(shared ? "one engine" : "an engine per store") + ", " +
                 std::string(read_engine->name()));
}

void BM_ReadAlone(benchmark::State& state) { run(state); }
void BM_ReadDuringWrites(benchmark::State& state) { run(state); }

BENCHMARK(BM_ReadAlone)->Args({0, 0})->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ReadDuringWrites)
    ->Args({0, 1})
    ->Args({1, 1})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
