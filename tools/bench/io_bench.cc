// SPDX-License-Identifier: Apache-2.0
#include "io_bench.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <mutex>
#include <numeric>
#include <random>
#include <utility>

#include "io_pattern.h"
#include "progress.h"
#include "interrupt.h"
#include "zinf/common/error.h"
#include "zinf/swap/buffer_pool.h"
#include "zinf/swap/file.h"

namespace zinf::tools {

using Clock = std::chrono::steady_clock;

// Runs one IoRunSpec over all files with queue_depth requests in flight, the requests taking
// the buffer_bytes / block_size buffers in turn. Blocks are numbered over all files (block b is
// in file b % n at offset (b / n) * block_size) and visited in `order_`: file order, or a
// permutation drawn from the seed, redrawn each lap.
//
// Phases: fill the window with queue_depth requests, then each time a request completes (its
// callback pushes the slot onto `done`), verify its buffer (reads) and reuse the slot for the
// next block, until one lap is issued (or, time-based, until the duration has passed) and all
// have completed. No two requests in flight share a block (a read racing a write of its block
// could not be verified): when a short lap wraps onto a block still in flight, issuing waits.
// Latency is submit -> the engine's completion time. Errors: the first failed ticket throws
// IoError (file, offset, length); a verification mismatch throws Error naming the file and
// offset. Bounded by buffer_bytes of buffers and the per-block tables.
class IoBench::Runner {
 public:
  Runner(const IoBenchOptions& o, std::vector<swap::File> files, std::uint32_t alignment,
         std::uint64_t blocks)
      : o_(o),
        files_(std::move(files)),
        engine_(swap::make_io_engine(o.io)),
        pool_([&] {
          swap::BufferPoolOptions po;
          po.budget_bytes = o.buffer_bytes;
          po.alignment = alignment;
          po.huge_pages = o.huge_pages;
          po.prefault = true;  // fault the pages in now, not during the first timed pass
          return po;
        }()),
        written_(blocks, 0),
        busy_(blocks, 0) {
    std::span<std::byte> arena = pool_.arena();
    registered_ = engine_->register_buffers(std::span<const std::span<std::byte>>(&arena, 1));
    for (const auto& f : files_) ids_.push_back(engine_->attach(f));
    for (std::uint64_t i = 0; i < o.buffer_bytes / o.io.block_size; ++i) {
      slots_.push_back({pool_.acquire(o.io.block_size)});
    }
  }

