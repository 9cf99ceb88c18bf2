// SPDX-License-Identifier: Apache-2.0
#include "swap_worker.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "stamp.h"
#include "zinf/common/error.h"
#include "zinf/common/unique_fd.h"
#include "zinf/swap/buffer_pool.h"
#include "zinf/swap/io_engine.h"
#include "zinf/swap/swap_store.h"

namespace zinf::tools::stress {

// Swaps random-size tensors and ranges of them out and in through its own engine and store,
// one operation at a time, and checks every byte read back against what it last wrote.
class SwapWorker::Impl {
 public:
  static constexpr std::size_t kMaxKeys = 6;

  Impl(const Shared& sh, std::size_t index)
      : sh_(sh),
        index_(index),
        rng_(sh.cfg->seed * 7919 + index),
        plan_(make_plan(sh.cfg->fault_rate, sh.cfg->seed * 7919 + index)) {
    engine_ = swap::make_io_engine(io_options(*sh.cfg, plan_));
    // Room for every key at its largest, padded, plus a stripe row per key for rounding.
    const std::uint64_t per_key = sh.max_tensor + kStripe * (sh.store_dirs.size() + 1);
    store_ = make_store(sh, *engine_, kMaxKeys * per_key);
    unit_ = store_->alignment();
    if (unit_ > sh.swap_pool->alignment()) {
      throw Error("the swap files need " + std::to_string(unit_) +
                  "-byte alignment; the pool has " + std::to_string(sh.swap_pool->alignment()));
    }
  }

  std::string engine_name() const { return std::string(engine_->name()); }

  void run() {
    while (sh_.running()) step();
    tally_.injected = counts_of(plan_.get());
  }

  Tally& tally() { return tally_; }
  std::string planted;

 private:
  struct Key {
    std::string name;
    std::uint32_t uid = 0;
    std::uint64_t size = 0;
    std::vector<std::uint32_t> gens;  // per unit_ block of the padded tensor
    bool dirty = false;               // last swap_out failed: only a whole rewrite is valid
  };

  double uniform() { return std::uniform_real_distribution<double>(0, 1)(rng_); }
  std::uint64_t below(std::uint64_t n) {
    return std::uniform_int_distribution<std::uint64_t>(0, n - 1)(rng_);
  }

  // Sizes that probe the edges: tiny odd ones, whole blocks, a block +-1, whole stripes, any.
  std::uint64_t random_size() {
    const std::uint64_t max = sh_.max_tensor;
    std::uint64_t s = 0;
    switch (below(5)) {
      case 0: s = 1 + below(9000); break;
      case 1: s = unit_ * (1 + below(max / unit_)); break;
      case 2: s = unit_ * (1 + below(max / unit_)) + (below(2) ? 1 : 0) - (below(2) ? 1 : 0); break;
      case 3: s = kStripe * (1 + below(std::max<std::uint64_t>(1, max / kStripe))); break;
      default: s = 1 + below(max); break;
    }
    return std::clamp<std::uint64_t>(s, 1, max);
  }

  void step() {
    if (keys_.empty() || (keys_.size() < kMaxKeys && uniform() < 0.15)) {
      create();
      return;
    }
    Key& k = keys_[below(keys_.size())];
    if (k.dirty) {
      write(k, 0, k.size);
      return;
    }
    const double r = uniform();
    if (r < 0.25) {
      write(k, 0, k.size);
    } else if (r < 0.45) {
      auto [off, len] = random_range(k);
      write(k, off, len);
    } else if (r < 0.70) {
      read(k, 0, k.size);
    } else if (r < 0.95) {
      auto [off, len] = random_range(k);
      read(k, off, len);
    } else if (keys_.size() > 1) {
      const std::size_t i = static_cast<std::size_t>(&k - keys_.data());
      store_->release(k.name);
      keys_.erase(keys_.begin() + static_cast<std::ptrdiff_t>(i));
    }
  }

  // A range under SwapStore's rules: aligned start; whole units (stripes with checksums)
  // unless it ends at the tensor's end.
  std::pair<std::uint64_t, std::uint64_t> random_range(const Key& k) {
    const std::uint64_t u = sh_.cfg->checksums ? kStripe : unit_;
    const std::uint64_t units = (k.size + u - 1) / u;
    const std::uint64_t a = below(units);
    const std::uint64_t b = a + 1 + below(units - a);
    const std::uint64_t off = a * u;
    const std::uint64_t end = std::min(b * u, k.size);
    return {off, end - off};
  }

  void create() {
    Key k;
    k.uid = next_uid_++;
    k.name = "w" + std::to_string(index_) + "-t" + std::to_string(k.uid);
    // The planted corruption needs a tensor longer than the bytes it flips.
    k.size =
        sh_.cfg->plant && index_ == 0 && planted.empty() ? (256u << 10) + 12345 : random_size();
    k.gens.assign(store_->padded_size(k.size) / unit_, 0);
    store_->allocate(k.name, k.size);
    keys_.push_back(std::move(k));
    write(keys_.back(), 0, keys_.back().size);
  }

  std::string label(const char* op, const Key& k, std::uint64_t off, std::uint64_t len) const {
    return std::string(op) + " " + k.name + " [" + std::to_string(off) + ", +" +
           std::to_string(len) + ") of " + std::to_string(k.size);
  }

