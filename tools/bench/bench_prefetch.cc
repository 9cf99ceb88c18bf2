// SPDX-License-Identifier: Apache-2.0
// `zinf bench prefetch`: how well the LayerPrefetcher hides NVMe reads (or, with --source
// pinned, host->device copies from pinned host copies) behind compute. Layers live in a
// SwapStore on the user's directories, or in pinned host memory; each pass acquires them in
// order with a simulated per-layer compute on the compute stream, and the same run measures the
// source alone (the reads, or the copies), so the wall time is compared with max(compute,
// source) and with their sum.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "io_pattern.h"
#include "bench_common.h"
#include "scratch.h"
#include "args.h"
#include "commands.h"
#include "interrupt.h"
#include "format.h"
#include "json_out.h"
#include "zinf/common/error.h"
#include "zinf/cuda/device.h"
#include "zinf/prefetch/layer_prefetcher.h"
#include "zinf/swap/buffer_pool.h"
#include "zinf/swap/io_engine.h"
#include "zinf/swap/swap_store.h"

namespace zinf::tools {
namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kAbout = R"(
Measures how much of the NVMe read time the layer prefetcher hides behind compute. Layers are
written once to a swap store on DIR; each pass is then one iteration of one prefetcher (after
an untimed first one, as in training) that acquires every layer in order, with a simulated
compute of --compute-ms per layer on the compute stream (a GPU kernel that waits on the GPU's
timer with --device cuda, a sleeping stream worker on host). Each pass also reads the
layers alone (NVMe -> pinned, back to back into as many buffers as the prefetcher's staging
holds, no compute) and runs the compute alone, for the I/O and compute times of the same run.
With --source pinned the layers are pinned host copies instead (the offload_param "cpu" tier):
the prefetcher copies them to the device straight, and the reference is those copies alone
(back to back on a stream, into depth + 2 device buffers). Every byte is verified after the
timed passes unless --no-verify.)";

constexpr const char* kFooter = R"(
The wall time of a pass runs from the first acquire to the compute stream's last layer done.
Target: with depth >= 2 and I/O about equal to compute, wall <= 1.10 x max(compute, io);
with depth 0 the wall time is about compute + io. The same for --source pinned, with the
copies alone as io.

