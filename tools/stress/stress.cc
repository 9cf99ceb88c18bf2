// SPDX-License-Identifier: Apache-2.0
// `zinf stress`: a soak of the whole I/O stack under load and injected faults. Swap workers,
// an NVMe-offloaded optimizer checked bitwise against an in-memory CpuAdam, and layer
// prefetch passes run at once for --duration; every byte read back is verified, and every
// injected hard fault (EIO, ENOSPC) must surface as an error of the operation it hit.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench_common.h"
#include "scratch.h"
#include "args.h"
#include "commands.h"
#include "interrupt.h"
#include "format.h"
#include "json_writer.h"
#include "zinf/adam/cpu_adam.h"
#include "zinf/common/error.h"
#include "zinf/common/log.h"
#include "zinf/cuda/device.h"
#include "zinf/offload/optimizer.h"
#include "zinf/prefetch/layer_prefetcher.h"
#include "zinf/swap/buffer_pool.h"
#include "zinf/swap/dir.h"
#include "zinf/swap/file.h"
#include "zinf/swap/fault_injection.h"
#include "zinf/swap/io_engine.h"
#include "zinf/swap/swap_store.h"

namespace zinf::tools {
namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kHelp = R"(usage: zinf stress [options]

Runs, concurrently for --duration: swap workers (swap_out/swap_in of random-size tensors and
ranges, every byte read back verified), optimizer steps (state on NVMe, checked bitwise against
an in-memory CpuAdam after every step) and layer prefetch passes (every acquired layer's bytes
verified). With --faults, the I/O engines inject EIO, ENOSPC, short transfers, EAGAIN and
delays; every hard fault (EIO, ENOSPC) must surface as an error of the operation it hit, and
every recoverable one must be absorbed with correct data.

  --dir DIR          directory for the swap files (repeatable: striped over the directories)
                     [default: ./zinf-scratch, created if missing]
  --duration T       how long to run: 500ms, 10s, 2m, 1h (a bare number is seconds) [10s]
  --faults RATE      probability per I/O piece attempt of an injected fault, in [0, 0.5] [0]
  --seed N           seed of the workloads and of the fault plans [1]
  --budget BYTES     pinned memory for all workers together [64M]; at least 4M
  --workers N        swap workers (the optimizer and prefetch workers come on top) [2]
  --checksums        keep CRC32C per stripe unit in every swap store. Off unless given, unlike
                     the library's default: stress checks every byte itself, and without
                     checksums its ranges need not be whole stripes (more layouts tested)
  --engine KIND      auto | uring | threads [auto]
  --json             one JSON object on stdout instead of the report

Exit status: 0 if nothing was lost, 1 on any mismatch, unsurfaced hard fault, unexpected error
or budget overrun, 2 on bad options, 128 + the signal's number when SIGINT, SIGTERM or SIGHUP
ends the soak early (no report then). See docs/stress.md.
)";

// Self-test, deliberately left out of --help (docs/stress.md): `--plant-corruption` flips
// bytes of a tensor in its swap file behind the store's back; the run must then fail.

struct Config {
  std::vector<std::string> dirs;
  std::chrono::milliseconds duration{10000};
  double fault_rate = 0;
  std::uint64_t seed = 1;
  std::uint64_t budget = 64ull << 20;
  std::uint64_t workers = 2;
  bool checksums = false;  // explicit off (the library's default is on): see --help
  bool plant = false;
  swap::IoEngineKind engine = swap::IoEngineKind::kAuto;
  bool json = false;
};

std::chrono::milliseconds parse_duration(const std::string& text) {
  const auto bad = [&] {
    return UsageError("invalid --duration '" + text + "': expected e.g. 500ms, 10s, 2m, 1h");
  };
  std::size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    throw bad();
  }
  const std::string unit = text.substr(used);
  double ms = 0;
  if (unit.empty() || unit == "s") {
    ms = value * 1e3;
  } else if (unit == "ms") {
    ms = value;
  } else if (unit == "m" || unit == "min") {
    ms = value * 60e3;
  } else if (unit == "h") {
    ms = value * 3600e3;
  } else {
    throw bad();
  }
  if (!(ms >= 1) || ms > 7 * 24 * 3600e3) throw bad();
  return std::chrono::milliseconds(static_cast<std::int64_t>(ms));
}

Config parse(const std::vector<std::string>& tokens, bool* help) {
  Args a("stress", tokens);
  Config c;
  *help = a.help();
  c.dirs = a.strings("dir");
  c.duration = parse_duration(a.string("duration", "10s"));
  c.fault_rate = a.number("faults", 0);
  c.seed = a.uint("seed", 1);
  c.budget = a.size("budget", 64ull << 20);
  c.workers = a.uint("workers", 2);
  c.checksums = a.flag("checksums");
  c.plant = a.flag("plant-corruption");
  c.engine = swap::parse_io_engine_kind(a.string("engine", "auto"));
  c.json = a.flag("json");
  a.finish();
  if (*help) return c;
  if (!(c.fault_rate >= 0 && c.fault_rate <= 0.5)) {
    throw UsageError("invalid --faults: must be a probability in [0, 0.5]");
  }
  if (c.budget < (4ull << 20)) throw UsageError("invalid --budget: at least 4M");
  if (c.workers == 0 || c.workers > 64) throw UsageError("invalid --workers: must be in [1, 64]");
  check_scratch_dirs(c.dirs);
  return c;
}

// ---- Faults -------------------------------------------------------------------------------

// One FaultPlan rule per kind, in this order, so that FaultPlan::fired(i) counts kind i.
enum : std::size_t { kRuleEio, kRuleEnospc, kRuleShort, kRuleEagain, kRuleDelay, kRuleCount };

