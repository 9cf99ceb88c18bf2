// SPDX-License-Identifier: Apache-2.0
// What `zinf tune` measures: a setting of the sweep (Point) and the test files with the
// optimizer step's I/O pattern over them (Workload), every byte verified.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "bench_common.h"
#include "interrupt.h"
#include "io_pattern.h"
#include "zinf/common/error.h"
#include "zinf/swap/buffer_pool.h"
#include "zinf/swap/dir.h"
#include "zinf/swap/file.h"
#include "zinf/swap/io_engine.h"

namespace zinf::tools::tune {

using Clock = std::chrono::steady_clock;

/// One setting of the sweep and its mixed GB/s per pass.
struct Point {
  swap::IoEngineKind kind = swap::IoEngineKind::kUring;
  std::uint32_t block = 1u << 20;
  std::uint32_t depth = 16;
  std::uint32_t threads = 0;  // threads backend only
  std::vector<double> runs;   // mixed GB/s per pass
  bool is_default = false;    // zinf's default setting: the reference the others must beat
  double score() const { return median(runs); }
};

// The test files and the optimizer step's pattern over them.
//
// The state is `groups` sub-groups of `group_bytes`, striped over the files (sub-group j in
// file j % n at offset (j / n) * group_bytes), as SwapStore stripes. A mixed pass is the
// pipeline of OffloadedOptimizer::step: at step k it submits the read of sub-group k and the
// write of sub-group k-2, and meanwhile "updates" k-1 (verifies what was read, restamps it with
// the next generation); then it waits for both. Three buffers rotate. Every byte read is
// checked against the generation last written there; a mismatch is an Error naming the file
// and offset, and a failed request an IoError from its ticket. Bounded by 3 sub-group buffers.
class Workload {
 public:
  /// `register_buffers`: register the buffers with each engine, as the engine does where the
  /// memlock limit allows (where it does not, each refusal would log a notice).
  /// The files have no name (File::create_unnamed): they vanish with the process, however it
  /// ends, and no link planted in a directory is followed.
  Workload(const std::vector<swap::Dir>& dirs, std::uint64_t group_bytes, std::uint64_t groups,
           bool register_buffers)
      : group_bytes_(group_bytes),
        groups_(groups),
        register_(register_buffers),
        generation_(groups, 0) {
    const std::uint64_t per_file = (groups + dirs.size() - 1) / dirs.size() * group_bytes;
    for (std::size_t i = 0; i < dirs.size(); ++i) {
      swap::FileOptions fo;
      fo.preallocate_bytes = per_file;
      files_.push_back(
          swap::File::create_unnamed(dirs[i], "zinf-tune." + std::to_string(i) + ".dat", fo));
      alignment_ = std::max(alignment_, files_.back().alignment());
      direct_.push_back(files_.back().is_direct());
    }
    swap::BufferPoolOptions po;
    po.budget_bytes = 3 * group_bytes;
    po.alignment = std::max<std::uint32_t>(alignment_, 4096);
    po.huge_pages = true;
    po.prefault = true;
    pool_ = std::make_unique<swap::BufferPool>(po);
    for (auto& b : bufs_) b = pool_->acquire(group_bytes);
  }
  ~Workload() {
    for (auto& b : bufs_) b.reset();
  }
  Workload(const Workload&) = delete;
  Workload& operator=(const Workload&) = delete;

  std::uint64_t bytes() const { return group_bytes_ * groups_; }
  bool direct(std::size_t i) const { return direct_[i]; }
  std::uint32_t alignment() const { return alignment_; }

  std::unique_ptr<swap::IoEngine> engine(const Point& p) {
    swap::IoOptions o;
    o.kind = p.kind;
    o.block_size = p.block;
    o.queue_depth = p.depth;
    o.threads = p.threads;
    auto e = swap::make_io_engine(o);
    ids_.clear();
    for (const auto& f : files_) ids_.push_back(e->attach(f));
    if (register_) {
      std::span<std::byte> arena = pool_->arena();
      (void)e->register_buffers(std::span<const std::span<std::byte>>(&arena, 1));
    }
    return e;
  }