SIGINT, SIGTERM and SIGHUP stop the run between passes and remove its files (exit status 128 +
the signal's number, e.g. 130 for SIGINT).)";

struct Config {
  bool pinned_source = false;  // --source pinned
  std::vector<std::string> dirs;
  std::uint64_t layers = 32;
  std::uint64_t layer_bytes = 16ull << 20;
  double compute_ms = 0;
  std::uint64_t depth = 2;
  cuda::DeviceKind device = cuda::DeviceKind::kHost;
  double copy_gbps = 0;
  swap::IoEngineKind engine = swap::IoEngineKind::kAuto;
  std::uint64_t passes = 3;
  bool checksums = true;
  bool verify = true;
  bool json = false;
};

Config parse(const std::vector<std::string>& tokens, bool* help) {
  Config c;
  std::string source = "nvme", device = "host", engine = "auto", checksums = "on";
  bool no_verify = false;
  Cli cli("bench prefetch", kAbout, kFooter);
  cli.texts("--dir", c.dirs, "DIR",
            "directory for the layers (repeatable: striped over the directories)",
            "./zinf-scratch, created if missing");
  cli.count("--layers", c.layers, "number of layers");
  cli.size("--layer-bytes", c.layer_bytes, "bytes per layer; a multiple of 4096");
  cli.number("--compute-ms", c.compute_ms,
             "simulated compute per layer in ms (0 = the measured read time of one "
             "layer, so that I/O and compute are about equal)");
  cli.count("--depth", c.depth, "layers read ahead of the one computing; 0 = fetch on demand");
  cli.text("--source", source, "KIND",
           "nvme | pinned: layers read from a swap store on DIR, or copied from pinned host "
           "memory (--dir, --engine and --checksums are nvme's)");
  cli.text("--device", device, "KIND", "host | cuda | auto");
  cli.number("--copy-gbps", c.copy_gbps,
             "host device only: host->device copy bandwidth cap in GB/s (0 = none)");
  cli.text("--engine", engine, "KIND", "auto | uring | threads");
  cli.count("--passes", c.passes, "timed passes; medians are reported");
  cli.text("--checksums", checksums, "on|off",
           "CRC32C per stripe of the layers' swap store, verified on every read, "
           "as the library does by default; off measures the cost of that");
  cli.flag("--no-verify", no_verify, "skip the final read-back check");
  cli.flag("--json", c.json, "one JSON object on stdout instead of the table");
  *help = !cli.parse(tokens);
  if (*help) return c;
  c.device = cuda::parse_device_kind(device);
  c.engine = swap::parse_io_engine_kind(engine);
  c.checksums = parse_on_off(checksums, "--checksums");
  c.verify = !no_verify;
  if (source != "nvme" && source != "pinned") {
    throw UsageError("invalid --source '" + source + "': must be nvme or pinned");
  }
  c.pinned_source = source == "pinned";
  if (c.layers == 0 || c.layers > 100000) {
    throw UsageError("invalid --layers " + std::to_string(c.layers) +
                     ": must be between 1 and 100000");
  }
  if (c.layer_bytes == 0 || c.layer_bytes % kPatternSector != 0) {
    throw UsageError("invalid --layer-bytes " + std::to_string(c.layer_bytes) +
                     ": must be a positive multiple of 4096");
  }
  if (!(c.compute_ms >= 0) || c.compute_ms > 60000) {
    throw UsageError("invalid --compute-ms: must be between 0 and 60000");
  }
  if (c.depth > 1024)
    throw UsageError("invalid --depth " + std::to_string(c.depth) + ": at most 1024");
  if (!(c.copy_gbps >= 0)) throw UsageError("invalid --copy-gbps: must be >= 0");
  if (c.passes == 0 || c.passes > 1000) {
    throw UsageError("invalid --passes " + std::to_string(c.passes) +
                     ": must be between 1 and 1000");
  }
  if (!c.pinned_source) check_scratch_dirs(c.dirs);
  return c;
}

std::string layer_key(std::uint64_t l) { return "layer" + std::to_string(l); }

// Reads every layer alone (no compute, no copies): the I/O time of a pass, and the reference
// its wall time is held against. As in the pass, layers go back to back (the next read is
// submitted before the previous one is waited for, so the engine's queue stays full across
// layer boundaries) into `buffers` (>= 2) pinned buffers in turn, as many as the prefetcher's
// staging holds: the destination's footprint changes the rate. Reading every layer into one
// reused buffer measured up to 30% faster on the build VM than into rotating ones (3.1-3.2
// against 2.5-2.6 GB/s, alternated in the same minutes; likely the hypervisor copying into a
// buffer still in the host's cache), a rate no overlapped reader can have. With `verify`, each
// layer is checked once its read is waited for (so only untimed calls verify).
double read_alone(const Config& cfg, swap::SwapStore& store, swap::IoEngine& engine,
                  swap::BufferPool& pool, std::size_t buffers, bool verify) {
  std::span<std::byte> arena = pool.arena();
  (void)engine.register_buffers(std::span<const std::span<std::byte>>(&arena, 1));
  std::vector<swap::BufferLease> leases;
  for (std::size_t i = 0; i < buffers; ++i)
    leases.push_back(pool.acquire(store.padded_size(cfg.layer_bytes)));
  auto done = [&](swap::IoTicket& ticket, std::uint64_t l) {
    ticket.wait();
    if (!verify) return;
    std::string err = verify_block(leases[l % buffers].span().first(cfg.layer_bytes),
                                   static_cast<std::uint32_t>(l), 0, 1);
    if (!err.empty())
      throw Error("verification failed: layer " + std::to_string(l) + " read alone: " + err);
  };
  const auto start = Clock::now();
  swap::IoTicket previous;
  for (std::uint64_t l = 0; l < cfg.layers; ++l) {
    if (interrupted()) {
      // Stop with nothing in flight: the leases go back to the pool as this unwinds.
      if (l > 0) previous.wait();
      throw_if_interrupted();
    }
    swap::IoTicket ticket = store.swap_in(layer_key(l), leases[l % buffers].span());
    if (l > 0) done(previous, l - 1);
    previous = std::move(ticket);
  }
  done(previous, cfg.layers - 1);
  return seconds_since(start);
}

struct PassResult {
  double wall = 0;
  prefetch::PrefetcherStats stats;
};

std::chrono::nanoseconds per_layer_compute(const Config& cfg) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::duration<double, std::milli>(cfg.compute_ms));
}

