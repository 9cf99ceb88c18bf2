// SPDX-License-Identifier: Apache-2.0
// `zinf bench io`: sequential read/write bandwidth of the swap path (File + IoEngine +
// BufferPool) on the user's directories, verified byte for byte, in the shape fio reports.
#include <sys/statfs.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

#include "bench_common.h"
#include "bench_io_pattern.h"
#include "cli_args.h"
#include "commands.h"
#include "json_writer.h"
#include "zinf/common/error.h"
#include "zinf/cuda/device.h"
#include "zinf/swap/buffer_pool.h"
#include "zinf/swap/file.h"
#include "zinf/swap/io_engine.h"

namespace zinf::tools {
namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kHelp = R"(usage: zinf bench io [options]

Measures sequential O_DIRECT read and write bandwidth through zinf's I/O engine, with every byte
read back verified (a mismatch is an error, exit status 1).

  --dir DIR            directory to test (repeatable: blocks are striped over the files)
                       [default: ./zinf-scratch, created if missing]
  --size N             total bytes over all files [1G]; K/M/G/T = 1024^n, kB/MB/GB = 1000^n
  --block-size N       bytes per request [1M]; a multiple of the direct-I/O alignment
  --queue-depth N      requests kept in flight [16]
  --threads N          worker threads for --engine threads [0 = queue depth]
  --engine KIND        auto | uring | threads [auto]
  --op OP              read | write | both [both]
  --loops N            timed passes per op; the median is reported [3]
  --no-verify          do not check the data (faster, not recommended)
  --no-precondition    time writes into fresh (fallocated) space instead of overwrites
  --no-huge-pages      do not ask for 2 MiB pages for the buffers
  --buffer-bytes N     pinned memory the requests rotate over [queue depth x block size, as
                       fio]; set it to a pipeline's buffer ring (e.g. bench step's
                       pinned_bytes_peak) to measure the drive with that footprint
  --keep               keep the data files afterwards
  --json               one JSON object per op on stdout instead of the table

GB/s means 10^9 bytes per second.
)";

struct Config {
  std::vector<std::string> dirs;
  std::uint64_t size = 0;
  std::uint32_t block_size = 0;
  std::uint32_t queue_depth = 0;
  std::uint64_t buffer_bytes = 0;  // 0: queue_depth * block_size
  std::uint32_t threads = 0;
  swap::IoEngineKind engine = swap::IoEngineKind::kAuto;
  bool do_read = true;
  bool do_write = true;
  std::uint32_t loops = 3;
  bool verify = true;
  bool precondition = true;
  bool huge_pages = true;
  bool keep = false;
  bool json = false;
};

struct PassResult {
  double seconds = 0;
  std::uint64_t bytes = 0;
  std::vector<double> latencies_us;
};

struct OpSummary {
  std::string op;
  std::vector<double> gbps_per_loop;
  double seconds = 0;  // of the median loop
  std::uint64_t bytes = 0;
  double gbps = 0;
  double iops = 0;
  double lat_p50_us = 0;
  double lat_p99_us = 0;
};

std::uint32_t to_u32(std::uint64_t v, const char* what) {
  if (v == 0 || v > 0xffffffffull) {
    throw UsageError(std::string("invalid ") + what + ": must be between 1 and 4294967295");
  }
  return static_cast<std::uint32_t>(v);
}

Config parse(const std::vector<std::string>& tokens, bool* help) {
  Args a("bench io", tokens);
  Config c;
  *help = a.help();
  c.dirs = a.strings("dir");
  c.size = a.size("size", 1ull << 30);
  c.block_size = to_u32(a.size("block-size", 1u << 20), "--block-size");
  c.queue_depth = to_u32(a.uint("queue-depth", 16), "--queue-depth");
  c.threads = static_cast<std::uint32_t>(a.uint("threads", 0));
  c.engine = swap::parse_io_engine_kind(a.string("engine", "auto"));
  std::string op = a.string("op", "both");
  if (op == "read") {
    c.do_write = false;
  } else if (op == "write") {
    c.do_read = false;
  } else if (op != "both") {
    throw UsageError("invalid --op '" + op + "': expected read, write or both");
  }
  c.loops = to_u32(a.uint("loops", 3), "--loops");
  c.verify = !a.flag("no-verify");
  c.precondition = !a.flag("no-precondition");
  c.huge_pages = !a.flag("no-huge-pages");
  c.buffer_bytes = a.size("buffer-bytes", 0);
  c.keep = a.flag("keep");
  c.json = a.flag("json");
  a.finish();
  if (*help) return c;
  if (c.dirs.empty()) {
    c.dirs.push_back("./zinf-scratch");
    std::error_code ec;
    std::filesystem::create_directories(c.dirs[0], ec);
  }
  for (const auto& d : c.dirs) check_dir(d);
  if (c.block_size % 4096 != 0) {
    throw UsageError("invalid --block-size " + std::to_string(c.block_size) +
                     ": must be a multiple of 4096 (the direct-I/O alignment zinf uses)");
  }
  const std::uint64_t window = std::uint64_t{c.queue_depth} * c.block_size;
  if (c.buffer_bytes == 0) c.buffer_bytes = window;
  if (c.buffer_bytes < window || c.buffer_bytes % c.block_size != 0) {
    throw UsageError("invalid --buffer-bytes " + std::to_string(c.buffer_bytes) +
                     ": must be a multiple of --block-size and at least queue depth x block size (" +
                     std::to_string(window) + ")");
  }
  if (c.size < std::uint64_t{c.block_size} * c.dirs.size()) {
    throw UsageError("--size " + std::to_string(c.size) + " is smaller than one block per file (" +
                     std::to_string(std::uint64_t{c.block_size} * c.dirs.size()) + " bytes)");
  }
  return c;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  std::size_t idx = static_cast<std::size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(idx, v.size() - 1)];
}