  IoPassResult run(const IoRunSpec& spec, std::uint32_t generation, bool timed_progress,
                   const char* label) {
    const std::uint32_t block = o_.io.block_size;
    const std::uint64_t total_blocks = written_.size();
    const bool timed = spec.duration.count() > 0;
    const bool mixed = spec.read_share > 0 && spec.read_share < 1;
    std::mt19937_64 rng(spec.seed);
    if (spec.random) {
      if (order_.size() != total_blocks) order_.resize(total_blocks);
      std::iota(order_.begin(), order_.end(), std::uint64_t{0});
      shuffle(rng);
    }
    Direction dirs[2];  // [0] reads, [1] writes
    std::uint64_t issued = 0;
    std::uint64_t cursor = 0;  // position in the lap
    std::uint64_t in_flight = 0;
    const std::uint64_t window = std::min<std::uint64_t>(o_.io.queue_depth, total_blocks);
    // FIFO: a finished buffer goes to the back, so every buffer of the footprint takes turns.
    std::deque<std::size_t> free_slots;
    for (std::size_t i = 0; i < slots_.size(); ++i) free_slots.push_back(i);
    // The shared progress line (silent unless stderr is a terminal): seconds of a time-based
    // run with its rate, or gigabytes of a lap.
    const double duration_s = std::chrono::duration<double>(spec.duration).count();
    Progress progress(label, timed ? duration_s : static_cast<double>(total_blocks) * block / 1e9,
                      timed ? "s" : "GB", timed_progress);
    progress.set_digits(timed ? 1 : 2);
    auto last_progress = Clock::now();
    const auto start = Clock::now();
    const auto deadline = start + spec.duration;
    auto next_sample = start + spec.sample_interval;
    // On a signal no more requests go out; those in flight complete (their buffers stay
    // theirs until then), and then the run stops with Interrupted.
    bool stopping = false;
    for (;;) {
      stopping = stopping || interrupted();
      if (stopping && in_flight == 0) throw_if_interrupted();
      const bool more = !stopping && (timed ? Clock::now() < deadline : issued < total_blocks);
      if (!more && in_flight == 0) break;
      while (more && (timed || issued < total_blocks) && !free_slots.empty() &&
             in_flight < window) {
        const std::uint64_t b = spec.random ? order_[cursor] : cursor;
        if (busy_[b] != 0) break;  // a short lap wrapped onto a block still in flight
        const bool read = spec.read_share >= 1 || (mixed && draw(rng) < spec.read_share);
        if (read && written_[b] == 0) {
          throw Error("IoBench: a read of block " + std::to_string(b) + " before any write");
        }
        std::size_t si = free_slots.front();
        free_slots.pop_front();
        Slot& s = slots_[si];
        s.block = b;
        s.read = read;
        s.file = static_cast<std::uint32_t>(b % files_.size());
        s.offset = (b / files_.size()) * block;
        busy_[b] = 1;
        if (++cursor == total_blocks) {
          cursor = 0;
          if (spec.random && timed) shuffle(rng);  // the next lap's order
        }
        ++issued;
        ++in_flight;
        if (!read) {
          if (s.body != generation) fill_bulk(s.lease.span(), generation);
          s.body = generation;
          stamp_headers(s.lease.span(), s.file, s.offset, generation);
          written_[b] = generation;
        } else {
          s.body = 0;  // the read overwrites the buffer: refill it before it is written
        }
        swap::IoRequest req{read ? swap::IoOp::kRead : swap::IoOp::kWrite, ids_[s.file], s.offset,
                            s.lease.span()};
        s.submitted = Clock::now();
        s.ticket =
            engine_->submit(std::span<const swap::IoRequest>(&req, 1), [this, si](const Status&) {
              {
                std::lock_guard lock(mu_);
                done_.push_back(si);
              }
              cv_.notify_one();
            });
      }
      if (in_flight == 0) continue;
      std::size_t si = 0;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return !done_.empty(); });
        si = done_.front();
        done_.pop_front();
      }
      Slot& s = slots_[si];
      s.ticket.wait();  // throws IoError naming file, offset and length
      const auto now = Clock::now();
      auto at = s.ticket.completed_at().value_or(now);
      Direction& d = dirs[s.read ? 0 : 1];
      d.keep_latency(std::chrono::duration<double, std::micro>(at - s.submitted).count(), rng);
      if (s.read && o_.verify) {
        std::string err = verify_block(s.lease.span(), s.file, s.offset, written_[s.block]);
        if (!err.empty()) {
          throw Error("verification failed: " + files_[s.file].path() + " offset=" +
                      std::to_string(s.offset) + " length=" + std::to_string(block) + ": " + err);
        }
      }
      busy_[s.block] = 0;
      --in_flight;
      free_slots.push_back(si);
      if (timed) {
        // Completions count in the interval they are seen in; an interval with none is a
        // sample of 0 bytes (the drive stalled).
        for (; now >= next_sample; next_sample += spec.sample_interval) {
          for (Direction& x : dirs) x.close_sample(next_sample - start, spec.sample_interval);
        }
      }
      d.bytes += block;
      d.sample_bytes += block;
      // Checked here first: the line is redrawn twice a second, and a completion comes every
      // few microseconds.
      if (progress.enabled() && now - last_progress > std::chrono::milliseconds(200)) {
        last_progress = now;
        const double secs = std::chrono::duration<double>(now - start).count();
        const double gb = static_cast<double>(dirs[0].bytes + dirs[1].bytes) / 1e9;
        if (timed) {
          char rate[32];
          std::snprintf(rate, sizeof rate, "%.2f GB/s", secs > 0 ? gb / secs : 0.0);
          progress.update(std::min(secs, duration_s), rate);
        } else {
          progress.update(gb);
        }
      }
    }
    IoPassResult result = collect(dirs, spec, start, next_sample);
    progress.finish();
    return result;
  }

  swap::IoEngine& engine() { return *engine_; }
  bool huge_pages() const { return pool_.huge_pages(); }
  bool registered() const { return registered_; }

 private:
  struct Slot {
    swap::BufferLease lease;
    swap::IoTicket ticket{};
    std::uint64_t block = 0;
    std::uint32_t file = 0;
    std::uint64_t offset = 0;
    bool read = false;
    std::uint32_t body = 0;  // the generation whose body the buffer holds; 0: none
    Clock::time_point submitted{};
  };
  // One direction's figures in a run.
  struct Direction {
    std::uint64_t bytes = 0;
    std::uint64_t sample_bytes = 0;  // in the open sample
    std::uint64_t seen = 0;          // latencies offered, for the uniform sample
    std::vector<double> latencies_us;
    std::vector<ThroughputSample> samples;
    // Keeps every latency up to kMaxLatencies, then a uniform sample of all (reservoir).
    void keep_latency(double us, std::mt19937_64& rng) {
      ++seen;
      if (latencies_us.size() < IoPassResult::kMaxLatencies) {
        latencies_us.push_back(us);
      } else if (const std::uint64_t j = rng() % seen; j < latencies_us.size()) {
        latencies_us[j] = us;
      }
    }
    void close_sample(Clock::duration end, Clock::duration length) {
      ThroughputSample t;
      t.end_s = std::chrono::duration<double>(end).count();
      t.seconds = std::chrono::duration<double>(length).count();
      t.bytes = sample_bytes;
      t.cumulative_bytes = bytes;
      samples.push_back(t);
      sample_bytes = 0;
    }
  };

  // The run's figures once its last request is done: the time-based run's last samples (the
  // whole intervals up to now, then the part of one left if it is long enough to stand for a
  // rate), the bytes, the latencies and the samples of each direction.
  static IoPassResult collect(Direction (&dirs)[2], const IoRunSpec& spec, Clock::time_point start,
                              Clock::time_point next_sample) {
    const auto end = Clock::now();
    IoPassResult r;
    if (spec.duration.count() > 0) {
      // The whole intervals up to the end (the last completions may precede it), then the
      // part of one left, if it is long enough to stand for a rate.
      for (; end >= next_sample; next_sample += spec.sample_interval) {
        for (Direction& x : dirs) x.close_sample(next_sample - start, spec.sample_interval);
      }
      const auto open = next_sample - spec.sample_interval;
      if (end - open >= spec.sample_interval / 2) {
        for (Direction& x : dirs) x.close_sample(end - start, end - open);
      }
    }
    r.seconds = std::chrono::duration<double>(end - start).count();
    r.read_bytes = dirs[0].bytes;
    r.write_bytes = dirs[1].bytes;
    r.bytes = r.read_bytes + r.write_bytes;
    r.read_latencies_us = std::move(dirs[0].latencies_us);
    r.write_latencies_us = std::move(dirs[1].latencies_us);
    if (spec.read_share > 0) r.read_samples = std::move(dirs[0].samples);
    if (spec.read_share < 1) r.write_samples = std::move(dirs[1].samples);
    return r;
  }
  // A uniform double in [0, 1) from the top 53 bits: the same draws on every platform (the
  // standard distributions are not specified bit for bit).
  static double draw(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }
  // Fisher-Yates over order_, with the same draws on every platform.
  void shuffle(std::mt19937_64& rng) {
    for (std::uint64_t i = order_.size(); i > 1; --i) std::swap(order_[i - 1], order_[rng() % i]);
  }
  const IoBenchOptions& o_;
  std::vector<swap::File> files_;
  std::unique_ptr<swap::IoEngine> engine_;
  swap::BufferPool pool_;
  std::vector<swap::FileId> ids_;
  bool registered_ = false;
  std::vector<std::uint32_t> written_;  // per block: the generation on disk; 0 never written
  std::vector<std::uint8_t> busy_;      // per block: a request in flight
  std::vector<std::uint64_t> order_;    // random runs: the lap's order of blocks
  // Declared after the pool and engine: leases go back to the pool, and tickets are done,
  // before either is torn down.
  std::vector<Slot> slots_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::size_t> done_;
};

