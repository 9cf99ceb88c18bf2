// SPDX-License-Identifier: Apache-2.0
#include "io_bench.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <mutex>
#include <utility>

#include "io_pattern.h"
#include "interrupt.h"
#include "zinf/common/error.h"
#include "zinf/swap/buffer_pool.h"
#include "zinf/swap/file.h"

namespace zinf::tools {

using Clock = std::chrono::steady_clock;

// Runs sequential passes of one op over all files with queue_depth requests in flight, the
// requests taking the buffer_bytes / block_size buffers in turn.
//
// Phases: fill the window with queue_depth requests, then each time a request completes (its
// callback pushes the slot onto `done`), verify its buffer (reads) and reuse the slot for the
// next block. Latency is submit -> the engine's completion time. Errors: the first failed
// ticket throws IoError (file, offset, length); a verification mismatch throws Error naming
// the file and offset. Bounded by buffer_bytes of buffers.
class IoBench::Runner {
 public:
  Runner(const IoBenchOptions& o, std::vector<swap::File> files, std::uint32_t alignment)
      : o_(o), files_(std::move(files)), engine_(swap::make_io_engine(o.io)), pool_([&] {
          swap::BufferPoolOptions po;
          po.budget_bytes = o.buffer_bytes;
          po.alignment = alignment;
          po.huge_pages = o.huge_pages;
          po.prefault = true;  // fault the pages in now, not during the first timed pass
          return po;
        }()) {
    std::span<std::byte> arena = pool_.arena();
    registered_ = engine_->register_buffers(std::span<const std::span<std::byte>>(&arena, 1));
    for (const auto& f : files_) ids_.push_back(engine_->attach(f));
    for (std::uint64_t i = 0; i < o.buffer_bytes / o.io.block_size; ++i) {
      slots_.push_back({pool_.acquire(o.io.block_size)});
    }
  }

  IoPassResult run(swap::IoOp op, std::uint64_t file_size, std::uint32_t generation,
                   bool timed_progress, const char* label) {
    const std::uint32_t block = o_.io.block_size;
    const std::uint64_t blocks_per_file = file_size / block;
    const std::uint64_t total_blocks = blocks_per_file * files_.size();
    const bool check = op == swap::IoOp::kRead && o_.verify;
    const bool stamp = op == swap::IoOp::kWrite;
    if (stamp) {
      for (auto& s : slots_) fill_bulk(s.lease.span(), generation);
    }
    IoPassResult result;
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
    // On a signal no more requests go out; those in flight complete (their buffers stay
    // theirs until then), and then the pass stops with Interrupted.
    bool stopping = false;
    while (completed < total_blocks) {
      stopping = stopping || interrupted();
      if (stopping && in_flight == 0) throw_if_interrupted();
      while (!stopping && !free_slots.empty() && next_block < total_blocks &&
             in_flight < o_.io.queue_depth) {
        std::size_t si = free_slots.front();
        free_slots.pop_front();
        Slot& s = slots_[si];
        s.file = static_cast<std::uint32_t>(next_block % files_.size());
        s.offset = (next_block / files_.size()) * block;
        ++next_block;
        ++in_flight;
        if (stamp) stamp_headers(s.lease.span(), s.file, s.offset, generation);
        swap::IoRequest req{op, ids_[s.file], s.offset, s.lease.span()};
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
      result.latencies_us.push_back(
          std::chrono::duration<double, std::micro>(at - s.submitted).count());
      if (check) {
        std::string err = verify_block(s.lease.span(), s.file, s.offset, generation);
        if (!err.empty()) {
          throw Error("verification failed: " + files_[s.file].path() + " offset=" +
                      std::to_string(s.offset) + " length=" + std::to_string(block) + ": " + err);
        }
      }
      ++completed;
      --in_flight;
      free_slots.push_back(si);
      if (progress && Clock::now() - last_progress > std::chrono::milliseconds(200)) {
        last_progress = Clock::now();
        double secs = std::chrono::duration<double>(last_progress - start).count();
        double gb = static_cast<double>(completed) * block / 1e9;
        std::fprintf(stderr, "\r  %s %5.1f%%  %6.2f GB/s ", label,
                     100.0 * static_cast<double>(completed) / static_cast<double>(total_blocks),
                     secs > 0 ? gb / secs : 0.0);
      }
    }
    result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    result.bytes = total_blocks * block;
    if (progress) std::fprintf(stderr, "\r%60s\r", "");
    return result;
  }

  swap::IoEngine& engine() { return *engine_; }
  bool huge_pages() const { return pool_.huge_pages(); }
  bool registered() const { return registered_; }

 private:
  struct Slot {
    swap::BufferLease lease;
    swap::IoTicket ticket{};
    std::uint32_t file = 0;
    std::uint64_t offset = 0;
    Clock::time_point submitted{};
  };
  const IoBenchOptions& o_;
  std::vector<swap::File> files_;
  std::unique_ptr<swap::IoEngine> engine_;
  swap::BufferPool pool_;
  std::vector<swap::FileId> ids_;
  bool registered_ = false;
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
  runner_ = std::make_unique<Runner>(options_, std::move(files), alignment);
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
  ++generation_;
  return runner_->run(swap::IoOp::kWrite, file_size_, generation_, progress, label);
}

IoPassResult IoBench::read(bool progress, const char* label) {
  if (generation_ == 0) throw UsageError("IoBench::read before any write");
  return runner_->run(swap::IoOp::kRead, file_size_, generation_, progress, label);
}

std::string_view IoBench::engine_name() const { return runner_->engine().name(); }
std::uint32_t IoBench::engine_threads() const { return runner_->engine().options().threads; }
bool IoBench::huge_pages() const noexcept { return runner_->huge_pages(); }

}  // namespace zinf::tools