struct FaultCounts {
  std::uint64_t by_rule[kRuleCount] = {};
  std::uint64_t hard() const { return by_rule[kRuleEio] + by_rule[kRuleEnospc]; }
  std::uint64_t total() const {
    std::uint64_t t = 0;
    for (auto n : by_rule) t += n;
    return t;
  }
  FaultCounts operator-(const FaultCounts& o) const {
    FaultCounts d;
    for (std::size_t i = 0; i < kRuleCount; ++i) d.by_rule[i] = by_rule[i] - o.by_rule[i];
    return d;
  }
  FaultCounts& operator+=(const FaultCounts& o) {
    for (std::size_t i = 0; i < kRuleCount; ++i) by_rule[i] += o.by_rule[i];
    return *this;
  }
};

FaultCounts counts_of(const swap::FaultPlan* plan) {
  FaultCounts c;
  if (plan == nullptr) return c;
  for (std::size_t i = 0; i < kRuleCount; ++i) c.by_rule[i] = plan->fired(i);
  return c;
}

// The mix of faults at `rate` per piece attempt. Hard: EIO (reads and writes), ENOSPC (writes).
// Recoverable: a short transfer of one 4096-byte block (a whole alignment unit, so that the
// resubmission from the aligned point below always progresses), two EAGAINs (far below the
// engine's bound of 64 retries), a 300 us delay. Null for rate 0: no plan, no "+faults".
std::shared_ptr<swap::FaultPlan> make_plan(double rate, std::uint64_t seed) {
  if (rate <= 0) return nullptr;
  using swap::FaultKind;
  using swap::FaultRule;
  std::vector<FaultRule> rules(kRuleCount);
  for (auto& r : rules) r.probability = rate;
  rules[kRuleEio].kind = FaultKind::kError;
  rules[kRuleEio].probability *= 0.3;
  rules[kRuleEio].err = EIO;
  rules[kRuleEnospc].kind = FaultKind::kError;
  rules[kRuleEnospc].op = swap::IoOp::kWrite;
  rules[kRuleEnospc].probability *= 0.2;
  rules[kRuleEnospc].err = ENOSPC;
  rules[kRuleShort].kind = FaultKind::kShort;
  rules[kRuleShort].probability *= 0.2;
  rules[kRuleShort].short_bytes = 4096;
  rules[kRuleEagain].kind = FaultKind::kEagain;
  rules[kRuleEagain].probability *= 0.15;
  rules[kRuleEagain].count = 2;
  rules[kRuleDelay].kind = FaultKind::kDelay;
  rules[kRuleDelay].probability *= 0.15;
  rules[kRuleDelay].delay = std::chrono::microseconds(300);
  return std::make_shared<swap::FaultPlan>(std::move(rules), seed);
}

// ---- Tallies ------------------------------------------------------------------------------

constexpr std::size_t kMaxProblems = 8;

// What one worker saw. Each worker owns its tally; they are summed after the threads join.
struct Tally {
  std::uint64_t swap_outs = 0, swap_ins = 0;
  std::uint64_t opt_steps = 0, opt_undone = 0, opt_rebuilds = 0, opt_state_reads = 0;
  std::uint64_t prefetch_passes = 0, prefetch_acquires = 0, prefetch_layer_writes = 0;
  std::uint64_t prefetch_reads_dropped = 0;  // failed reads issued ahead, never acquired
  std::uint64_t bytes_verified = 0, bytes_written = 0;
  FaultCounts injected;
  std::uint64_t failed_ops = 0;
  std::uint64_t hard_surfaced = 0, hard_unsurfaced = 0;
  std::uint64_t unexpected_errors = 0, corruption_errors = 0, errors_without_context = 0;
  std::uint64_t mismatches = 0;
  std::vector<std::string> problems;  // the first few, for the report

  void problem(std::string text) {
    if (problems.size() < kMaxProblems) problems.push_back(std::move(text));
  }
  std::uint64_t operations() const {
    return swap_outs + swap_ins + opt_steps + opt_state_reads + prefetch_acquires +
           prefetch_layer_writes;
  }
  void add(const Tally& o) {
    swap_outs += o.swap_outs;
    swap_ins += o.swap_ins;
    opt_steps += o.opt_steps;
    opt_undone += o.opt_undone;
    opt_rebuilds += o.opt_rebuilds;
    opt_state_reads += o.opt_state_reads;
    prefetch_passes += o.prefetch_passes;
    prefetch_acquires += o.prefetch_acquires;
    prefetch_layer_writes += o.prefetch_layer_writes;
    prefetch_reads_dropped += o.prefetch_reads_dropped;
    bytes_verified += o.bytes_verified;
    bytes_written += o.bytes_written;
    injected += o.injected;
    failed_ops += o.failed_ops;
    hard_surfaced += o.hard_surfaced;
    hard_unsurfaced += o.hard_unsurfaced;
    unexpected_errors += o.unexpected_errors;
    corruption_errors += o.corruption_errors;
    errors_without_context += o.errors_without_context;
    mismatches += o.mismatches;
    for (const auto& p : o.problems) problem(p);
  }
};

// An operation's failure as the caller saw it.
struct OpError {
  bool failed = false;
  ErrorCode code = ErrorCode::kOk;
  std::string text;
};

OpError error_of(const Status& st) {
  if (st.ok()) return {};
  return {true, st.code(), IoError(st).what()};
}

OpError error_of(const std::exception& e) {
  OpError r{true, ErrorCode::kIo, e.what()};
  if (const auto* io = dynamic_cast<const IoError*>(&e)) r.code = io->code();
  if (const auto* ef = dynamic_cast<const EngineFailed*>(&e)) r.code = ef->cause().code();
  return r;
}