IoBench::IoBench(IoBenchOptions options) : options_(std::move(options)) {
  const std::uint32_t block = options_.io.block_size;
  const std::uint64_t count = options_.dirs.size();
  if (count == 0 || block == 0 || options_.size < std::uint64_t{block} * count) {
    throw UsageError("--size " + std::to_string(options_.size) +
                     " is smaller than one block per file (" +
                     std::to_string(std::uint64_t{block} * count) + " bytes)");
  }
  if (options_.buffer_bytes == 0)
    options_.buffer_bytes = std::uint64_t{options_.io.queue_depth} * block;
  file_size_ = options_.size / count / block * block;

  std::vector<swap::File> files;
  std::uint32_t alignment = 4096;
  for (std::size_t i = 0; i < options_.dirs.size(); ++i) {
    // Each directory opened once; the file is created relative to it, never through a link.
    swap::Dir dir = swap::Dir::open(options_.dirs[i]);
    swap::FileOptions fo;
    fo.preallocate_bytes = file_size_;
    if (options_.keep) {
      std::string name = swap::unique_name(options_.file_stem + "-") + ".dat";
      // Recorded before the creation, so that a failed preallocation removes the file; and
      // forgotten again if the name was taken (then the file is not ours).
      named_.names.push_back(name);
      named_.dirs.push_back(std::move(dir));
      try {
        files.push_back(swap::File::create_exclusive(named_.dirs.back(), name, fo));
      } catch (const IoError& e) {
        if (e.sys_errno() == EEXIST) named_.names.pop_back();
        if (e.sys_errno() == EEXIST) named_.dirs.pop_back();
        throw;
      }
    } else {
      files.push_back(swap::File::create_unnamed(
          dir, options_.file_stem + "." + std::to_string(i) + ".dat", fo));
    }
    direct_ = direct_ && files.back().is_direct();
    alignment = std::max(alignment, files.back().alignment());
  }
  if (block % alignment != 0) {
    throw UsageError("invalid --block-size " + std::to_string(block) +
                     ": must be a multiple of the direct-I/O alignment " +
                     std::to_string(alignment) + " of " + options_.dirs[0]);
  }
  runner_ =
      std::make_unique<Runner>(options_, std::move(files), alignment, file_size_ / block * count);
  registered_ = runner_->registered();
}

