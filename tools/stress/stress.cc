// SPDX-License-Identifier: Apache-2.0
// `zinf stress`: a soak of the whole I/O stack under load and injected faults. Swap workers,
// an NVMe-offloaded optimizer checked bitwise against an in-memory CpuAdam, and layer
// prefetch passes run at once for --duration; every byte read back is verified, and every
// injected hard fault (EIO, ENOSPC) must surface as an error of the operation it hit.
//
// This file parses the options, runs the workers (swap_worker, optimizer_worker,
// prefetch_worker) and hands their totals to judge() (verdict.h) and print_report (report.h).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "progress.h"
#include "args.h"
#include "bench_common.h"
#include "commands.h"
#include "interrupt.h"
#include "optimizer_worker.h"
#include "options.h"
#include "prefetch_worker.h"
#include "report.h"
#include "scratch.h"
#include "swap_worker.h"
#include "verdict.h"
#include "worker.h"
#include "zinf/common/error.h"
#include "zinf/common/log.h"
#include "zinf/swap/buffer_pool.h"
#include "zinf/swap/io_engine.h"
#include "zinf/cuda/device.h"
#include "throughput.h"

namespace zinf::tools {
namespace {

using namespace stress;  // this file is the command those pieces make up

constexpr const char* kAbout = R"(
Runs, concurrently for --duration: swap workers (swap_out/swap_in of random-size tensors and
ranges, every byte read back verified), optimizer steps (state on NVMe, checked bitwise against
an in-memory CpuAdam after every step) and layer prefetch passes (every acquired layer's bytes
verified). With --faults, the I/O engines inject EIO, ENOSPC, short transfers, EAGAIN and
delays; every hard fault (EIO, ENOSPC) must surface as an error of the operation it hit, and
every recoverable one must be absorbed with correct data.)";

constexpr const char* kFooter = R"(
Exit status: 0 if nothing was lost, 1 on any mismatch, unsurfaced hard fault, unexpected error
or budget overrun, 2 on bad options, 128 + the signal's number when SIGINT, SIGTERM or SIGHUP
ends the soak early (no report then). See docs/stress.md.)";

StressOptions parse(const std::vector<std::string>& tokens, bool* help) {
  StressOptions c;
  std::string engine = "auto";
  Cli cli("stress", kAbout, kFooter);
  cli.texts("--dir", c.dirs, "DIR",
            "directory for the swap files (repeatable: striped over the directories)",
            "./zinf-scratch, created if missing");
  cli.duration("--duration", c.duration, "how long to run");
  cli.number("--faults", c.fault_rate,
             "probability per I/O piece attempt of an injected fault, in [0, 0.5]");
  cli.count("--seed", c.seed, "seed of the workloads and of the fault plans");
  cli.size("--budget", c.budget, "pinned memory for all workers together; at least 4M");
  cli.count("--workers", c.workers,
            "swap workers (the optimizer and prefetch workers come on top)");
  cli.flag("--checksums", c.checksums,
           "keep CRC32C per stripe unit in every swap store. Off unless given, unlike "
           "the library's default: stress checks every byte itself, and without "
           "checksums its ranges need not be whole stripes (more layouts tested)");
  cli.hidden_flag("--plant-corruption", c.plant);  // stress's self-test (options.h)
  cli.text("--engine", engine, "KIND", "auto | uring | threads");
  cli.choice("--device", c.device, {"host", "cuda"}, "KIND",
             "where the prefetch worker's layers and the optimizer worker's gradients go: host "
             "(the simulation) or cuda (the first GPU; every byte is read back from it)");
  cli.size("--gpu-mem", c.gpu_mem,
           "device memory for both (the prefetch window and the gradients); on host also the "
           "simulated GPU's size, so that going over it fails as a full GPU would",
           "the prefetcher's pinned share, a quarter of --budget");
  cli.duration("--interval", c.interval,
               "length of one sample of the verified rate over time (a drop in it, e.g. a "
               "throttling drive or GPU, is reported)",
               "1s, or --duration if shorter");
  cli.flag("--json", c.json, "one JSON object on stdout instead of the report");
  *help = !cli.parse(tokens);
  if (*help) return c;
  c.engine = swap::parse_io_engine_kind(engine);
  if (!(c.fault_rate >= 0 && c.fault_rate <= 0.5)) {
    throw UsageError("invalid --faults: must be a probability in [0, 0.5]");
  }
  if (c.budget < (4ull << 20)) throw UsageError("invalid --budget: at least 4M");
  if (c.workers == 0 || c.workers > 64) throw UsageError("invalid --workers: must be in [1, 64]");
  if (c.interval.count() == 0) {
    c.interval = std::min(c.duration, std::chrono::milliseconds(1000));
  } else if (c.interval < std::chrono::milliseconds(100) || c.interval > c.duration) {
    throw UsageError("invalid --interval " + duration_text(c.interval) +
                     ": must be at least 100ms and at most --duration (" +
                     duration_text(c.duration) + ")");
  }
  check_scratch_dirs(c.dirs);
  return c;
}