  void write(Key& k, std::uint64_t off, std::uint64_t len) {
    const bool whole = off == 0 && len == k.size;
    const std::uint64_t padded = store_->padded_size(len);
    swap::BufferLease lease = sh_.swap_pool->acquire(padded);
    const std::uint32_t gen = next_gen_++;
    fill(lease.span().first(padded), k.uid, gen, off);
    const FaultCounts before = counts_of(plan_.get());
    OpError err;
    try {
      swap::IoTicket t = whole ? store_->swap_out(k.name, lease.span())
                               : store_->swap_out_range(k.name, off, len, lease.span());
      err = error_of(t.wait_status());
    } catch (const IoError& e) {
      err = error_of(e);
    } catch (const EngineFailed& e) {
      err = error_of(e);
    }
    ++tally_.swap_outs;
    judge_operation(tally_, label("swap_out", k, off, len), counts_of(plan_.get()) - before, err);
    if (err.failed) {
      k.dirty = true;  // the key's stored bytes are undefined now (SwapStore contract)
      return;
    }
    for (std::uint64_t b = off / unit_; b < (off + padded) / unit_; ++b) k.gens[b] = gen;
    if (whole) k.dirty = false;
    tally_.bytes_written += padded;
    if (sh_.cfg->plant && index_ == 0 && planted.empty() && whole && keys_.size() == 1) {
      plant(k);
      read(k, 0, k.size);
    }
  }

  void read(Key& k, std::uint64_t off, std::uint64_t len) {
    const bool whole = off == 0 && len == k.size;
    const std::uint64_t padded = store_->padded_size(len);
    swap::BufferLease lease = sh_.swap_pool->acquire(padded);
    const FaultCounts before = counts_of(plan_.get());
    OpError err;
    try {
      swap::IoTicket t = whole ? store_->swap_in(k.name, lease.span())
                               : store_->swap_in_range(k.name, off, len, lease.span());
      err = error_of(t.wait_status());
    } catch (const IoError& e) {
      err = error_of(e);
    } catch (const EngineFailed& e) {
      err = error_of(e);
    }
    ++tally_.swap_ins;
    const std::string what = label("swap_in", k, off, len);
    judge_operation(tally_, what, counts_of(plan_.get()) - before, err);
    if (err.failed) {
      // The buffer is not data. The stored bytes are still good, unless a checksum said they
      // are not: then rewrite the tensor rather than report the same damage again.
      if (err.code == ErrorCode::kCorrupt) k.dirty = true;
      return;
    }
    const std::string bad = check(lease.span().first(padded), k.uid, off, unit_,
                                  [&](std::uint64_t b) { return k.gens[b]; });
    if (!bad.empty()) {
      ++tally_.mismatches;
      tally_.problem(what + ": mismatch at " + bad);
      k.dirty = true;  // rewrite it whole rather than report the same damage again
      return;
    }
    tally_.bytes_verified += padded;
    sh_.verified(padded);
  }

  // Flips the first 64 bytes of the store's first file, behind the store's back. The store
  // holds one tensor, placed first fit at address 0, so those are that tensor's first bytes.
  void plant(const Key& k) {
    const std::string& path = store_->file_paths().at(0);
    // The swap files have no name: reopen the store's descriptor (buffered, unlike the store's,
    // so that 64 unaligned bytes can be rewritten).
    const std::string fd_path = "/proc/self/fd/" + std::to_string(store_->file_descriptor(0));
    const UniqueFd fd(::open(fd_path.c_str(), O_RDWR | O_CLOEXEC));
    if (!fd.valid()) {
      throw Error("plant-corruption: cannot open " + path + ": " + std::strerror(errno));
    }
    unsigned char bytes[64];
    bool ok = ::pread(fd.get(), bytes, sizeof bytes, 0) == static_cast<ssize_t>(sizeof bytes);
    for (auto& b : bytes) b ^= 0x5a;
    ok = ok && ::pwrite(fd.get(), bytes, sizeof bytes, 0) == static_cast<ssize_t>(sizeof bytes);
    ok = ok && ::fdatasync(fd.get()) == 0;
    const int err = errno;
    if (!ok) throw Error("plant-corruption: cannot rewrite " + path + ": " + std::strerror(err));
    planted = "flipped bytes [0, 64) of " + path + " (tensor " + k.name + ", its bytes [0, 64))";
  }

  const Shared& sh_;
  std::size_t index_;
  std::mt19937_64 rng_;
  std::shared_ptr<swap::FaultPlan> plan_;
  std::unique_ptr<swap::IoEngine> engine_;
  std::unique_ptr<swap::SwapStore> store_;
  std::uint64_t unit_ = 4096;
  std::vector<Key> keys_;
  std::uint32_t next_uid_ = 1;
  std::uint32_t next_gen_ = 1;
  Tally tally_;
};

SwapWorker::SwapWorker(const Shared& sh, std::size_t index)
    : impl_(std::make_unique<Impl>(sh, index)) {}
SwapWorker::~SwapWorker() = default;
void SwapWorker::run() { return impl_->run(); }
Tally& SwapWorker::tally() { return impl_->tally(); }
std::string SwapWorker::engine_name() const { return impl_->engine_name(); }
const std::string& SwapWorker::planted() const { return impl_->planted; }

}  // namespace zinf::tools::stress