  /// Returns bytes read+written per second of one mixed pass.
  double mixed_pass(swap::IoEngine& e) {
    const auto start = Clock::now();
    for (std::uint64_t k = 0; k < groups_ + 2; ++k) {
      throw_if_interrupted();  // nothing in flight here: the last step waited for both
      swap::IoTicket rd, wr;
      if (k < groups_) rd = submit(e, swap::IoOp::kRead, k);
      if (k >= 2) wr = submit(e, swap::IoOp::kWrite, k - 2);
      if (k >= 1 && k <= groups_) {
        verify(k - 1);
        stamp(k - 1, generation_[k - 1] + 1);
      }
      rd.wait();
      wr.wait();
      if (k >= 2) ++generation_[k - 2];
    }
    return 2.0 * static_cast<double>(bytes()) / pass_seconds(start) / 1e9;
  }

  /// One sequential pass of `op` over the sub-groups of `file` (all files if < 0), three in
  /// flight; returns GB/s. Writes lay down the next generation; reads verify.
  double single_pass(swap::IoEngine& e, swap::IoOp op, int file) {
    std::vector<std::uint64_t> todo;
    for (std::uint64_t j = 0; j < groups_; ++j) {
      if (file < 0 || j % files_.size() == static_cast<std::uint64_t>(file)) todo.push_back(j);
    }
    std::array<swap::IoTicket, 3> t;
    std::array<std::uint64_t, 3> which{};
    const auto start = Clock::now();
    auto finish = [&](std::size_t slot) {
      t[slot].wait();
      if (op == swap::IoOp::kRead) {
        verify_in(slot, which[slot]);
      } else {
        ++generation_[which[slot]];
      }
    };
    for (std::size_t i = 0; i < todo.size(); ++i) {
      std::size_t slot = i % 3;
      if (i >= 3) finish(slot);
      throw_if_interrupted();  // requests still in flight: the engine's destructor waits
      which[slot] = todo[i];
      if (op == swap::IoOp::kWrite) stamp_in(slot, todo[i], generation_[todo[i]] + 1);
      t[slot] = submit_in(e, op, todo[i], slot);
    }
    for (std::size_t i = todo.size() > 3 ? todo.size() - 3 : 0; i < todo.size(); ++i) finish(i % 3);
    return static_cast<double>(todo.size() * group_bytes_) / pass_seconds(start) / 1e9;
  }

 private:
  // Never 0: the rates divide by it.
  static double pass_seconds(Clock::time_point t) { return std::max(1e-9, seconds_since(t)); }
  std::uint32_t file_of(std::uint64_t g) const {
    return static_cast<std::uint32_t>(g % files_.size());
  }
  std::uint64_t offset_of(std::uint64_t g) const { return g / files_.size() * group_bytes_; }
  swap::IoTicket submit(swap::IoEngine& e, swap::IoOp op, std::uint64_t g) {
    return submit_in(e, op, g, static_cast<std::size_t>(g % 3));
  }
  swap::IoTicket submit_in(swap::IoEngine& e, swap::IoOp op, std::uint64_t g, std::size_t slot) {
    swap::IoRequest req{op, ids_[file_of(g)], offset_of(g), bufs_[slot].span()};
    return e.submit(std::span<const swap::IoRequest>(&req, 1));
  }
  void stamp(std::uint64_t g, std::uint32_t gen) {
    stamp_in(static_cast<std::size_t>(g % 3), g, gen);
  }
  void stamp_in(std::size_t slot, std::uint64_t g, std::uint32_t gen) {
    fill_bulk(bufs_[slot].span(), gen);
    stamp_headers(bufs_[slot].span(), file_of(g), offset_of(g), gen);
  }
  void verify(std::uint64_t g) { verify_in(static_cast<std::size_t>(g % 3), g); }
  void verify_in(std::size_t slot, std::uint64_t g) {
    std::string err = verify_block(bufs_[slot].span(), file_of(g), offset_of(g), generation_[g]);
    if (!err.empty()) {
      throw Error("verification failed: " + files_[file_of(g)].path() +
                  " offset=" + std::to_string(offset_of(g)) +
                  " length=" + std::to_string(group_bytes_) + ": " + err);
    }
  }

  std::uint64_t group_bytes_;
  std::uint64_t groups_;
  bool register_;
  std::vector<std::uint32_t> generation_;  // per sub-group: what its bytes on disk carry
  std::vector<swap::File> files_;
  std::vector<bool> direct_;
  std::uint32_t alignment_ = 4096;
  std::unique_ptr<swap::BufferPool> pool_;
  std::array<swap::BufferLease, 3> bufs_;
  std::vector<swap::FileId> ids_;
};

}  // namespace zinf::tools::tune