// Under faults the library logs each failure it handles (a failed optimizer, a dropped read
// ahead, ...): expected here, and each is judged as an operation's error. The first few
// errors and the first few warnings are shown; the rest counted.
class LogThrottle {
 public:
  static constexpr std::uint64_t kShown = 5;
  LogThrottle() {
    previous_ = set_log_sink([this](LogLevel level, std::string_view message) {
      if (level >= LogLevel::kError) {
        std::lock_guard lock(mu_);
        if (++errors_ > kShown) return;
      } else if (level == LogLevel::kWarning) {
        std::lock_guard lock(mu_);
        if (++warnings_ > kShown) return;
      }
      static constexpr const char* kNames[] = {"debug", "info", "notice", "warning", "error"};
      std::fprintf(stderr, "zinf %s: %.*s\n", kNames[static_cast<int>(level)],
                   static_cast<int>(message.size()), message.data());
    });
  }
  ~LogThrottle() { set_log_sink(std::move(previous_)); }
  LogThrottle(const LogThrottle&) = delete;
  LogThrottle& operator=(const LogThrottle&) = delete;
  std::uint64_t errors() {
    std::lock_guard lock(mu_);
    return errors_;
  }
  std::uint64_t warnings() {
    std::lock_guard lock(mu_);
    return warnings_;
  }

 private:
  std::mutex mu_;
  std::uint64_t errors_ = 0;
  std::uint64_t warnings_ = 0;
  LogSink previous_;
};

}  // namespace