// Runs one sequential pass of `op` over all files with `queue_depth` requests in flight, the
// requests taking the buffer_bytes / block_size buffers in turn.
//
// Phases: fill the window with queue_depth requests, then each time a request completes (its
// callback pushes the slot onto `done`), verify its buffer (reads) and reuse the slot for the
// next block. Latency is submit -> the engine's completion time. Errors: the first failed
// ticket throws IoError (file, offset, length); a verification mismatch throws Error naming
// the file and offset. Bounded by buffer_bytes of buffers.
class Runner {
 public:
  Runner(const Config& cfg, swap::IoEngine& engine, swap::BufferPool& pool,
         std::vector<swap::File>& files, std::vector<swap::FileId>& ids, std::uint64_t file_size)
      : cfg_(cfg), engine_(engine), files_(files), ids_(ids), file_size_(file_size) {
    for (std::uint64_t i = 0; i < cfg.buffer_bytes / cfg.block_size; ++i) {
      slots_.push_back({pool.acquire(cfg.block_size)});
    }
  }

  PassResult run(swap::IoOp op, std::uint32_t generation, bool timed_progress, const char* label) {
    const std::uint64_t blocks_per_file = file_size_ / cfg_.block_size;
    const std::uint64_t total_blocks = blocks_per_file * files_.size();
    const bool check = op == swap::IoOp::kRead && cfg_.verify;
    const bool stamp = op == swap::IoOp::kWrite;
    if (stamp) {
      for (auto& s : slots_) fill_bulk(s.lease.span(), generation);
    }
    PassResult result;
    result.latencies_us.reserve(total_blocks);
    std::uint64_t next_block = 0;
    std::uint64_t completed = 0;
    std::uint64_t in_flight = 0;
    // FIFO: a finished buffer goes to the back, so every buffer of the footprint takes turns.
    std::deque<std::size_t> free_slots;
    for (std::size_t i = 0; i < slots_.size(); ++i) free_slots.push_back(i);
    const bool progress = timed_progress && ::isatty(STDERR_FILENO) != 0;
    auto last_progress = Clock::now();
    const auto start = Clock::now();
    while (completed < total_blocks) {
      while (!free_slots.empty() && next_block < total_blocks && in_flight < cfg_.queue_depth) {
        std::size_t si = free_slots.front();
        free_slots.pop_front();
        Slot& s = slots_[si];
        s.file = static_cast<std::uint32_t>(next_block % files_.size());
        s.offset = (next_block / files_.size()) * cfg_.block_size;
        ++next_block;
        ++in_flight;
        if (stamp) stamp_headers(s.lease.span(), s.file, s.offset, generation);
        swap::IoRequest req{op, ids_[s.file], s.offset, s.lease.span()};
        s.submitted = Clock::now();
        s.ticket = engine_.submit(std::span<const swap::IoRequest>(&req, 1), [this, si](const Status&) {
          {
            std::lock_guard lock(mu_);
            done_.push_back(si);
          }
          cv_.notify_one();
        });
      }
      std::size_t si = 0;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return !done_.empty(); });
        si = done_.front();
        done_.pop_front();
      }
      Slot& s = slots_[si];
      s.ticket.wait();  // throws IoError naming file, offset and length
      auto at = s.ticket.completed_at().value_or(Clock::now());
      result.latencies_us.push_back(std::chrono::duration<double, std::micro>(at - s.submitted).count());
      if (check) {
        std::string err = verify_block(s.lease.span(), s.file, s.offset, generation);
        if (!err.empty()) {
          throw Error("verification failed: " + files_[s.file].path() + " offset=" +
                      std::to_string(s.offset) + " length=" + std::to_string(cfg_.block_size) +
                      ": " + err);
        }
      }
      ++completed;
      --in_flight;
      free_slots.push_back(si);
      if (progress && Clock::now() - last_progress > std::chrono::milliseconds(200)) {
        last_progress = Clock::now();
        double secs = std::chrono::duration<double>(last_progress - start).count();
        double gb = static_cast<double>(completed) * cfg_.block_size / 1e9;
        std::fprintf(stderr, "\r  %s %5.1f%%  %6.2f GB/s ", label,
                     100.0 * static_cast<double>(completed) / static_cast<double>(total_blocks),
                     secs > 0 ? gb / secs : 0.0);
      }
    }
    result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    result.bytes = total_blocks * cfg_.block_size;
    if (progress) std::fprintf(stderr, "\r%60s\r", "");
    return result;
  }

 private:
  struct Slot {
    swap::BufferLease lease;
    swap::IoTicket ticket{};
    std::uint32_t file = 0;
    std::uint64_t offset = 0;
    Clock::time_point submitted{};
  };
  const Config& cfg_;
  swap::IoEngine& engine_;
  std::vector<swap::File>& files_;
  std::vector<swap::FileId>& ids_;
  std::uint64_t file_size_;
  std::vector<Slot> slots_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::size_t> done_;
};