IoBench::~IoBench() = default;

IoBench::Named::~Named() {
  if (keep) return;
  for (std::size_t i = 0; i < names.size(); ++i) {
    try {
      (void)dirs[i].remove_file(names[i]);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "zinf: warning: %s\n", e.what());
    }
  }
}

std::vector<std::string> IoBench::keep_files() {
  if (!options_.keep) throw UsageError("IoBench::keep_files without options.keep");
  named_.keep = true;
  std::vector<std::string> paths;
  for (std::size_t i = 0; i < named_.names.size(); ++i)
    paths.push_back(named_.dirs[i].path_of(named_.names[i]));
  return paths;
}

IoPassResult IoBench::write(bool progress, const char* label) {
  return run(IoRunSpec{}, progress, label);
}

IoPassResult IoBench::read(bool progress, const char* label) {
  IoRunSpec spec;
  spec.read_share = 1;
  return run(spec, progress, label);
}

IoPassResult IoBench::run(const IoRunSpec& spec, bool progress, const char* label) {
  if (spec.read_share > 0 && generation_ == 0) throw UsageError("IoBench: a read before any write");
  if (spec.read_share < 1) ++generation_;
  return runner_->run(spec, generation_, progress, label);
}

std::string_view IoBench::engine_name() const { return runner_->engine().name(); }
std::uint32_t IoBench::engine_threads() const { return runner_->engine().options().threads; }
bool IoBench::huge_pages() const noexcept { return runner_->huge_pages(); }

}  // namespace zinf::tools