int stress_main(const std::vector<std::string>& tokens) {
  bool help = false;
  const StressOptions cfg = parse(tokens, &help);
  if (help) return 0;

  LogThrottle log_throttle;

  // The budget: half to the swap workers' pool, a quarter to the optimizer's ring, a quarter
  // to the prefetcher (staging half of that, device memory the rest).
  Shared sh;
  sh.cfg = &cfg;
  sh.store_dirs = cfg.dirs;
  if (sh.store_dirs.size() == 1) sh.store_dirs.push_back(cfg.dirs[0]);  // two files: striping
  const std::uint64_t swap_budget = cfg.budget / 2 / 4096 * 4096;
  sh.opt_budget = cfg.budget / 4;
  sh.prefetch_budget = cfg.budget / 4 / 4096 * 4096;
  // Each swap worker holds at most one lease at a time (plus a prefetch layer write), so a
  // tensor of this size never waits for the pool longer than another worker's one operation.
  sh.max_tensor =
      std::min<std::uint64_t>(8ull << 20, swap_budget / (cfg.workers + 1) / 4096 * 4096 - 4096);
  swap::BufferPoolOptions bo;
  bo.budget_bytes = swap_budget;
  swap::BufferPool pool(bo);
  sh.swap_pool = &pool;

  // The device (declared before the workers, whose streams and buffers must go first): the
  // simulation sized to --gpu-mem, so that going over it fails as on a full GPU, or the first
  // GPU, refused with the runtime's reason where there is none.
  const std::uint64_t opt_device = OptimizerWorker::device_bytes();
  const std::uint64_t gpu_mem = cfg.gpu_mem != 0 ? cfg.gpu_mem : sh.prefetch_budget + opt_device;
  const std::uint64_t least = opt_device + (1ull << 20);
  if (gpu_mem < least) {
    throw UsageError("invalid --gpu-mem " + size_text(gpu_mem) + ": at least " + size_text(least) +
                     " (the optimizer worker's gradients, " + size_text(opt_device) +
                     ", and 1 MiB for the prefetch window)");
  }
  std::unique_ptr<cuda::Device> device;
  if (cfg.device == "cuda") {
    const cuda::CudaAvailability cuda = cuda::probe_cuda();
    if (!cuda.available()) throw UsageError("--device cuda: no CUDA device (" + cuda.reason + ")");
    device = cuda::make_device(cuda::DeviceOptions{.kind = cuda::DeviceKind::kCuda});
  } else {
    device = cuda::make_device(
        cuda::DeviceOptions{.kind = cuda::DeviceKind::kHost, .host_memory_bytes = gpu_mem});
  }
  sh.device = device.get();
  sh.prefetch_device_bytes = (gpu_mem - opt_device) / 4096 * 4096;
  std::atomic<std::uint64_t> verified_live{0};
  sh.verified_live = &verified_live;

  std::vector<std::unique_ptr<SwapWorker>> swappers;
  for (std::size_t i = 0; i < cfg.workers; ++i)
    swappers.push_back(std::make_unique<SwapWorker>(sh, i));
  OptimizerWorker optimizer(sh);
  PrefetchWorker prefetcher(sh);

  const auto start = Clock::now();
  sh.deadline = start + cfg.duration;
  std::vector<ThroughputSample> totals_samples;
  {
    std::vector<std::jthread> threads;
    for (auto& w : swappers) {
      threads.emplace_back([&w] { guarded(w->tally(), "swap worker", [&] { w->run(); }); });
    }
    threads.emplace_back(
        [&] { guarded(optimizer.tally(), "optimizer worker", [&] { optimizer.run(); }); });
    threads.emplace_back(
        [&] { guarded(prefetcher.tally(), "prefetch worker", [&] { prefetcher.run(); }); });
    // The workers run until the deadline: say how far along the soak is, on a terminal, and
    // sample the verified bytes once per --interval for the rate over time.
    Progress progress("zinf stress", std::chrono::duration<double>(cfg.duration).count(), "s",
                      !cfg.json);
    auto sample_open = start;
    std::uint64_t sampled = 0;
    while (Clock::now() < sh.deadline && !interrupted()) {
      const auto next = std::min(sample_open + cfg.interval, sh.deadline);
      std::this_thread::sleep_until(std::min(next, Clock::now() + std::chrono::milliseconds(250)));
      progress.update(seconds_since(start));
      const auto now = Clock::now();
      if (now < next) continue;
      // A last partial interval shorter than half of one is too short to judge a rate by.
      if (now - sample_open >= cfg.interval / 2) {
        const std::uint64_t total = verified_live.load(std::memory_order_relaxed);
        ThroughputSample t;
        t.end_s = std::chrono::duration<double>(now - start).count();
        t.seconds = std::chrono::duration<double>(now - sample_open).count();
        t.bytes = total - sampled;
        t.cumulative_bytes = total;
        totals_samples.push_back(t);
        sampled = total;
      }
      sample_open = now;
    }
  }
  const double seconds = seconds_since(start);
  throw_if_interrupted();  // a cut-short soak proves nothing: no report, no verdict

  StressTotals totals;
  totals.samples = std::move(totals_samples);
  totals.profile = analyze_throughput(totals.samples);
  const cuda::DeviceStats ds = device->stats();
  totals.device = {std::string(device->name()), ds.peak_allocated_bytes, gpu_mem};
  for (auto& w : swappers) {
    totals.tally.add(w->tally());
    if (!w->planted().empty()) totals.planted = w->planted();
  }
  totals.tally.add(optimizer.tally());
  totals.tally.add(prefetcher.tally());
  // Pinned memory: the arenas are reserved whole (swap pool, prefetch staging) and the
  // optimizer's ring as it grows; the peak adds each part's own peak, an upper bound on the
  // true simultaneous peak.
  PinnedMemory& pm = totals.pinned;
  pm.reserved = pool.budget_bytes() + optimizer.pinned_peak() + prefetcher.staging_bytes();
  pm.peak = pool.peak_bytes_in_use() + optimizer.pinned_peak() + prefetcher.staging_bytes();
  pm.pool_peak = pool.peak_bytes_in_use();
  pm.pool_budget = pool.budget_bytes();
  pm.optimizer_peak = optimizer.pinned_peak();
  pm.optimizer_budget = sh.opt_budget;
  pm.prefetch_peak_held = prefetcher.peak_held();
  pm.prefetch_budget = sh.prefetch_budget;

  const StressVerdict verdict = judge(totals, cfg);
  print_report(cfg, totals, verdict, seconds, swappers[0]->engine_name(),
               LogCounts{log_throttle.errors(), log_throttle.warnings(), LogThrottle::kShown});
  return verdict.pass() ? 0 : 1;
}

}  // namespace zinf::tools