// The compute alone: the layers' simulated compute back to back on the compute stream, as the
// prefetch pass enqueues it (Device::enqueue_busy: a kernel on CUDA, a sleeping worker on host),
// timed from the host. Its overheads (launches, the sleep's overshoot) are the pass's too.
double compute_alone(const Config& cfg, cuda::Device& device, cuda::StreamRef compute) {
  const auto start = Clock::now();
  for (std::uint64_t l = 0; l < cfg.layers; ++l)
    device.enqueue_busy(compute, per_layer_compute(cfg));
  device.synchronize(compute);
  return seconds_since(start);
}

// The pass counters of one iteration: `after` less `before` (the peak is the run's so far).
prefetch::PrefetcherStats pass_stats(const prefetch::PrefetcherStats& after,
                                     const prefetch::PrefetcherStats& before) {
  prefetch::PrefetcherStats d = after;
  d.acquires -= before.acquires;
  d.hits -= before.hits;
  d.on_demand -= before.on_demand;
  d.late_layers -= before.late_layers;
  d.stall_time -= before.stall_time;
  d.acquire_blocked_time -= before.acquire_blocked_time;
  d.retraces -= before.retraces;
  d.layers_issued -= before.layers_issued;
  d.evictions -= before.evictions;
  d.bytes_read -= before.bytes_read;
  d.bytes_to_device -= before.bytes_to_device;
  d.read_failures -= before.read_failures;
  d.read_busy_time -= before.read_busy_time;
  return d;
}

// The passes are consecutive iterations of one prefetcher, as a training run uses it, after
// one untimed iteration. Not a fresh prefetcher per pass: on the build VM memory fresh from
// the kernel copies up to 25x slower for its first ~100 ms of use even after it was
// prefaulted (a 32 MiB copy out of a just-touched MADV_HUGEPAGE buffer took 44-58 ms, then
// 2 ms), which charged each pass the first layers' copies at that rate. Between passes the
// window has read ahead into the next iteration (as in training); wait_for_reads() lets those
// reads finish before the references run. The clock starts at the first acquire.
class PassRunner {
 public:
  PassRunner(const Config& cfg, cuda::Device& device, cuda::StreamRef compute,
             std::unique_ptr<prefetch::LayerPrefetcher> prefetcher)
      : cfg_(cfg), device_(device), compute_(compute), prefetcher_(std::move(prefetcher)) {
    (void)run();  // warm-up
  }

  PassResult run() {
    PassResult r;
    const prefetch::PrefetcherStats before = prefetcher_->stats();
    const auto start = Clock::now();
    for (std::uint64_t l = 0; l < cfg_.layers; ++l) {
      (void)prefetcher_->acquire(l);
      device_.enqueue_busy(compute_, per_layer_compute(cfg_));
      prefetcher_->release(l);
    }
    device_.synchronize(compute_);
    r.wall = seconds_since(start);
    r.stats = pass_stats(prefetcher_->stats(), before);
    prefetcher_->end_iteration();
    prefetcher_->wait_for_reads();
    return r;
  }

 private:
  const Config& cfg_;
  cuda::Device& device_;
  cuda::StreamRef compute_;
  std::unique_ptr<prefetch::LayerPrefetcher> prefetcher_;
};

// Acquires every layer once more through `p` (a fresh prefetcher) and copies it back to the
// host, into `back` (at least a layer), to check every byte.
void verify_through_prefetcher(const Config& cfg, prefetch::LayerPrefetcher& p,
                               cuda::Device& device, cuda::StreamRef compute,
                               swap::BufferLease back) {
  cuda::PinnedRegistration pin = device.register_host(back.span());
  for (std::uint64_t l = 0; l < cfg.layers; ++l) {
    cuda::DeviceSpan span = p.acquire(l);
    device.copy_to_host(compute, back.span().first(cfg.layer_bytes), span);
    p.release(l);
    device.synchronize(compute);
    std::string err =
        verify_block(back.span().first(cfg.layer_bytes), static_cast<std::uint32_t>(l), 0, 1);
    if (!err.empty()) {
      throw Error("verification failed: layer " + std::to_string(l) + " on " +
                  std::string(device.name()) + ": " + err);
    }
  }
  pin.close().ignore("the buffer is returned right after; a failed unregister was logged");
}

// What the timed passes measured, for the report.
struct Measured {
  std::vector<double> walls, computes, sources, stalls, blocked;
  std::vector<PassResult> results;
  std::uint64_t padded = 0;  // bytes per layer the source moves (the store's padded size)
  bool auto_compute = false;
  std::string device;
  std::string engine;  // nvme only
};