// Judges one operation by the hard faults injected while it ran. Every component has its own
// engine and fault plan and runs one operation at a time, so the faults a plan decided between
// an operation's start and its completion are exactly that operation's (per-request
// attribution). A hard fault fails its request, so: faults and no error = unsurfaced; an error
// without any hard fault = unexpected (a checksum mismatch counts as a corruption found).
void judge(Tally& t, const std::string& what, const FaultCounts& delta, const OpError& err) {
  const std::uint64_t hard = delta.hard();
  if (err.failed && hard > 0) {
    ++t.failed_ops;
    t.hard_surfaced += hard;
    // The error a user sees must say where: file, offset and length (STYLE.md section 3).
    if (err.text.find("offset=") == std::string::npos ||
        err.text.find("length=") == std::string::npos) {
      ++t.errors_without_context;
      t.problem(what + ": error without offset/length: " + err.text);
    }
  } else if (err.failed && err.code == ErrorCode::kCorrupt) {
    ++t.corruption_errors;
    t.problem(what + ": corruption surfaced: " + err.text);
  } else if (err.failed) {
    ++t.unexpected_errors;
    t.problem(what + ": error with no hard fault injected: " + err.text);
  } else if (hard > 0) {
    t.hard_unsurfaced += hard;
    t.problem(what + ": succeeded although " + std::to_string(hard) +
              " hard fault(s) were injected into it");
  }
}

// ---- Stamped data -------------------------------------------------------------------------

// Every 8-byte word at tensor offset o encodes (tensor uid, generation, o / 8), so a mismatch
// says which tensor, which write and which place the found bytes came from.
constexpr std::uint64_t kStampMagic = 0xa5c3'0000'0000'0000ull;

std::uint64_t stamp(std::uint32_t uid, std::uint32_t gen, std::uint64_t offset) {
  return kStampMagic ^ (static_cast<std::uint64_t>(uid & 0xffffu) << 48) ^
         (static_cast<std::uint64_t>(gen & 0xffffu) << 32) ^ ((offset / 8) & 0xffffffffu);
}

std::string decode(std::uint64_t w) {
  const std::uint64_t x = w ^ kStampMagic;
  return "uid=" + std::to_string(x >> 48) + " gen=" + std::to_string((x >> 32) & 0xffffu) +
         " offset=" + std::to_string((x & 0xffffffffu) * 8);
}

// Fills `buf` (a multiple of 8 bytes) as tensor bytes from `offset` of generation `gen`.
void fill(std::span<std::byte> buf, std::uint32_t uid, std::uint32_t gen, std::uint64_t offset) {
  auto* w = reinterpret_cast<std::uint64_t*>(buf.data());
  const std::size_t n = buf.size() / 8;
  for (std::size_t i = 0; i < n; ++i) w[i] = stamp(uid, gen, offset + i * 8);
}

// Checks `buf` against tensor bytes from `offset`, whose generation per `unit`-byte block is
// gen_of(block). Returns "" or the first mismatch.
template <typename GenOf>
std::string check(std::span<const std::byte> buf, std::uint32_t uid, std::uint64_t offset,
                  std::uint64_t unit, GenOf gen_of) {
  const auto* w = reinterpret_cast<const std::uint64_t*>(buf.data());
  const std::size_t n = buf.size() / 8;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t o = offset + i * 8;
    const std::uint64_t want = stamp(uid, gen_of(o / unit), o);
    if (w[i] != want) {
      return "tensor offset " + std::to_string(o) + ": expected (" + decode(want) + "), found (" +
             decode(w[i]) + ")";
    }
  }
  // A tail shorter than a word (layer sizes that are not multiples of 8) is compared bytewise.
  for (std::size_t b = n * 8; b < buf.size(); ++b) {
    const std::uint64_t o = offset + b;
    const std::uint64_t want = stamp(uid, gen_of(o / unit), o - o % 8);
    const auto want_byte = static_cast<std::byte>(want >> (8 * (o % 8)));
    if (buf[b] != want_byte) return "tensor offset " + std::to_string(o) + ": tail byte differs";
  }
  return {};
}

// ---- Shared setup -------------------------------------------------------------------------

struct Shared {
  const Config* cfg = nullptr;
  Clock::time_point deadline;
  // Until the deadline, or a signal (the workers then finish their operation in hand and
  // return; stress_main stops without a report).
  bool running() const { return Clock::now() < deadline && !interrupted(); }
  std::vector<std::string> store_dirs;  // cfg.dirs, doubled when there is only one
  swap::BufferPool* swap_pool = nullptr;
  std::uint64_t max_tensor = 0;
  std::uint64_t opt_budget = 0;
  std::uint64_t prefetch_budget = 0;
};

swap::IoOptions io_options(const Config& cfg, std::shared_ptr<swap::FaultPlan> plan) {
  swap::IoOptions io;
  io.kind = cfg.engine;
  // Small pieces so that a tensor is several pieces and faults hit the middle of requests.
  io.block_size = 64u << 10;
  io.queue_depth = 8;
  io.threads = 2;
  io.faults = std::move(plan);
  return io;
}

constexpr std::uint32_t kStripe = 64u << 10;

std::unique_ptr<swap::SwapStore> make_store(const Shared& sh, swap::IoEngine& engine,
                                            std::uint64_t capacity) {
  swap::SwapStoreOptions so;
  so.directories = sh.store_dirs;
  so.capacity_bytes = capacity;
  so.stripe_bytes = kStripe;
  so.checksums = sh.cfg->checksums;
  so.verify_threads = 0;  // verify on the engine's thread: fewer threads on a small machine
  return std::make_unique<swap::SwapStore>(so, engine);
}

// ---- Swap worker --------------------------------------------------------------------------