OpSummary summarize(const std::string& op, const std::vector<PassResult>& passes,
                    std::uint32_t block_size) {
  OpSummary s;
  s.op = op;
  std::vector<double> lat;
  for (const auto& p : passes) {
    s.gbps_per_loop.push_back(static_cast<double>(p.bytes) / p.seconds / 1e9);
    lat.insert(lat.end(), p.latencies_us.begin(), p.latencies_us.end());
  }
  // The median loop by bandwidth stands for the op (loops are few and noisy here).
  std::vector<std::size_t> order(passes.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](std::size_t a, std::size_t b) { return s.gbps_per_loop[a] < s.gbps_per_loop[b]; });
  const PassResult& mid = passes[order[order.size() / 2]];
  s.seconds = mid.seconds;
  s.bytes = mid.bytes;
  s.gbps = static_cast<double>(mid.bytes) / mid.seconds / 1e9;
  s.iops = static_cast<double>(mid.bytes / block_size) / mid.seconds;
  s.lat_p50_us = percentile(lat, 0.50);
  s.lat_p99_us = percentile(lat, 0.99);
  return s;
}

}  // namespace

int bench_io_main(const std::vector<std::string>& tokens) {
  bool help = false;
  Config cfg = parse(tokens, &help);
  if (help) {
    std::fputs(kHelp, stdout);
    return 0;
  }

  const auto file_count = static_cast<std::uint64_t>(cfg.dirs.size());
  const std::uint64_t file_size = cfg.size / file_count / cfg.block_size * cfg.block_size;

  std::vector<swap::File> files;
  std::vector<std::string> paths;
  for (std::size_t i = 0; i < cfg.dirs.size(); ++i) {
    std::string path = cfg.dirs[i] + "/zinf-bench-io." + std::to_string(i) + ".dat";
    swap::FileOptions fo;
    fo.create = true;
    fo.preallocate_bytes = file_size;
    files.push_back(swap::File::open(path, fo));
    paths.push_back(path);
  }
  // Removes the data files on every way out unless --keep.
  struct Cleanup {
    const std::vector<std::string>& paths;
    bool keep;
    ~Cleanup() {
      if (keep) return;
      for (const auto& p : paths) std::remove(p.c_str());
    }
  } cleanup{paths, cfg.keep};

  std::uint32_t alignment = 4096;
  bool direct = true;
  for (const auto& f : files) {
    alignment = std::max(alignment, f.alignment());
    direct = direct && f.is_direct();
  }
  if (cfg.block_size % alignment != 0) {
    throw UsageError("invalid --block-size " + std::to_string(cfg.block_size) +
                     ": must be a multiple of the direct-I/O alignment " + std::to_string(alignment) +
                     " of " + cfg.dirs[0]);
  }

  swap::IoOptions io;
  io.kind = cfg.engine;
  io.block_size = cfg.block_size;
  io.queue_depth = cfg.queue_depth;
  io.threads = cfg.threads;
  auto engine = swap::make_io_engine(io);

  swap::BufferPoolOptions po;
  po.budget_bytes = cfg.buffer_bytes;
  po.alignment = alignment;
  po.huge_pages = cfg.huge_pages;
  po.prefault = true;  // fault the pages in now, not during the first timed pass
  swap::BufferPool pool(po);
  std::span<std::byte> arena = pool.arena();
  bool registered = engine->register_buffers(std::span<const std::span<std::byte>>(&arena, 1));

  std::vector<swap::FileId> ids;
  for (const auto& f : files) ids.push_back(engine->attach(f));

  Runner runner(cfg, *engine, pool, files, ids, file_size);
  std::uint32_t generation = 1;
  // Reads need data on disk, and steady-state writes need blocks written before (an optimizer
  // overwrites its state every step): one untimed pass lays the files out.
  if (cfg.do_read || cfg.precondition) {
    runner.run(swap::IoOp::kWrite, generation, !cfg.json, "precondition");
  }

  std::vector<OpSummary> summaries;
  if (cfg.do_write) {
    std::vector<PassResult> passes;
    for (std::uint32_t l = 0; l < cfg.loops; ++l) {
      ++generation;
      passes.push_back(runner.run(swap::IoOp::kWrite, generation, !cfg.json, "write"));
    }
    summaries.push_back(summarize("write", passes, cfg.block_size));
  }
  if (cfg.do_read) {
    std::vector<PassResult> passes;
    for (std::uint32_t l = 0; l < cfg.loops; ++l) {
      passes.push_back(runner.run(swap::IoOp::kRead, generation, !cfg.json, "read"));
    }
    summaries.push_back(summarize("read", passes, cfg.block_size));
  }

  const std::string fs = fs_type_name(cfg.dirs[0]);
  if (cfg.json) {
    // What the machine has, for reading figures later; this benchmark never touches a GPU.
    const cuda::CudaAvailability gpu = cuda::probe_cuda();
    const std::string gpu_text = gpu.available() ? std::to_string(gpu.device_count) + " CUDA device(s)"
                                                 : "none (" + gpu.reason + ")";
    for (const auto& s : summaries) {
      JsonWriter j;
      j.field("op", s.op);
      j.field("engine", std::string(engine->name()));
      j.field("bytes", s.bytes);
      j.field("seconds", s.seconds);
      j.field("gbps", s.gbps);
      j.field("iops", s.iops);
      j.field("lat_p50_us", s.lat_p50_us);
      j.field("lat_p99_us", s.lat_p99_us);
      j.field("block_size", std::uint64_t{cfg.block_size});
      j.field("queue_depth", std::uint64_t{cfg.queue_depth});
      j.field("buffer_bytes", cfg.buffer_bytes);
      j.field("threads", std::uint64_t{engine->options().threads});
      j.field("direct", direct);
      j.field("huge_pages", pool.huge_pages());
      j.field("registered_buffers", registered);
      j.field("verified", s.op == "read" ? cfg.verify : false);
      j.field("precondition", cfg.precondition);
      j.field("loops", std::uint64_t{cfg.loops});
      j.field("gbps_loops", s.gbps_per_loop);
      j.field("files", file_count);
      j.field("dirs", cfg.dirs);
      j.field("file_system", fs);
      j.field("kernel", kernel_release());
      j.field("cpu", cpu_model());
      j.field("gpu", gpu_text);
      std::printf("%s\n", j.str().c_str());
    }
  } else {
    std::printf("zinf bench io: engine=%.*s files=%zu size=%.2f GiB block=%u KiB qd=%u direct=%s "
                "huge_pages=%s registered=%s fs=%s verify=%s\n",
                static_cast<int>(engine->name().size()), engine->name().data(), files.size(),
                static_cast<double>(file_size * file_count) / (1u << 30), cfg.block_size / 1024,
                cfg.queue_depth, direct ? "yes" : "no", pool.huge_pages() ? "yes" : "no",
                registered ? "yes" : "no", fs.c_str(), cfg.verify ? "every byte" : "off");
    std::printf("%-6s %14s %10s %10s %10s   %s\n", "op", "GB/s (1e9B/s)", "IOPS", "p50 us",
                "p99 us", "GB/s per loop");
    for (const auto& s : summaries) {
      std::string per;
      for (double g : s.gbps_per_loop) {
        char b[16];
        std::snprintf(b, sizeof b, "%.2f ", g);
        per += b;
      }
      std::printf("%-6s %14.2f %10.0f %10.0f %10.0f   %s\n", s.op.c_str(), s.gbps, s.iops,
                  s.lat_p50_us, s.lat_p99_us, per.c_str());
    }
  }
  return 0;
}

}  // namespace zinf::tools
