// SPDX-License-Identifier: Apache-2.0
// The measuring core of `zinf bench io`: O_DIRECT runs over one data file per directory through
// zinf's own File + IoEngine + BufferPool, sequential or in a seeded random order, reads, writes
// or a mix, one pass over every block or laps for a given time with per-second samples; every
// byte written with a checkable pattern and verified on read. `zinf bench step --reference` runs
// the same passes between its steps, so that the drive rates a step is judged by come from this
// code and the same moment.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "throughput.h"
#include "zinf/swap/dir.h"
#include "zinf/swap/io_engine.h"

namespace zinf::tools {

struct IoBenchOptions {
  std::vector<std::string> dirs;   ///< one data file each; must exist and be writable
  std::uint64_t size = 0;          ///< bytes over all files (rounded down to whole blocks per file)
  swap::IoOptions io;              ///< engine kind, block size (bytes per request), queue depth
  std::uint64_t buffer_bytes = 0;  ///< pinned memory the requests rotate over; 0: qd x block (fio)
  bool huge_pages = true;          ///< ask for 2 MiB pages for the buffers
  bool verify = true;              ///< check every byte read
  /// Give the data files names (<stem>-<pid>-<random>.dat, created exclusively) so that
  /// keep_files() can leave them in place. Otherwise they have no name at all
  /// (File::create_unnamed): two runs in one directory never share a file, no link planted in
  /// a directory is followed, and a killed run leaves nothing behind.
  bool keep = false;
  std::string file_stem = "zinf-bench-io";  ///< names them, in messages and when kept
};

/// What one run does.
struct IoRunSpec {
  /// The share of requests that are reads: 0 writes only, 1 reads only; in between each
  /// request is a read with this probability (drawn from the seeded generator).
  double read_share = 0;
  /// Visit the blocks in a random order drawn from `seed` (each block once per lap, as fio's
  /// random map) instead of in file order.
  bool random = false;
  std::uint64_t seed = 1;
  /// 0: one lap over every block. Otherwise laps over the files until this much time has
  /// passed (no new request after it; those in flight complete), with samples.
  std::chrono::milliseconds duration{0};
  /// For a time-based run: the length of one sample.
  std::chrono::milliseconds sample_interval{1000};
};

/// One timed run. Latencies are kept for at most kMaxLatencies requests per direction (a
/// uniform sample of them beyond that, so a long run's memory is bounded).
struct IoPassResult {
  static constexpr std::size_t kMaxLatencies = std::size_t{1} << 20;
  double seconds = 0;
  std::uint64_t bytes = 0;  ///< read + written
  std::uint64_t read_bytes = 0;
  std::uint64_t write_bytes = 0;
  std::vector<double> read_latencies_us;  ///< submit -> completion
  std::vector<double> write_latencies_us;
  /// Time-based runs only: bytes completed per sample_interval, per direction (empty for a
  /// direction the run did not do). A last interval shorter than half a sample is left out.
  std::vector<ThroughputSample> read_samples;
  std::vector<ThroughputSample> write_samples;
  double gbps() const { return rate(bytes); }
  double read_gbps() const { return rate(read_bytes); }
  double write_gbps() const { return rate(write_bytes); }

 private:
  double rate(std::uint64_t b) const {
    return seconds > 0 ? static_cast<double>(b) / seconds / 1e9 : 0;
  }
};

/// Creates (preallocates) the data files, the engine and the buffer pool at construction. The
/// files disappear with the bench, unless options.keep and keep_files() was called.
/// Errors: UsageError for a block size that is not a multiple of a file's direct-I/O
/// alignment or a size below one block per file; IoError (file, offset, length) for a failed
/// request; zinf::Error naming file and offset for a verification mismatch.
/// Threads: one caller at a time. Memory: buffer_bytes of pinned buffers, and 4 bytes per block
/// (the generation each block holds, for verifying reads after random or partial writes; 12
/// with random runs: their order).
class IoBench {
 public:
  explicit IoBench(IoBenchOptions options);
  ~IoBench();
  IoBench(const IoBench&) = delete;
  IoBench& operator=(const IoBench&) = delete;

  /// Writes the files once more with a new generation of the pattern. `label` names the pass
  /// on the shared progress line (progress.h: on stderr, only when it is a terminal and
  /// `progress` is set): "zinf bench io write", elapsed, done/total (GB, or seconds of a
  /// time-based run) and the rate.
  IoPassResult write(bool progress = false, const char* label = "zinf bench io write");
  /// Reads the files back, verifying the last generation written (unless !verify). Needs a
  /// write() before it.
  IoPassResult read(bool progress = false, const char* label = "zinf bench io read");
  /// Runs `spec`: its writes lay down a new generation of the pattern, its reads verify each
  /// block against the generation last written there (unless !verify). Reads need a write()
  /// over every block before them.
  IoPassResult run(const IoRunSpec& spec, bool progress = false,
                   const char* label = "zinf bench io run");
  /// With options.keep: leaves the data files in place when the bench is destroyed (call it
  /// once the run has succeeded: an interrupted or failed run removes them) and returns their
  /// paths. UsageError without options.keep (the files have no names).
  std::vector<std::string> keep_files();

  const IoBenchOptions& options() const noexcept { return options_; }
  std::string_view engine_name() const;
  std::uint32_t engine_threads() const;
  std::uint64_t file_size() const noexcept { return file_size_; }
  std::size_t file_count() const noexcept { return options_.dirs.size(); }
  bool direct() const noexcept { return direct_; }
  bool huge_pages() const noexcept;
  bool registered_buffers() const noexcept { return registered_; }

 private:
  class Runner;
  IoBenchOptions options_;
  std::uint64_t file_size_ = 0;
  // The names of kept files (options.keep), removed when destroyed (after runner_, which
  // closes them) unless keep_files() was called. Without options.keep there is nothing to
  // remove: the files have no names.
  struct Named {
    std::vector<swap::Dir> dirs;
    std::vector<std::string> names;
    bool keep = false;
    ~Named();
  } named_;
  bool direct_ = true;
  bool registered_ = false;
  std::uint32_t generation_ = 0;
  std::unique_ptr<Runner> runner_;  // owns files, engine, pool
};

}  // namespace zinf::tools