// Swaps random-size tensors and ranges of them out and in through its own engine and store,
// one operation at a time, and checks every byte read back against what it last wrote.
class SwapWorker {
 public:
  static constexpr std::size_t kMaxKeys = 6;

  SwapWorker(const Shared& sh, std::size_t index)
      : sh_(sh), index_(index), rng_(sh.cfg->seed * 7919 + index),
        plan_(make_plan(sh.cfg->fault_rate, sh.cfg->seed * 7919 + index)) {
    engine_ = swap::make_io_engine(io_options(*sh.cfg, plan_));
    // Room for every key at its largest, padded, plus a stripe row per key for rounding.
    const std::uint64_t per_key = sh.max_tensor + kStripe * (sh.store_dirs.size() + 1);
    store_ = make_store(sh, *engine_, kMaxKeys * per_key);
    unit_ = store_->alignment();
    if (unit_ > sh.swap_pool->alignment()) {
      throw Error("the swap files need " + std::to_string(unit_) + "-byte alignment; the pool has " +
                  std::to_string(sh.swap_pool->alignment()));
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
  std::uint64_t below(std::uint64_t n) { return std::uniform_int_distribution<std::uint64_t>(0, n - 1)(rng_); }

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
    k.size = sh_.cfg->plant && index_ == 0 && planted.empty() ? (256u << 10) + 12345 : random_size();
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
    judge(tally_, label("swap_out", k, off, len), counts_of(plan_.get()) - before, err);
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
    judge(tally_, what, counts_of(plan_.get()) - before, err);
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
  }

  // Flips the first 64 bytes of the store's first file, behind the store's back. The store
  // holds one tensor, placed first fit at address 0, so those are that tensor's first bytes.
  void plant(const Key& k) {
    const std::string& path = store_->file_paths().at(0);
    // The swap files have no name: reopen the store's descriptor (buffered, unlike the store's,
    // so that 64 unaligned bytes can be rewritten).
    const std::string fd_path = "/proc/self/fd/" + std::to_string(store_->file_descriptor(0));
    const int fd = ::open(fd_path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) throw Error("plant-corruption: cannot open " + path + ": " + std::strerror(errno));
    unsigned char bytes[64];
    bool ok = ::pread(fd, bytes, sizeof bytes, 0) == static_cast<ssize_t>(sizeof bytes);
    for (auto& b : bytes) b ^= 0x5a;
    ok = ok && ::pwrite(fd, bytes, sizeof bytes, 0) == static_cast<ssize_t>(sizeof bytes);
    ok = ok && ::fdatasync(fd) == 0;
    const int err = errno;
    ::close(fd);
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

// ---- Optimizer worker ---------------------------------------------------------------------

// Steps an OffloadedOptimizer (state on NVMe) and a plain in-memory CpuAdam side by side and
// compares the whole state bitwise after every step. A step that fails under faults must have
// left the state unchanged (a read failed before any write-back) or failed the optimizer (then
// it is rebuilt and the reference re-seeded).
class OptimizerWorker {
 public:
  static constexpr std::uint64_t kSubGroup = 16384;  // 192 KiB records: several engine pieces
  static constexpr std::uint32_t kDepth = 3;

  explicit OptimizerWorker(const Shared& sh)
      : sh_(sh), rng_(sh.cfg->seed * 104729 + 1),
        plan_(make_plan(sh.cfg->fault_rate, sh.cfg->seed * 104729 + 1)) {
    // Two groups of odd sizes: several sub-groups each, and a short last one.
    specs_.push_back({"g0", 40000 + 2 * (rng_() % 10000) + 1});
    specs_.push_back({"g1", 20000 + 2 * (rng_() % 10000) + 1});
    opts_.tier = offload::StateTier::kNvme;
    opts_.sub_group_elements = kSubGroup;
    opts_.pipeline_depth = kDepth;
    opts_.pinned_budget_bytes = sh.opt_budget;
    opts_.hyper.lr = 1e-3;
    opts_.hyper.weight_decay = 0.01;
    opts_.hyper.mode = adam::AdamMode::kAdamW;
    opts_.adam.threads = 1;
    opts_.directories = sh.store_dirs;
    opts_.io = io_options(*sh.cfg, plan_);
    opts_.swap_checksums = sh.cfg->checksums;
    ref_adam_ = std::make_unique<adam::CpuAdam>(opts_.adam);
    for (const auto& s : specs_) {
      p_.emplace_back(s.numel);
      m_.emplace_back(s.numel);
      v_.emplace_back(s.numel);
      g_.emplace_back(s.numel);
    }
    const std::size_t most = std::max(specs_[0].numel, specs_[1].numel);
    sp_.resize(most);
    sm_.resize(most);
    sv_.resize(most);
  }

  void run() {
    rebuild();
    while (sh_.running()) step();
    tally_.injected = counts_of(plan_.get());
  }

  Tally& tally() { return tally_; }
  std::uint64_t pinned_peak() const { return pinned_peak_; }

 private:
  float random_float(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(rng_); }

  void note_peak() {
    if (opt_) pinned_peak_ = std::max(pinned_peak_, opt_->pinned_bytes_peak());
  }

  // A fresh optimizer and reference, with new random parameters. Retries while set_params
  // fails under faults (each failure judged like any operation).
  void rebuild() {
    for (int attempt = 0; attempt < 1000 && Clock::now() < sh_.deadline + std::chrono::seconds(5);
         ++attempt) {
      if (interrupted()) return;  // run() stops too; no report follows
      note_peak();
      opt_.reset();
      opt_ = std::make_unique<offload::OffloadedOptimizer>(opts_, specs_);
      ref_steps_ = 0;
      bool ok = true;
      for (std::size_t g = 0; g < specs_.size() && ok; ++g) {
        for (auto& x : p_[g]) x = random_float(-1, 1);
        std::fill(m_[g].begin(), m_[g].end(), 0.0f);
        std::fill(v_[g].begin(), v_[g].end(), 0.0f);
        for (int tries = 0;; ++tries) {
          const FaultCounts before = counts_of(plan_.get());
          OpError err;
          try {
            opt_->set_params(g, p_[g]);
          } catch (const IoError& e) {
            err = error_of(e);
          } catch (const EngineFailed& e) {
            err = error_of(e);
          }
          ++tally_.opt_state_reads;  // counted with the state transfers
          judge(tally_, "optimizer set_params " + specs_[g].name, counts_of(plan_.get()) - before, err);
          if (!err.failed) break;
          if (opt_->failed() || tries >= 100) {
            ok = false;
            break;
          }
        }
      }
      if (ok) return;
      ++tally_.opt_rebuilds;
    }
    throw Error("optimizer worker: could not rebuild the optimizer in 1000 attempts");
  }

  void step() {
    std::vector<offload::GroupGrads> grads;
    for (std::size_t g = 0; g < specs_.size(); ++g) {
      for (auto& x : g_[g]) x = random_float(-0.05f, 0.05f);
      grads.push_back({g, adam::GradView::f32(g_[g])});
    }
    const FaultCounts before = counts_of(plan_.get());
    OpError err;
    try {
      (void)opt_->step(grads);
    } catch (const IoError& e) {
      err = error_of(e);
    } catch (const EngineFailed& e) {
      err = error_of(e);
    }
    ++tally_.opt_steps;
    judge(tally_, "optimizer step " + std::to_string(ref_steps_ + 1), counts_of(plan_.get()) - before, err);
    if (!err.failed) {
      adam::AdamParams hp = opts_.hyper;
      hp.step = ++ref_steps_;
      for (std::size_t g = 0; g < specs_.size(); ++g) {
        ref_adam_->step(hp, p_[g], m_[g], v_[g], adam::GradView::f32(g_[g]));
      }
    } else if (opt_->failed()) {
      ++tally_.opt_rebuilds;  // a failed write-back: the optimizer refuses work from now on
      rebuild();
      return;
    } else {
      ++tally_.opt_undone;  // a failed read before any write-back: the state must be as before
    }
    if (opt_->step_count() != ref_steps_) {
      ++tally_.mismatches;
      tally_.problem("optimizer: step_count " + std::to_string(opt_->step_count()) +
                     " after " + std::to_string(ref_steps_) + " successful steps");
    }
    check_state();
  }

  // Reads every group's params, m and v back and compares them bitwise with the reference.
  void check_state() {
    for (std::size_t g = 0; g < specs_.size(); ++g) {
      const std::size_t n = specs_[g].numel;
      std::span<float> got[3] = {std::span(sp_).first(n), std::span(sm_).first(n),
                                 std::span(sv_).first(n)};
      OpError err;
      const FaultCounts before = counts_of(plan_.get());
      try {
        opt_->read_state(g, got[0], got[1], got[2]);
      } catch (const IoError& e) {
        err = error_of(e);
      } catch (const EngineFailed& e) {
        err = error_of(e);
      }
      ++tally_.opt_state_reads;
      judge(tally_, "optimizer read_state " + specs_[g].name, counts_of(plan_.get()) - before, err);
      if (err.failed) {
        if (opt_->failed()) {
          ++tally_.opt_rebuilds;
          rebuild();
        }
        return;  // checked again after the next step
      }
      const std::vector<float>* want[3] = {&p_[g], &m_[g], &v_[g]};
      const char* names[3] = {"params", "m", "v"};
      for (int w = 0; w < 3; ++w) {
        if (std::memcmp(got[w].data(), want[w]->data(), n * sizeof(float)) == 0) continue;
        std::size_t i = 0;
        while (std::memcmp(&got[w][i], &(*want[w])[i], sizeof(float)) == 0) ++i;
        ++tally_.mismatches;
        tally_.problem("optimizer: " + specs_[g].name + " " + names[w] + "[" + std::to_string(i) +
                       "] = " + std::to_string(got[w][i]) + " after step " +
                       std::to_string(ref_steps_) + ", reference " + std::to_string((*want[w])[i]));
        ++tally_.opt_rebuilds;
        rebuild();  // start over from a known state rather than report the same drift again
        return;
      }
      tally_.bytes_verified += 3 * n * sizeof(float);
    }
  }

  const Shared& sh_;
  std::mt19937_64 rng_;
  std::shared_ptr<swap::FaultPlan> plan_;
  std::vector<offload::ParamGroupSpec> specs_;
  offload::OptimizerOptions opts_;
  std::unique_ptr<adam::CpuAdam> ref_adam_;
  std::vector<std::vector<float>> p_, m_, v_, g_;
  std::vector<float> sp_, sm_, sv_;  // read-back scratch, the largest group's size
  std::uint64_t ref_steps_ = 0;
  std::unique_ptr<offload::OffloadedOptimizer> opt_;
  std::uint64_t pinned_peak_ = 0;
  Tally tally_;
};

// ---- Prefetch worker ----------------------------------------------------------------------

// Layers of odd sizes in a SwapStore, read through a LayerPrefetcher on the host-simulated
// device; every acquired layer is copied back and checked. One segment is a prefetcher's life:
// two iterations of forward then backward order. A read ahead is not tied to one acquire, so
// faults are attributed per segment: hard faults injected in a segment must have surfaced as
// at least one acquire error in it, and no error may surface without one.
class PrefetchWorker {
 public:
  static constexpr std::size_t kLayers = 6;
  static constexpr std::size_t kDepth = 2;

  explicit PrefetchWorker(const Shared& sh)
      : sh_(sh), rng_(sh.cfg->seed * 15485863 + 2),
        plan_(make_plan(sh.cfg->fault_rate, sh.cfg->seed * 15485863 + 2)) {
    engine_ = swap::make_io_engine(io_options(*sh.cfg, plan_));
    // max_bytes = the budget share; staging half of it; the largest layer an eighth, so that
    // the window holds depth + 2 layers in staging and device memory.
    max_layer_ = std::max<std::uint64_t>(4096, sh.prefetch_budget / 8 / 4096 * 4096 - 4096);
    for (std::size_t l = 0; l < kLayers; ++l) {
      sizes_.push_back(std::uniform_int_distribution<std::uint64_t>(1, max_layer_)(rng_));
    }
    sizes_[0] = max_layer_;  // one whole-block layer, the rest odd
    store_ = make_store(sh, *engine_, kLayers * (max_layer_ + kStripe * (sh.store_dirs.size() + 1)));
    unit_ = store_->alignment();
    gens_.assign(kLayers, 0);
    device_ = cuda::make_device(cuda::DeviceOptions{.kind = cuda::DeviceKind::kHost});
    compute_ = device_->create_stream();
    host_.resize(max_layer_);
    for (std::size_t l = 0; l < kLayers; ++l) store_->allocate(key(l), sizes_[l]);
  }

  void run() {
    for (std::size_t l = 0; l < kLayers; ++l) write_until_done(l);
    while (sh_.running()) {
      if (tally_.prefetch_passes > 0) write_until_done(static_cast<std::size_t>(rng_() % kLayers));
      segment();
    }
    tally_.injected = counts_of(plan_.get());
  }

  Tally& tally() { return tally_; }
  std::uint64_t staging_bytes() const { return sh_.prefetch_budget / 2; }
  std::uint64_t peak_held() const { return peak_held_; }

 private:
  static std::string key(std::size_t l) { return "layer" + std::to_string(l); }
  static std::uint32_t uid(std::size_t l) { return static_cast<std::uint32_t>(l + 1); }

  // Writes layer `l` whole with a new generation, retrying while faults fail the write.
  void write_until_done(std::size_t l) {
    const std::uint64_t padded = store_->padded_size(sizes_[l]);
    // Layer writes borrow the swap workers' pool: their memory is counted in its peak.
    swap::BufferLease lease = sh_.swap_pool->acquire(padded);
    for (int attempt = 0; attempt < 1000; ++attempt) {
      const std::uint32_t gen = ++next_gen_;
      fill(lease.span().first(padded), uid(l), gen, 0);
      const FaultCounts before = counts_of(plan_.get());
      OpError err;
      try {
        err = error_of(store_->swap_out(key(l), lease.span()).wait_status());
      } catch (const IoError& e) {
        err = error_of(e);
      }
      ++tally_.prefetch_layer_writes;
      judge(tally_, "swap_out " + key(l), counts_of(plan_.get()) - before, err);
      if (!err.failed) {
        gens_[l] = gen;
        tally_.bytes_written += padded;
        return;
      }
    }
    throw Error("prefetch worker: layer " + key(l) + " not written in 1000 attempts");
  }

  void segment() {
    prefetch::PrefetcherOptions po;
    for (std::size_t l = 0; l < kLayers; ++l) po.layer_keys.push_back(key(l));
    for (std::size_t l = 0; l < kLayers; ++l) po.order.push_back(l);
    for (std::size_t l = kLayers; l-- > 0;) po.order.push_back(l);
    po.depth = kDepth;
    po.max_bytes = sh_.prefetch_budget;
    po.staging_bytes = staging_bytes();
    const FaultCounts before = counts_of(plan_.get());
    std::uint64_t errors = 0;
    std::string first_error;
    OpError other;
    std::uint64_t dropped = 0;
    {
      prefetch::LayerPrefetcher p(po, *store_, *device_, compute_.ref());
      try {
        for (int iter = 0; iter < 2; ++iter) {
          for (std::size_t l : po.order) acquire_and_check(p, l, errors, first_error);
          if (iter == 0) p.end_iteration();
        }
      } catch (const Error& e) {
        other = error_of(e);  // not a read failure of a layer: judged below
      }
      // The window has read ahead into the next iteration: let those reads finish, so that
      // the counts are final. A failed read nobody acquired is then in read_failures but in
      // no acquire's error; the destructor logs it (a warning naming file, offset, length).
      p.wait_for_reads();
      const prefetch::PrefetcherStats st = p.stats();
      if (st.read_failures > errors) dropped = st.read_failures - errors;
      peak_held_ = std::max(peak_held_, st.peak_held_bytes);
    }  // the destructor waits for every read in flight, so the plan's counts are final
    ++tally_.prefetch_passes;
    tally_.prefetch_reads_dropped += dropped;
    const FaultCounts delta = counts_of(plan_.get()) - before;
    if (other.failed) {
      judge(tally_, "prefetch segment", FaultCounts{}, other);
      return;
    }
    const std::string what = "prefetch segment " + std::to_string(tally_.prefetch_passes);
    if (errors == 0 && dropped > 0 && delta.hard() > 0) {
      // Surfaced as the prefetcher's warning: the only failed reads were of layers read
      // ahead and never acquired (nothing was handed out from them).
      ++tally_.failed_ops;
      tally_.hard_surfaced += delta.hard();
      return;
    }
    OpError seg;
    if (errors > 0) seg = {true, ErrorCode::kIo, first_error};
    if (errors > 0 && delta.hard() > 0) tally_.failed_ops += errors - 1;  // judge adds one
    judge(tally_, what, delta, seg);
  }

  void acquire_and_check(prefetch::LayerPrefetcher& p, std::size_t l, std::uint64_t& errors,
                         std::string& first_error) {
    cuda::DeviceSpan span;
    for (int attempt = 0;; ++attempt) {
      try {
        span = p.acquire(l);
        break;
      } catch (const IoError& e) {
        // The layer is dropped; acquiring it again reads it again.
        ++errors;
        if (first_error.empty()) first_error = e.what();
        if (e.code() == ErrorCode::kCorrupt || attempt >= 100) throw;
      }
    }
    ++tally_.prefetch_acquires;
    std::span<std::byte> out(host_.data(), sizes_[l]);
    device_->copy_to_host(compute_.ref(), out, span);
    p.release(l);
    device_->synchronize(compute_.ref());
    const std::uint32_t gen = gens_[l];
    const std::string bad = check(out, uid(l), 0, unit_, [gen](std::uint64_t) { return gen; });
    if (!bad.empty()) {
      ++tally_.mismatches;
      tally_.problem("prefetch " + key(l) + ": mismatch at " + bad);
      return;
    }
    tally_.bytes_verified += sizes_[l];
  }

  const Shared& sh_;
  std::mt19937_64 rng_;
  std::shared_ptr<swap::FaultPlan> plan_;
  std::unique_ptr<swap::IoEngine> engine_;
  std::uint64_t max_layer_ = 0;
  std::vector<std::uint64_t> sizes_;
  std::unique_ptr<swap::SwapStore> store_;
  std::uint64_t unit_ = 4096;
  std::vector<std::uint32_t> gens_;
  std::uint32_t next_gen_ = 0;
  std::unique_ptr<cuda::Device> device_;
  cuda::Stream compute_;
  std::vector<std::byte> host_;
  std::uint64_t peak_held_ = 0;
  Tally tally_;
};

// Runs `body` and turns anything it throws into a problem of `tally` (a worker must never take
// the process down, and an exception that escapes is itself a finding).
template <typename Body>
void guarded(Tally& tally, const char* who, Body body) {
  try {
    body();
  } catch (const std::exception& e) {
    ++tally.unexpected_errors;
    tally.problem(std::string(who) + " stopped: " + e.what());
  }
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
  const Config cfg = parse(tokens, &help);
  if (help) {
    std::fputs(kHelp, stdout);
    return 0;
  }

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
  sh.max_tensor = std::min<std::uint64_t>(8ull << 20, swap_budget / (cfg.workers + 1) / 4096 * 4096 - 4096);
  swap::BufferPoolOptions bo;
  bo.budget_bytes = swap_budget;
  swap::BufferPool pool(bo);
  sh.swap_pool = &pool;

  std::vector<std::unique_ptr<SwapWorker>> swappers;
  for (std::size_t i = 0; i < cfg.workers; ++i) swappers.push_back(std::make_unique<SwapWorker>(sh, i));
  OptimizerWorker optimizer(sh);
  PrefetchWorker prefetcher(sh);

  const auto start = Clock::now();
  sh.deadline = start + cfg.duration;
  {
    std::vector<std::jthread> threads;
    for (auto& w : swappers) {
      threads.emplace_back([&w] { guarded(w->tally(), "swap worker", [&] { w->run(); }); });
    }
    threads.emplace_back([&] { guarded(optimizer.tally(), "optimizer worker", [&] { optimizer.run(); }); });
    threads.emplace_back([&] { guarded(prefetcher.tally(), "prefetch worker", [&] { prefetcher.run(); }); });
  }
  const double seconds = seconds_since(start);
  throw_if_interrupted();  // a cut-short soak proves nothing: no report, no verdict

  Tally t;
  std::string planted;
  for (auto& w : swappers) {
    t.add(w->tally());
    if (!w->planted.empty()) planted = w->planted;
  }
  t.add(optimizer.tally());
  t.add(prefetcher.tally());

  // Pinned memory: the arenas are reserved whole (swap pool, prefetch staging) and the
  // optimizer's ring as it grows; the peak adds each part's own peak, an upper bound on the
  // true simultaneous peak.
  const std::uint64_t reserved = pool.budget_bytes() + optimizer.pinned_peak() + prefetcher.staging_bytes();
  const std::uint64_t peak = pool.peak_bytes_in_use() + optimizer.pinned_peak() + prefetcher.staging_bytes();
  const bool overrun = reserved > cfg.budget || peak > cfg.budget ||
                       pool.peak_bytes_in_use() > pool.budget_bytes() ||
                       optimizer.pinned_peak() > sh.opt_budget ||
                       prefetcher.peak_held() > sh.prefetch_budget;
  if (overrun) t.problem("pinned memory over budget");
  if (cfg.plant && planted.empty()) t.problem("plant-corruption: nothing was planted");

  const bool pass = t.mismatches == 0 && t.hard_unsurfaced == 0 && t.unexpected_errors == 0 &&
                    t.corruption_errors == 0 && t.errors_without_context == 0 && !overrun &&
                    !(cfg.plant && planted.empty());
  const char* kind_names[kRuleCount] = {"eio", "enospc", "short", "eagain", "delay"};
  const std::string engine_name = swappers[0]->engine_name();

  if (cfg.json) {
    JsonWriter j;
    j.field("command", "stress");
    j.field("result", pass ? "pass" : "fail");
    j.field("seconds", seconds);
    j.field("workers", cfg.workers);
    j.field("fault_rate", cfg.fault_rate);
    j.field("seed", cfg.seed);
    j.field("checksums", cfg.checksums);
    j.field("engine", engine_name);
    j.field("dirs", cfg.dirs);
    j.field("operations", t.operations());
    j.field("swap_outs", t.swap_outs);
    j.field("swap_ins", t.swap_ins);
    j.field("optimizer_steps", t.opt_steps);
    j.field("optimizer_steps_undone", t.opt_undone);
    j.field("optimizer_rebuilds", t.opt_rebuilds);
    j.field("optimizer_state_transfers", t.opt_state_reads);
    j.field("prefetch_segments", t.prefetch_passes);
    j.field("prefetch_acquires", t.prefetch_acquires);
    j.field("prefetch_layer_writes", t.prefetch_layer_writes);
    j.field("prefetch_reads_dropped", t.prefetch_reads_dropped);
    j.field("bytes_verified", t.bytes_verified);
    j.field("bytes_written", t.bytes_written);
    j.field("faults_injected", t.injected.total());
    for (std::size_t i = 0; i < kRuleCount; ++i) {
      j.field(std::string("faults_") + kind_names[i], t.injected.by_rule[i]);
    }
    j.field("hard_faults", t.injected.hard());
    j.field("hard_faults_surfaced", t.hard_surfaced);
    j.field("hard_faults_unsurfaced", t.hard_unsurfaced);
    j.field("failed_operations", t.failed_ops);
    j.field("unexpected_errors", t.unexpected_errors);
    j.field("corruption_errors", t.corruption_errors);
    j.field("errors_without_context", t.errors_without_context);
    j.field("mismatches", t.mismatches);
    j.field("pinned_budget_bytes", cfg.budget);
    j.field("pinned_reserved_bytes", reserved);
    j.field("pinned_peak_bytes", peak);
    j.field("budget_overrun", overrun);
    j.field("library_errors_logged", log_throttle.errors());
    j.field("library_warnings_logged", log_throttle.warnings());
    j.field("planted", planted);
    j.field("problems", t.problems);
    std::printf("%s\n", j.str().c_str());
  } else {
    std::printf("zinf stress: %.1f s, %llu swap workers + optimizer + prefetch, engine=%s, "
                "faults=%g, seed=%llu, checksums=%s\n",
                seconds, static_cast<unsigned long long>(cfg.workers), engine_name.c_str(),
                cfg.fault_rate, static_cast<unsigned long long>(cfg.seed),
                cfg.checksums ? "on" : "off");
    std::printf("  operations        %llu (swap_out %llu, swap_in %llu, optimizer steps %llu, "
                "state transfers %llu, prefetch acquires %llu, layer writes %llu)\n",
                static_cast<unsigned long long>(t.operations()),
                static_cast<unsigned long long>(t.swap_outs),
                static_cast<unsigned long long>(t.swap_ins),
                static_cast<unsigned long long>(t.opt_steps),
                static_cast<unsigned long long>(t.opt_state_reads),
                static_cast<unsigned long long>(t.prefetch_acquires),
                static_cast<unsigned long long>(t.prefetch_layer_writes));
    std::printf("  bytes verified    %s (written %s)\n", mib(t.bytes_verified).c_str(),
                mib(t.bytes_written).c_str());
    std::printf("  faults injected   %llu (EIO %llu, ENOSPC %llu, short %llu, EAGAIN %llu, delay %llu)\n",
                static_cast<unsigned long long>(t.injected.total()),
                static_cast<unsigned long long>(t.injected.by_rule[kRuleEio]),
                static_cast<unsigned long long>(t.injected.by_rule[kRuleEnospc]),
                static_cast<unsigned long long>(t.injected.by_rule[kRuleShort]),
                static_cast<unsigned long long>(t.injected.by_rule[kRuleEagain]),
                static_cast<unsigned long long>(t.injected.by_rule[kRuleDelay]));
    std::printf("  hard faults       %llu: %llu surfaced as errors of %llu failed operations, "
                "%llu unsurfaced\n",
                static_cast<unsigned long long>(t.injected.hard()),
                static_cast<unsigned long long>(t.hard_surfaced),
                static_cast<unsigned long long>(t.failed_ops),
                static_cast<unsigned long long>(t.hard_unsurfaced));
    std::printf("  prefetch          %llu failed reads of layers read ahead and never acquired "
                "(logged as warnings)\n",
                static_cast<unsigned long long>(t.prefetch_reads_dropped));
    std::printf("  optimizer         %llu steps undone by failed reads, %llu rebuilds after failures\n",
                static_cast<unsigned long long>(t.opt_undone),
                static_cast<unsigned long long>(t.opt_rebuilds));
    std::printf("  mismatches        %llu\n", static_cast<unsigned long long>(t.mismatches));
    std::printf("  unexpected errors %llu (corruption found %llu, without context %llu)\n",
                static_cast<unsigned long long>(t.unexpected_errors + t.corruption_errors),
                static_cast<unsigned long long>(t.corruption_errors),
                static_cast<unsigned long long>(t.errors_without_context));
    std::printf("  pinned memory     peak %s, reserved %s, budget %s%s\n", mib(peak).c_str(),
                mib(reserved).c_str(), mib(cfg.budget).c_str(), overrun ? " (OVERRUN)" : "");
    if (log_throttle.errors() > LogThrottle::kShown) {
      std::printf("  library log       %llu error lines (the first %llu shown on stderr)\n",
                  static_cast<unsigned long long>(log_throttle.errors()),
                  static_cast<unsigned long long>(LogThrottle::kShown));
    }
    if (!planted.empty()) std::printf("  planted           %s\n", planted.c_str());
    for (const auto& p : t.problems) std::printf("  problem: %s\n", p.c_str());
    std::printf("%s\n", pass ? "PASS: every byte verified, every hard fault surfaced"
                             : "FAIL: see the problems above");
  }
  return pass ? 0 : 1;
}

}  // namespace zinf::tools