// Alternates the source alone, the compute alone and prefetch passes (A B C A B C ...), so that
// drift on a shared machine hits all alike.
template <typename SourceAlone>
void run_passes(const Config& cfg, cuda::Device& device, cuda::StreamRef compute,
                PassRunner& runner, SourceAlone source_alone, Measured& m) {
  for (std::uint64_t pass = 0; pass < cfg.passes; ++pass) {
    throw_if_interrupted();  // between passes: the runner has waited for its reads
    m.sources.push_back(source_alone());
    m.computes.push_back(compute_alone(cfg, device, compute));
    PassResult r = runner.run();
    m.walls.push_back(r.wall);
    m.stalls.push_back(std::chrono::duration<double>(r.stats.stall_time).count());
    m.blocked.push_back(std::chrono::duration<double>(r.stats.acquire_blocked_time).count());
    m.results.push_back(r);
  }
  throw_if_interrupted();
}

void report(const Config& cfg, const Measured& m) {
  // The pass with the median wall time stands for the run (its counters come with it).
  const PassResult& mid = m.results[median_index(m.walls)];
  const double wall = mid.wall;
  const double compute_s = median(m.computes);
  const double io_s = median(m.sources);
  const double stall_s = median(m.stalls);
  const double bound = std::max(compute_s, io_s);
  const double total_bytes = static_cast<double>(cfg.layers * m.padded);
  // The reference the wall time is held against: NVMe reads alone, or copies alone.
  const char* io_name = cfg.pinned_source ? "copy" : "io";

  if (cfg.json) {
    Json j;
    j["bench"] = "prefetch";
    j["source"] = cfg.pinned_source ? "pinned" : "nvme";
    j["wall_seconds"] = wall;
    j["compute_seconds"] = compute_s;
    j[std::string(io_name) + "_seconds"] = io_s;
    j["stall_seconds"] = stall_s;
    j["acquire_blocked_seconds"] = median(m.blocked);
    j["depth"] = cfg.depth;
    j["wall_over_max"] = wall / bound;
    j["wall_over_sum"] = wall / (compute_s + io_s);
    j["layers"] = cfg.layers;
    j["layer_bytes"] = cfg.layer_bytes;
    j["compute_ms"] = cfg.compute_ms;
    j["compute_ms_auto"] = m.auto_compute;
    j["passes"] = cfg.passes;
    j["wall_seconds_passes"] = m.walls;
    j[std::string(io_name) + "_seconds_passes"] = m.sources;
    if (cfg.pinned_source) {
      j["copy_gbps_alone"] = total_bytes / io_s / 1e9;
    } else {
      j["checksums"] = cfg.checksums;
      j["read_gbps"] = total_bytes / io_s / 1e9;
      // The rate the reads ran at inside the prefetch pass (bytes over the time any read was
      // in flight): below read_gbps, the drive itself was slower while compute and copies ran.
      const double busy = std::chrono::duration<double>(mid.stats.read_busy_time).count();
      j["pass_read_gbps"] =
          busy > 0 ? static_cast<double>(mid.stats.bytes_read) / busy / 1e9 : 0.0;
    }
    j["hits"] = mid.stats.hits;
    j["on_demand"] = mid.stats.on_demand;
    j["late_layers"] = mid.stats.late_layers;
    j["peak_held_bytes"] = mid.stats.peak_held_bytes;
    j["device"] = m.device;
    j["copy_gbps"] = cfg.copy_gbps;
    if (!cfg.pinned_source) {
      j["engine"] = m.engine;
      j["dirs"] = cfg.dirs;
    }
    j["verified"] = cfg.verify;
    std::printf("%s\n", json_text(j).c_str());
  } else {
    if (cfg.pinned_source) {
      std::printf("zinf bench prefetch: source=pinned device=%s", m.device.c_str());
    } else {
      std::printf("zinf bench prefetch: device=%s engine=%s", m.device.c_str(), m.engine.c_str());
    }
    std::printf(" layers=%llu layer=%s depth=%llu compute=%.2f ms/layer%s passes=%llu",
                static_cast<unsigned long long>(cfg.layers), mib(cfg.layer_bytes).c_str(),
                static_cast<unsigned long long>(cfg.depth), cfg.compute_ms,
                m.auto_compute
                    ? (cfg.pinned_source ? " (= measured copy time)" : " (= measured read time)")
                    : "",
                static_cast<unsigned long long>(cfg.passes));
    if (!cfg.pinned_source) std::printf(" checksums=%s", cfg.checksums ? "on" : "off");
    std::printf(" verify=%s\n", cfg.verify ? "every byte" : "off");
    std::printf("%10s %10s %10s %10s %10s %10s %6s %6s\n", "wall s", "compute s",
                cfg.pinned_source ? "copy s" : "io s", "stall s", "wall/max", "wall/sum", "hits",
                "late");
    std::printf("%10.3f %10.3f %10.3f %10.3f %10.3f %10.3f %6llu %6llu\n", wall, compute_s, io_s,
                stall_s, wall / bound, wall / (compute_s + io_s),
                static_cast<unsigned long long>(mid.stats.hits),
                static_cast<unsigned long long>(mid.stats.late_layers));
    std::printf("(medians of %llu passes; %s alone %.2f GB/s)\n",
                static_cast<unsigned long long>(cfg.passes), cfg.pinned_source ? "copies" : "read",
                total_bytes / io_s / 1e9);
  }
}

// Copies every layer alone from its pinned host copy to the device (no compute): the
// reference of --source pinned. Back to back on one stream into `buffers` device buffers in
// turn, as many as the prefetcher's window holds, so the destination's footprint is the
// pass's.
double copy_alone(const Config& cfg, cuda::Device& device, cuda::StreamRef stream,
                  const std::vector<std::span<const std::byte>>& layers,
                  std::vector<cuda::DeviceBuffer>& buffers) {
  const auto start = Clock::now();
  for (std::uint64_t l = 0; l < cfg.layers; ++l) {
    device.copy_to_device(stream, buffers[l % buffers.size()].span(), layers[l]);
  }
  device.synchronize(stream);
  return seconds_since(start);
}

// --source pinned: the layers are pinned host copies (the offload_param "cpu" tier), copied to
// the device by a LayerPrefetcher with the host source.
int bench_pinned_source(Config& cfg) {
  cuda::DeviceOptions dopt;
  dopt.kind = cfg.device;
  dopt.host_copy_bandwidth_gbps = cfg.copy_gbps;
  auto device = cuda::make_device(dopt);
  cuda::Stream compute = device->create_stream();

  // Every layer's host copy in one pinned arena, stamped so that every byte can be checked.
  swap::BufferPoolOptions bo;
  bo.budget_bytes = cfg.layers * cfg.layer_bytes;
  bo.prefault = true;
  swap::BufferPool pool(bo);
  cuda::PinnedRegistration pinned = device->register_host(pool.arena());
  std::vector<swap::BufferLease> copies;
  std::vector<std::span<const std::byte>> layers;
  for (std::uint64_t l = 0; l < cfg.layers; ++l) {
    copies.push_back(pool.acquire(cfg.layer_bytes));
    fill_bulk(copies.back().span(), 1);
    stamp_headers(copies.back().span(), static_cast<std::uint32_t>(l), 0, 1);
    layers.push_back(copies.back().span());
    throw_if_interrupted();
  }

  // Untimed copies (warming the device buffers and the stream), then the timed reference; if
  // no compute time was given, one layer's copy time: copies about equal to compute.
  cuda::Stream copy_stream = device->create_stream();
  std::vector<cuda::DeviceBuffer> buffers;
  for (std::uint64_t i = 0; i < cfg.depth + 2; ++i)
    buffers.push_back(device->allocate(cfg.layer_bytes));
  (void)copy_alone(cfg, *device, copy_stream, layers, buffers);
  const double warm = copy_alone(cfg, *device, copy_stream, layers, buffers);
  Measured m;
  m.padded = cfg.layer_bytes;
  m.device = std::string(device->name());
  m.auto_compute = cfg.compute_ms == 0;
  if (m.auto_compute) cfg.compute_ms = warm / static_cast<double>(cfg.layers) * 1e3;

  prefetch::PrefetcherOptions po;
  for (std::uint64_t l = 0; l < cfg.layers; ++l) po.order.push_back(l);
  po.depth = cfg.depth;
  // Room for the window (depth + 1 layers) and the layer computing: the byte bound does not
  // bind before the depth does.
  po.max_bytes = (cfg.depth + 2) * cfg.layer_bytes;

  PassRunner runner(
      cfg, *device, compute.ref(),
      std::make_unique<prefetch::LayerPrefetcher>(po, layers, *device, compute.ref()));
  run_passes(
      cfg, *device, compute.ref(), runner,
      [&] { return copy_alone(cfg, *device, copy_stream, layers, buffers); }, m);
  if (cfg.verify) {
    prefetch::LayerPrefetcher p(po, layers, *device, compute.ref());
    // The read-back buffer outside the registered arena: the check pins it on its own.
    swap::BufferPoolOptions back;
    back.budget_bytes = cfg.layer_bytes;
    swap::BufferPool back_pool(back);
    verify_through_prefetcher(cfg, p, *device, compute.ref(), back_pool.acquire(cfg.layer_bytes));
  }
  report(cfg, m);
  return 0;
}

}  // namespace

int bench_prefetch_main(const std::vector<std::string>& tokens) {
  bool help = false;
  Config cfg = parse(tokens, &help);
  if (help) return 0;
  if (cfg.pinned_source) return bench_pinned_source(cfg);

  swap::IoOptions io;
  io.kind = cfg.engine;
  auto engine = swap::make_io_engine(io);
  swap::SwapStoreOptions so;
  so.directories = cfg.dirs;
  const std::uint64_t padded_guess = (cfg.layer_bytes + (1u << 20) - 1) / (1u << 20) * (1u << 20);
  so.capacity_bytes = padded_guess * cfg.layers;
  so.checksums = cfg.checksums;
  swap::SwapStore store(so, *engine);
  const std::uint64_t padded = store.padded_size(cfg.layer_bytes);

  // Lay the layers out (stamped so that every byte can be checked later).
  // The reads alone rotate over as many buffers as the prefetcher's staging holds (depth + 2
  // layers, see read_alone); the layout below and the final check use one of them.
  const std::size_t alone_buffers = static_cast<std::size_t>(cfg.depth) + 2;
  swap::BufferPoolOptions bo;
  bo.budget_bytes = alone_buffers * padded;
  bo.alignment = store.alignment();
  bo.prefault = true;
  swap::BufferPool pool(bo);
  {
    swap::BufferLease w = pool.acquire(padded);
    fill_bulk(w.span(), 1);
    for (std::uint64_t l = 0; l < cfg.layers; ++l) {
      store.allocate(layer_key(l), cfg.layer_bytes);
      stamp_headers(w.span().first(cfg.layer_bytes), static_cast<std::uint32_t>(l), 0, 1);
      store.swap_out(layer_key(l), w.span()).wait();
      throw_if_interrupted();
    }
  }

  cuda::DeviceOptions dopt;
  dopt.kind = cfg.device;
  dopt.host_copy_bandwidth_gbps = cfg.copy_gbps;
  auto device = cuda::make_device(dopt);
  cuda::Stream compute = device->create_stream();

  // Untimed read passes: the first checks every byte read alone, and warms what can be warmed
  // (page tables, the engine's threads); the second, if no compute time was given, sets it to
  // one layer's read time: I/O about equal to compute.
  (void)read_alone(cfg, store, *engine, pool, alone_buffers, cfg.verify);
  const double warm_io = read_alone(cfg, store, *engine, pool, alone_buffers, false);
  Measured m;
  m.padded = padded;
  m.device = std::string(device->name());
  m.engine = std::string(engine->name());
  m.auto_compute = cfg.compute_ms == 0;
  if (m.auto_compute) cfg.compute_ms = warm_io / static_cast<double>(cfg.layers) * 1e3;

  prefetch::PrefetcherOptions po;
  for (std::uint64_t l = 0; l < cfg.layers; ++l) po.layer_keys.push_back(layer_key(l));
  for (std::uint64_t l = 0; l < cfg.layers; ++l) po.order.push_back(l);
  po.depth = cfg.depth;
  // Room for the window (depth + 1 layers) and the layer computing, staging and device each:
  // the byte bound does not bind before the depth does.
  po.max_bytes = (cfg.depth + 2) * (padded + cfg.layer_bytes);
  po.prefault_staging = true;

  prefetch::PrefetcherOptions timed = po;
  timed.register_with_engine = engine.get();
  PassRunner runner(
      cfg, *device, compute.ref(),
      std::make_unique<prefetch::LayerPrefetcher>(timed, store, *device, compute.ref()));
  run_passes(
      cfg, *device, compute.ref(), runner,
      [&] { return read_alone(cfg, store, *engine, pool, alone_buffers, false); }, m);
  if (cfg.verify) {
    prefetch::LayerPrefetcher p(po, store, *device, compute.ref());
    verify_through_prefetcher(cfg, p, *device, compute.ref(), pool.acquire(padded));
  }
  report(cfg, m);
  return 0;
}

}  // namespace zinf::tools
