// SPDX-License-Identifier: Apache-2.0
// LayerPrefetcher: the window of layers in flight, its NVMe -> pinned -> device chain (driven by
// I/O completion callbacks and host functions on the copy stream) or its host copy -> device
// copies, the layer and byte bounds, order tracing, and stall accounting with host functions on
// the compute stream. The two sources differ only in how an issue gets the host bytes its copy
// reads (try_issue) and in what suspend waits for (source_free); everything else is one policy.
#include "zinf/prefetch/layer_prefetcher.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "zinf/common/error.h"
#include "zinf/common/log.h"
#include "zinf/prefetch/testing.h"
#include "zinf/swap/buffer_pool.h"

namespace zinf::prefetch {
namespace {

using Clock = std::chrono::steady_clock;

// How long a blocked acquire sleeps between re-checks when nothing notifies it. Progress is
// normally signalled (read done, copy done, release passed); this only bounds the wait for
// what cannot signal: a stream that failed skips its host functions, and then the next
// re-check queries the events and surfaces the failure.
constexpr std::chrono::milliseconds kRecheckInterval{20};

// A bound that keeps depth arithmetic (depth + 2 layers of staging) far from overflow; no
// window is anywhere near this deep.
constexpr std::size_t kMaxDepth = 1u << 16;

// Wakes callers blocked in acquire when asynchronous work progresses. Shared (shared_ptr) with
// host functions on the caller's compute stream, which may run after the prefetcher is gone.
class Progress {
 public:
  void notify() {
    {
      std::lock_guard lock(mu_);
      ++epoch_;
    }
    cv_.notify_all();
  }
  std::uint64_t epoch() const {
    std::lock_guard lock(mu_);
    return epoch_;
  }
  /// Returns once the epoch differs from `seen` or after `timeout`.
  void wait_past(std::uint64_t seen, std::chrono::nanoseconds timeout) const {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, timeout, [&] { return epoch_ != seen; });
  }

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::uint64_t epoch_ = 0;
};

// Counters written by host functions on the compute stream (possibly after the prefetcher).
struct StreamCounters {
  std::atomic<std::uint64_t> late{0};
  std::atomic<std::int64_t> stall_ns{0};
};

// One issue of a layer: the NVMe read and the copy after it (host source: the copy only).
// Shared with the read's completion callback and the copy stream's host function.
//
// Hand-offs: the caller fills `staging` before submitting; the completion callback then owns
// it (reads its span, or resets it on failure) and publishes its outcome with `phase`
// (release); on success the host function after the copy resets it. The caller reads the
// failure fields only after loading phase == kFailed (acquire). Failures cross threads as
// values (a Status, a message) and become exceptions on the caller's thread: an exception_ptr
// released last on an engine thread races with the caller still reading the exception.
struct Issue {
  enum Phase : int { kReading = 0, kCopyEnqueued = 1, kFailed = 2 };
  std::atomic<int> phase{kReading};
  Status read_failure;              // the read's failed Status (from the engine)
  bool device_failure = false;      // the copy could not be enqueued: fatal for the prefetcher
  std::string device_failure_text;  // its message
  std::exception_ptr submit_error;  // swap_in refused synchronously (caller's thread only)
  swap::BufferLease staging;        // store source: what the read fills
  std::span<const std::byte> source;  // what the copy reads: the staging, or the host copy
  swap::IoTicket ticket;              // caller only; empty for the host source
  std::uint64_t generation = 0;
};

// The text of a failed issue's read: the engine's Status, or the synchronous refusal.
std::string read_failure_text(const Issue& issue) {
  if (issue.submit_error) {
    try {
      std::rethrow_exception(issue.submit_error);
    } catch (const std::exception& e) {
      return e.what();
    } catch (...) {
      return "unknown error";
    }
  }
  return issue.read_failure.to_string();
}

enum class SlotState {
  kIdle,      // nothing held
  kWindow,    // issued (reading, copying or copied), not acquired
  kAcquired,  // between acquire and release: the caller's
  kReleased,  // released; memory held until the compute stream passes release_event
};

struct Slot {
  std::string key;
  std::uint64_t bytes = 0;          // device bytes (the tensor's size)
  std::uint64_t staging_bytes = 0;  // padded, what the read moves
  SlotState state = SlotState::kIdle;
  std::shared_ptr<Issue> issue;
  cuda::DeviceBuffer buffer;
  cuda::Event copy_event;        // recorded on the copy stream after the copy of the latest issue
  cuda::Event release_event;     // recorded on the compute stream by release()
  std::uint64_t generation = 0;  // issues so far
  // suspend() .. resume(): the layer's stored bytes are being rewritten; never issued, never
  // handed out, and no copy of it is kept in the window.
  bool suspended = false;
  // The device copy predates a rewrite (suspend met it while the compute stream, or its copy,
  // still used its memory): never handed out again, recycled once the stream is past it.
  bool stale = false;
  // The generation whose copy has completed, stored by the copy stream's host function and
  // read by the compute stream's probe (late or not).
  std::shared_ptr<std::atomic<std::uint64_t>> copied_generation =
      std::make_shared<std::atomic<std::uint64_t>>(0);
};

}  // namespace

struct LayerPrefetcher::Impl {
  static constexpr std::size_t kNoLayer = ~std::size_t{0};
  Impl(PrefetcherOptions opts, swap::SwapStore* s, std::vector<std::span<const std::byte>> h,
       cuda::Device& d, cuda::StreamRef compute);
  ~Impl();

  // ---- helpers; all called with mu_ held ----
  void check_failed() const;
  [[noreturn]] void fail_and_rethrow(std::exception_ptr error);
  Slot& slot_of(std::size_t layer, const char* op);
  std::uint64_t staging_in_use() const { return pool ? pool->bytes_in_use() : 0; }
  std::uint64_t held_bytes() const { return staging_in_use() + device_bytes; }
  std::size_t window_count() const;
  bool issue_done(Slot& s);
  bool source_free(Slot& s);
  void drop_stale(Slot& s, std::unique_lock<std::mutex>& lock);
  void wait_for_reads();
  bool release_done(Slot& s) { return s.release_event.query(); }
  bool predicted_soon(std::size_t layer) const;
  void recycle(Slot& s);
  void poll(bool keep_predicted, std::size_t keep_layer = kNoLayer);
  bool evict_one();
  bool try_issue(std::size_t layer);
  void fill_window();
  void preallocate();
  bool track_order(std::size_t layer);
  void fetch_on_demand(std::size_t layer, std::unique_lock<std::mutex>& lock);
  void wait_for_read(Slot& s, std::unique_lock<std::mutex>& lock);
  void wait_progress(std::uint64_t seen, std::unique_lock<std::mutex>& lock);
  void on_read_complete(const std::shared_ptr<Issue>& issue, std::size_t layer,
                        const Status& status);
  void enqueue_copy(const std::shared_ptr<Issue>& issue, std::size_t layer);

  PrefetcherOptions options;
  // The source: a store (NVMe reads into staging), or else the caller's host copies.
  swap::SwapStore* store;
  std::vector<std::span<const std::byte>> host;
  cuda::Device& device;
  cuda::StreamRef compute;
  std::shared_ptr<Progress> progress = std::make_shared<Progress>();
  std::shared_ptr<StreamCounters> counters = std::make_shared<StreamCounters>();

  // Declared in acquisition order: the pool before its pinned registration, the slots (device
  // buffers, events) after, and the copy stream last so that it drains first at destruction
  // (its queued host functions return staging leases to the pool).
  std::unique_ptr<swap::BufferPool> pool;  // staging; store source only
  cuda::PinnedRegistration pinned;
  mutable std::mutex mu;
  std::vector<Slot> slots;
  std::multimap<std::uint64_t, cuda::DeviceBuffer> cache;  // free device buffers by size
  std::uint64_t device_bytes = 0;  // all device memory held: slots' buffers and the cache

  // Order tracking.
  std::vector<std::size_t> order;    // the prediction (empty while tracing the first time)
  bool tracing = true;               // on demand, recording, until end_iteration
  std::size_t position = 0;          // next index into order
  std::vector<std::size_t> current;  // this iteration's acquisitions so far

  bool failed = false;
  Status failure;

  PrefetcherStats stats;  // under mu (the atomics below are merged in stats())
  std::atomic<std::uint64_t> bytes_read{0};
  std::atomic<std::uint64_t> bytes_to_device{0};
  std::atomic<std::uint64_t> read_failures{0};

  // Time with at least one read in flight. Its own lock: completions run on engine threads,
  // which must never take mu.
  struct ReadBusy {
    mutable std::mutex mu;
    std::size_t in_flight = 0;
    std::chrono::steady_clock::time_point since;
    std::chrono::nanoseconds total{0};
    void begin() {
      std::lock_guard lock(mu);
      if (in_flight++ == 0) since = std::chrono::steady_clock::now();
    }
    void end() {
      std::lock_guard lock(mu);
      if (--in_flight == 0) total += std::chrono::steady_clock::now() - since;
    }
    std::chrono::nanoseconds now_total() const {
      std::lock_guard lock(mu);
      return in_flight == 0 ? total : total + (std::chrono::steady_clock::now() - since);
    }
  } read_busy;

  // test_hooks::set_copy_hook: host work before each copy (set before any copy is enqueued).
  std::function<void(std::size_t)> copy_hook;

  cuda::Stream copy_stream;  // last: destroyed (drained) first
};

namespace {

swap::BufferPoolOptions pool_options(const PrefetcherOptions& o, const swap::SwapStore& store,
                                     std::uint64_t largest_staging) {
  swap::BufferPoolOptions p;
  // Staging is held only from a read's start to its copy's end, so the window's layers (depth
  // + 1) plus one on-demand layer need at most this much at once.
  p.budget_bytes = o.staging_bytes != 0
                       ? o.staging_bytes
                       : std::min<std::uint64_t>(o.max_bytes, (o.depth + 2) * largest_staging);
  p.alignment = std::max<std::uint32_t>(store.alignment(), 4096);
  p.huge_pages = o.huge_pages;
  p.prefault = o.prefault_staging;
  return p;
}

}  // namespace

LayerPrefetcher::Impl::Impl(PrefetcherOptions opts, swap::SwapStore* s,
                            std::vector<std::span<const std::byte>> h, cuda::Device& d,
                            cuda::StreamRef compute_stream)
    : options(std::move(opts)), store(s), host(std::move(h)), device(d), compute(compute_stream) {
  if (options.depth > kMaxDepth) {
    throw UsageError("layer prefetcher: depth " + std::to_string(options.depth) + " is above " +
                     std::to_string(kMaxDepth));
  }
  if (compute.empty() || compute.device() != &device) {
    throw UsageError("layer prefetcher: the compute stream must be a stream of device " +
                     std::string(device.name()));
  }
  // The layers and what each needs, by source.
  if (store != nullptr) {
    slots.resize(options.layer_keys.size());
    for (std::size_t i = 0; i < slots.size(); ++i) {
      Slot& slot = slots[i];
      slot.key = options.layer_keys[i];
      if (!store->contains(slot.key)) {
        throw UsageError("layer prefetcher: unknown layer key '" + slot.key + "'");
      }
      slot.bytes = store->size_of(slot.key);
      slot.staging_bytes = store->padded_size(slot.bytes);
    }
  } else {
    if (!options.layer_keys.empty() || options.register_with_engine != nullptr) {
      throw UsageError(
          "layer prefetcher: layer_keys and register_with_engine are for a store "
          "source; host copies have neither keys nor staging");
    }
    slots.resize(host.size());
    for (std::size_t i = 0; i < slots.size(); ++i) {
      if (host[i].empty()) {
        throw UsageError("layer prefetcher: the host copy of layer " + std::to_string(i) +
                         " is empty");
      }
      slots[i].key = "host copy " + std::to_string(i);
      slots[i].bytes = host[i].size();
    }
  }
  std::uint64_t largest_staging = 0;
  for (const Slot& slot : slots) largest_staging = std::max(largest_staging, slot.staging_bytes);
  if (slots.empty() || (store != nullptr && largest_staging == 0)) {
    throw UsageError("layer prefetcher: no layers");
  }
  if (store != nullptr) {
    pool = std::make_unique<swap::BufferPool>(pool_options(options, *store, largest_staging));
  }
  for (std::size_t i = 0; i < slots.size(); ++i) {
    const Slot& slot = slots[i];
    if (slot.staging_bytes + slot.bytes > options.max_bytes) {
      throw UsageError("layer prefetcher: max_bytes " + std::to_string(options.max_bytes) +
                       " cannot hold layer " + std::to_string(i) + " ('" + slot.key +
                       "'): it needs " +
                       (pool ? std::to_string(slot.staging_bytes) + " bytes of staging plus " +
                                   std::to_string(slot.bytes) + " on the device"
                             : std::to_string(slot.bytes) + " bytes on the device"));
    }
    if (pool && slot.staging_bytes > pool->budget_bytes()) {
      throw UsageError("layer prefetcher: staging_bytes " + std::to_string(pool->budget_bytes()) +
                       " cannot hold layer " + std::to_string(i) + " ('" + slot.key +
                       "'): it needs " + std::to_string(slot.staging_bytes));
    }
  }
  for (std::size_t l : options.order) {
    if (l >= slots.size()) {
      throw UsageError("layer prefetcher: order names layer " + std::to_string(l) +
                       " but there are " + std::to_string(slots.size()) + " layers");
    }
  }
  order = options.order;
  tracing = order.empty();
  if (pool) {
    pinned = device.register_host(pool->arena());
    if (options.register_with_engine != nullptr) {
      std::span<std::byte> arena = pool->arena();
      // False (with a notice from the engine) where the memlock limit refuses: I/O then works
      // unregistered, so it is not an error.
      (void)options.register_with_engine->register_buffers(
          std::span<const std::span<std::byte>>(&arena, 1));
    }
  }
  for (Slot& slot : slots) {
    slot.copy_event = device.create_event();
    slot.release_event = device.create_event();
  }
  if (options.preallocate_device) preallocate();
  copy_stream = device.create_stream();
}

// Fills the cache with device buffers for the first layers the window will hold, leaving room
// in max_bytes for the largest layer's staging and device memory, so that on-demand fetches
// still fit.
void LayerPrefetcher::Impl::preallocate() {
  std::uint64_t largest = 0;
  for (const Slot& s : slots) largest = std::max(largest, s.staging_bytes + s.bytes);
  const std::vector<std::size_t>& first = order.empty() ? options.order : order;
  const std::size_t n = std::min<std::size_t>(options.depth + 2, slots.size());
  for (std::size_t k = 0; k < n; ++k) {
    const std::size_t layer = first.empty() ? k : first[k % first.size()];
    const std::uint64_t bytes = slots[layer].bytes;
    if (device_bytes + bytes + largest > options.max_bytes) break;
    cache.emplace(bytes, device.allocate(bytes));
    device_bytes += bytes;
  }
}

void LayerPrefetcher::Impl::wait_for_reads() {
  // A ticket's wait returns after its completion callback has returned, so once these are
  // done every issue's phase is final (reads issued later are not waited for).
  std::vector<swap::IoTicket> tickets;
  {
    std::lock_guard lock(mu);
    for (Slot& s : slots) {
      if (s.issue) tickets.push_back(s.issue->ticket);
    }
  }
  for (auto& t : tickets)
    t.wait_status().ignore("a failure surfaces at acquire or is logged at destruction");
}

LayerPrefetcher::Impl::~Impl() {
  // Reads in flight use staging leases and enqueue copies into the slots' buffers: wait for
  // every completion callback.
  wait_for_reads();
  // A read issued ahead that failed and was never acquired: nothing is lost (the layer would
  // have been read again), but the drive failed and no caller was told. Say so.
  try {
    std::lock_guard lock(mu);
    for (std::size_t i = 0; i < slots.size(); ++i) {
      const Slot& s = slots[i];
      if (s.state != SlotState::kWindow || !s.issue) continue;
      if (s.issue->phase.load(std::memory_order_acquire) != Issue::kFailed) continue;
      if (s.issue->device_failure) continue;  // the copy's: it already failed the prefetcher
      log(LogLevel::kWarning,
          "layer prefetcher: the read of layer " + std::to_string(i) +
              ", issued ahead and never acquired, failed: " + read_failure_text(*s.issue));
    }
  } catch (...) {
    // Logging is best effort in a destructor.
  }
  // The engine's registration pins the arena's pages: once the arena is unmapped, a later
  // arena mapped at the same address would be read into the old pages. Drop it while no read
  // of ours is in flight.
  if (options.register_with_engine != nullptr) {
    try {
      (void)options.register_with_engine->register_buffers({});
    } catch (const std::exception& e) {
      log(LogLevel::kWarning,
          std::string("layer prefetcher: unregistering the staging arena: ") + e.what());
    }
  }
  // Work enqueued on the compute stream may still read layer buffers.
  try {
    device.synchronize(compute);
  } catch (const std::exception& e) {
    log(LogLevel::kDebug,
        std::string("layer prefetcher: compute stream failed before destruction: ") + e.what());
  }
  // copy_stream (declared last) drains as it is destroyed, before the slots and the pool.
}

void LayerPrefetcher::Impl::check_failed() const {
  if (failed) throw EngineFailed(failure);
}

void LayerPrefetcher::Impl::fail_and_rethrow(std::exception_ptr error) {
  if (!failed) {
    std::string what = "unknown error";
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {}
    failed = true;
    failure = Status::error(ErrorCode::kFailedState, what)
                  .with_operation("layer prefetch")
                  .with_path(std::string(device.name()));
    log(LogLevel::kError, "layer prefetcher failed: " + what);
  }
  std::rethrow_exception(error);
}

Slot& LayerPrefetcher::Impl::slot_of(std::size_t layer, const char* op) {
  if (layer >= slots.size()) {
    throw UsageError(std::string("layer prefetcher: ") + op + " of layer " + std::to_string(layer) +
                     " but there are " + std::to_string(slots.size()) + " layers");
  }
  return slots[layer];
}

std::size_t LayerPrefetcher::Impl::window_count() const {
  std::size_t n = 0;
  for (const Slot& s : slots) {
    if (s.state == SlotState::kWindow || s.state == SlotState::kReleased) ++n;
  }
  return n;
}

bool LayerPrefetcher::Impl::issue_done(Slot& s) {
  if (!s.issue) return true;
  switch (s.issue->phase.load(std::memory_order_acquire)) {
    case Issue::kReading: return false;
    case Issue::kFailed: return !s.issue->device_failure;
    default: return s.copy_event.query();  // throws DeviceError if the copy stream failed
  }
}

// True once nothing reads the layer's source for its latest issue, so that the caller may
// rewrite it: the store's read is over (the copy reads the staging, not the key), or the host
// source's copy, which reads the host copy itself, has completed.
bool LayerPrefetcher::Impl::source_free(Slot& s) {
  if (!s.issue) return true;
  switch (s.issue->phase.load(std::memory_order_acquire)) {
    case Issue::kReading: return false;
    case Issue::kFailed: return !s.issue->device_failure;
    default: return store != nullptr || s.copy_event.query();  // throws DeviceError on failure
  }
}

// Waits until a stale copy of the layer can be recycled (its copy over, the compute stream past
// its release) and recycles it, so that the layer is fetched anew.
void LayerPrefetcher::Impl::drop_stale(Slot& s, std::unique_lock<std::mutex>& lock) {
  for (;;) {
    const std::uint64_t seen = progress->epoch();
    if (!s.stale) return;
    if (issue_done(s) && release_done(s)) {
      recycle(s);
      return;
    }
    wait_progress(seen, lock);
  }
}

bool LayerPrefetcher::Impl::predicted_soon(std::size_t layer) const {
  if (tracing || order.empty()) return false;
  const std::size_t n = std::min(options.depth, order.size());
  for (std::size_t k = 0; k < n; ++k) {
    if (order[(position + k) % order.size()] == layer) return true;
  }
  return false;
}

// Returns the slot's device buffer to the cache (kept for the next issue of that size) and
// drops the issue. The caller has checked that no copy or compute still uses either.
void LayerPrefetcher::Impl::recycle(Slot& s) {
  if (!s.buffer.empty()) {
    const std::uint64_t size = s.buffer.size();
    cache.emplace(size, std::move(s.buffer));
  }
  s.issue.reset();
  s.state = SlotState::kIdle;
  s.stale = false;
}

// Recycles released layers the compute stream has passed. With keep_predicted, a released
// layer that the prediction wants again within the window stays resident; so does keep_layer.
// A stale one never does.
void LayerPrefetcher::Impl::poll(bool keep_predicted, std::size_t keep_layer) {
  for (std::size_t i = 0; i < slots.size(); ++i) {
    Slot& s = slots[i];
    if (s.state != SlotState::kReleased) continue;
    if (!s.stale && (i == keep_layer || (keep_predicted && predicted_soon(i)))) continue;
    if (release_done(s) && issue_done(s)) recycle(s);
  }
}

// Drops one issued, unacquired layer whose read and copy are over. Returns false if none is.
bool LayerPrefetcher::Impl::evict_one() {
  for (std::size_t i = 0; i < slots.size(); ++i) {
    Slot& s = slots[i];
    if (s.state != SlotState::kWindow || !issue_done(s) || !release_done(s)) continue;
    if (s.issue && s.issue->phase.load(std::memory_order_acquire) == Issue::kFailed) {
      ++stats.evictions;
      log(LogLevel::kWarning, "layer prefetcher: dropping the failed read of layer " +
                                  std::to_string(i) +
                                  ", evicted before any acquire (it will "
                                  "be read again when acquired): " +
                                  read_failure_text(*s.issue));
    } else {
      ++stats.evictions;
    }
    recycle(s);
    return true;
  }
  return false;
}

// Issues `layer` if the byte bound allows: leases staging (store source), takes device memory (a
// cached buffer of the same size, else a new one, freeing cached buffers of other sizes to make
// room) and submits the read, or for the host source enqueues the copy from the host copy at
// once. Returns false, holding nothing new, if it does not fit now. A synchronous refusal of the
// read is stored in the issue, to surface at the layer's acquire.
bool LayerPrefetcher::Impl::try_issue(std::size_t layer) {
  Slot& s = slots[layer];
  auto reuse = cache.find(s.bytes);
  const std::uint64_t new_device = reuse == cache.end() ? s.bytes : 0;
  while (held_bytes() + s.staging_bytes + new_device > options.max_bytes && !cache.empty()) {
    auto victim = cache.begin();
    if (victim == reuse) {
      if (std::next(victim) == cache.end()) break;
      victim = std::next(victim);
    }
    device_bytes -= victim->first;
    cache.erase(victim);
  }
  if (held_bytes() + s.staging_bytes + new_device > options.max_bytes) return false;
  swap::BufferLease lease;
  if (pool) {
    lease = pool->try_acquire(s.staging_bytes, std::chrono::nanoseconds(0));
    if (!lease) return false;
  }
  if (reuse != cache.end()) {
    s.buffer = std::move(reuse->second);
    cache.erase(reuse);
  } else {
    s.buffer = device.allocate(s.bytes);  // throws DeviceError; the lease goes back
    device_bytes += s.bytes;
  }
  auto issue = std::make_shared<Issue>();
  issue->generation = ++s.generation;
  issue->staging = std::move(lease);
  s.issue = issue;
  s.state = SlotState::kWindow;
  ++stats.layers_issued;
  stats.peak_held_bytes = std::max(stats.peak_held_bytes, held_bytes());
  if (!store) {
    // The host copy is the source: nothing to read, the copy goes straight from it.
    issue->source = host[layer];
    enqueue_copy(issue, layer);
    return true;
  }
  issue->source = issue->staging.span();
  read_busy.begin();  // before the submit: the completion may run inline
  try {
    issue->ticket = store->swap_in(
        s.key, issue->staging.span(),
        [this, issue, layer](const Status& st) { on_read_complete(issue, layer, st); });
  } catch (const Error&) {
    read_busy.end();
    issue->submit_error = std::current_exception();
    issue->staging.reset();
    issue->phase.store(Issue::kFailed, std::memory_order_release);
  }
  return true;
}

// Runs on an engine thread when a layer's read completes: on success enqueues the copy.
// Never takes mu (the caller may hold it while it waits on nothing of ours) and never throws.
void LayerPrefetcher::Impl::on_read_complete(const std::shared_ptr<Issue>& issue, std::size_t layer,
                                             const Status& status) {
  // Once the phase below is final, an acquirer may take the layer, release it and destroy the
  // prefetcher before this thread's last step: the wake-up goes through its own reference.
  const std::shared_ptr<Progress> wake = progress;
  read_busy.end();
  if (!status.ok()) {
    read_failures.fetch_add(1, std::memory_order_relaxed);
    issue->read_failure = status;
    issue->staging.reset();
    issue->phase.store(Issue::kFailed, std::memory_order_release);
    wake->notify();
    return;
  }
  bytes_read.fetch_add(issue->staging.size(), std::memory_order_relaxed);
  enqueue_copy(issue, layer);
}

// Enqueues the copy of issue->source to the device, a host function that returns the staging
// buffer (if any) and marks the copy done, and the copy event; then publishes the phase. Runs
// on an engine thread (store source) or the caller's, under mu (host source). Never takes mu
// and never throws: a failure to enqueue is the issue's device failure.
void LayerPrefetcher::Impl::enqueue_copy(const std::shared_ptr<Issue>& issue, std::size_t layer) {
  const std::shared_ptr<Progress> wake = progress;
  Slot& s = slots[layer];  // the vector never resizes; the slot keeps this issue until done
  try {
    if (copy_hook) {
      device.enqueue_host_work(copy_stream, [hook = copy_hook, layer] { hook(layer); });
    }
    device.copy_to_device(copy_stream, s.buffer.span(0, s.bytes), issue->source.first(s.bytes));
    bytes_to_device.fetch_add(s.bytes, std::memory_order_relaxed);
    // Before the record, so that a completed copy event implies the staging is back and the
    // generation is marked copied.
    device.enqueue_host_work(copy_stream, [issue, copied = s.copied_generation, p = progress] {
      issue->staging.reset();
      copied->store(issue->generation, std::memory_order_release);
      p->notify();
    });
    device.record(s.copy_event, copy_stream);
    issue->phase.store(Issue::kCopyEnqueued, std::memory_order_release);
  } catch (const std::exception& e) {
    issue->device_failure = true;
    issue->device_failure_text =
        std::string("copying layer ") + std::to_string(layer) + " to the device: " + e.what();
    issue->phase.store(Issue::kFailed, std::memory_order_release);
  } catch (...) {
    issue->device_failure = true;
    issue->device_failure_text =
        "copying layer " + std::to_string(layer) + " to the device: unknown exception";
    issue->phase.store(Issue::kFailed, std::memory_order_release);
  }
  wake->notify();
}

// Issues the predicted layers that fit: at most depth acquisitions ahead of the next one, while
// the window has fewer than depth + 1 layers and the bytes fit. Never blocks.
void LayerPrefetcher::Impl::fill_window() {
  if (tracing || order.empty() || options.depth == 0) return;
  poll(/*keep_predicted=*/true);
  const std::size_t n = std::min(options.depth, order.size());
  for (std::size_t k = 0; k < n; ++k) {
    const std::size_t layer = order[(position + k) % order.size()];
    if (slots[layer].state != SlotState::kIdle || slots[layer].suspended) continue;
    if (window_count() >= options.depth + 1) break;
    if (!try_issue(layer)) break;  // keep the order: no smaller later layer jumps the queue
  }
}

// Follows the prediction with this acquisition. Returns false, switching to tracing (on demand
// for the rest of the iteration), if the trainer deviated.
bool LayerPrefetcher::Impl::track_order(std::size_t layer) {
  current.push_back(layer);
  if (tracing) return true;
  if (order[position] != layer) {
    ++stats.retraces;
    tracing = true;
    log(LogLevel::kInfo, "layer prefetcher: acquired layer " + std::to_string(layer) +
                             " where layer " + std::to_string(order[position]) +
                             " was predicted; re-tracing");
    return false;
  }
  if (++position == order.size()) {  // the predicted iteration is complete
    position = 0;
    current.clear();
  }
  return true;
}

void LayerPrefetcher::Impl::wait_progress(std::uint64_t seen, std::unique_lock<std::mutex>& lock) {
  lock.unlock();
  progress->wait_past(seen, kRecheckInterval);
  lock.lock();
  check_failed();
}

// Blocks until `layer` (idle) is issued: waits for room in the window, recycling released
// layers as the compute stream passes them and evicting unacquired ones whose I/O is over.
void LayerPrefetcher::Impl::fetch_on_demand(std::size_t layer, std::unique_lock<std::mutex>& lock) {
  Slot& s = slots[layer];
  for (;;) {
    const std::uint64_t seen = progress->epoch();
    if (s.state != SlotState::kIdle) return;  // another caller's window issued it meanwhile
    poll(/*keep_predicted=*/false);
    bool has_released = false;
    bool has_window = false;
    for (const Slot& o : slots) {
      has_released = has_released || o.state == SlotState::kReleased;
      has_window = has_window || o.state == SlotState::kWindow;
    }
    // Layers the caller holds (acquired) do not count against the layer window.
    if (window_count() < options.depth + 1 || (!has_released && !has_window)) {
      if (try_issue(layer)) return;
    }
    if (has_released) {
      wait_progress(seen, lock);
      continue;
    }
    if (has_window) {
      if (!evict_one()) wait_progress(seen, lock);
      continue;
    }
    if (staging_in_use() > 0) {  // staging of acquired layers still copying
      wait_progress(seen, lock);
      continue;
    }
    std::uint64_t acquired = 0;
    for (const Slot& o : slots) {
      if (o.state == SlotState::kAcquired) acquired += o.bytes;
    }
    const std::string needs = pool ? std::to_string(s.staging_bytes) + " bytes of staging plus " +
                                         std::to_string(s.bytes) + " on the device"
                                   : std::to_string(s.bytes) + " bytes on the device";
    throw UsageError("layer prefetcher: cannot fetch layer " + std::to_string(layer) + " (" +
                     needs + "): acquired layers hold " + std::to_string(acquired) +
                     " of max_bytes " + std::to_string(options.max_bytes) + "; release some first");
  }
}

void LayerPrefetcher::Impl::wait_for_read(Slot& s, std::unique_lock<std::mutex>& lock) {
  for (;;) {
    const std::uint64_t seen = progress->epoch();
    if (s.issue->phase.load(std::memory_order_acquire) != Issue::kReading) return;
    // The caller is blocked here while the compute stream moves on: advance the window as
    // releases are passed, so that the next reads need not wait until this one is done.
    fill_window();
    wait_progress(seen, lock);
  }
}

// ---- public ----

LayerPrefetcher::LayerPrefetcher(PrefetcherOptions options, swap::SwapStore& store,
                                 cuda::Device& device, cuda::StreamRef compute_stream)
    : impl_(std::make_unique<Impl>(std::move(options), &store,
                                   std::vector<std::span<const std::byte>>{}, device,
                                   compute_stream)) {}

LayerPrefetcher::LayerPrefetcher(PrefetcherOptions options,
                                 std::vector<std::span<const std::byte>> host_layers,
                                 cuda::Device& device, cuda::StreamRef compute_stream)
    : impl_(std::make_unique<Impl>(std::move(options), nullptr, std::move(host_layers), device,
                                   compute_stream)) {}

LayerPrefetcher::~LayerPrefetcher() = default;

cuda::DeviceSpan LayerPrefetcher::acquire(std::size_t layer) {
  Impl& m = *impl_;
  std::unique_lock lock(m.mu);
  m.check_failed();
  Slot& s = m.slot_of(layer, "acquire");
  if (s.suspended) {
    throw UsageError("layer prefetcher: acquire of layer " + std::to_string(layer) +
                     ", which is suspended (resume it first)");
  }
  if (s.state == SlotState::kAcquired) {
    throw UsageError("layer prefetcher: layer " + std::to_string(layer) +
                     " acquired again before its release");
  }
  try {
    const auto entered = Clock::now();
    m.drop_stale(s, lock);  // a copy from before a rewrite is never handed out
    m.poll(/*keep_predicted=*/true, /*keep_layer=*/layer);  // a released copy of it is reused
    m.track_order(layer);
    ++m.stats.acquires;
    const bool issued = s.state != SlotState::kIdle;
    if (issued) {
      ++m.stats.hits;
    } else {
      ++m.stats.on_demand;
    }

    // Stall probe, part 1, before any blocking: when the compute stream gets here, note the
    // time and whether this layer's copy is already done (this issue's generation: the next
    // one if the layer is not issued yet).
    struct Probe {
      Clock::time_point reached{};
      bool late = false;
    };
    auto probe = std::make_shared<Probe>();
    const std::uint64_t generation = issued ? s.generation : s.generation + 1;
    m.device.enqueue_host_work(m.compute, [probe, copied = s.copied_generation, generation] {
      probe->reached = Clock::now();
      probe->late = copied->load(std::memory_order_acquire) < generation;
    });

    if (!issued) m.fetch_on_demand(layer, lock);
    if (s.state == SlotState::kAcquired) {
      throw UsageError("layer prefetcher: layer " + std::to_string(layer) +
                       " acquired concurrently by another caller");
    }
    const SlotState before = s.state;
    s.state = SlotState::kAcquired;  // ours now, also while we wait for its read
    if (before == SlotState::kWindow) m.wait_for_read(s, lock);
    const auto blocked = Clock::now() - entered;
    m.stats.acquire_blocked_time += std::chrono::duration_cast<std::chrono::nanoseconds>(blocked);

    if (s.issue && s.issue->phase.load(std::memory_order_acquire) == Issue::kFailed) {
      if (s.issue->device_failure) {
        m.fail_and_rethrow(std::make_exception_ptr(DeviceError(s.issue->device_failure_text)));
      }
      std::exception_ptr error = s.issue->submit_error
                                     ? s.issue->submit_error
                                     : std::make_exception_ptr(IoError(s.issue->read_failure));
      m.recycle(s);  // its staging is back; a later acquire reads it again
      m.fill_window();
      std::rethrow_exception(error);
    }
    m.device.wait(m.compute, s.copy_event);
    m.device.enqueue_host_work(m.compute, [probe, c = m.counters] {
      const auto stalled = Clock::now() - probe->reached;
      c->stall_ns.fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(stalled).count(),
                            std::memory_order_relaxed);
      if (probe->late) c->late.fetch_add(1, std::memory_order_relaxed);
    });
    m.fill_window();
    return s.buffer.span(0, s.bytes);
  } catch (const DeviceError&) {
    m.fail_and_rethrow(std::current_exception());
  }
}

void LayerPrefetcher::release(std::size_t layer) {
  Impl& m = *impl_;
  std::lock_guard lock(m.mu);
  m.check_failed();
  Slot& s = m.slot_of(layer, "release");
  if (s.state != SlotState::kAcquired) {
    throw UsageError("layer prefetcher: release of layer " + std::to_string(layer) +
                     ", which is not acquired");
  }
  try {
    m.device.record(s.release_event, m.compute);
    m.device.enqueue_host_work(m.compute, [p = m.progress] { p->notify(); });
    s.state = SlotState::kReleased;
    m.fill_window();
  } catch (const DeviceError&) {
    m.fail_and_rethrow(std::current_exception());
  }
}

void LayerPrefetcher::end_iteration() {
  Impl& m = *impl_;
  std::lock_guard lock(m.mu);
  m.check_failed();
  try {
    if (m.tracing) {
      if (!m.current.empty()) m.order = m.current;
      m.tracing = m.order.empty();
    } else if (m.position != 0) {
      // The iteration ended before the predicted order did: the trainer's order changed.
      ++m.stats.retraces;
      m.order = m.current;
      m.tracing = m.order.empty();
    }
    m.position = 0;
    m.current.clear();
    m.fill_window();
  } catch (const DeviceError&) {
    m.fail_and_rethrow(std::current_exception());
  }
}

void LayerPrefetcher::suspend(std::size_t layer) {
  Impl& m = *impl_;
  std::unique_lock lock(m.mu);
  m.check_failed();
  Slot& s = m.slot_of(layer, "suspend");
  if (s.state == SlotState::kAcquired) {
    throw UsageError("layer prefetcher: suspend of layer " + std::to_string(layer) +
                     ", which is acquired (release it first)");
  }
  if (s.suspended) {
    throw UsageError("layer prefetcher: suspend of layer " + std::to_string(layer) +
                     ", which is already suspended");
  }
  s.suspended = true;  // from here on nothing issues it
  try {
    // Drop every copy of the layer. First wait until nothing reads its source: the store must
    // see no swap_in of the key once this returns, and a host copy must not be rewritten while
    // a copy still reads it (the device would get torn parameters). A read still in flight is
    // waited for, never abandoned: its completion would otherwise copy old bytes into a buffer
    // already given to another layer. Then recycle the copy now if nothing uses it, else mark
    // it stale: it is never handed out again, and poll recycles it once the copy and the
    // compute stream are past it (no need to hold the caller until the stream gets there).
    for (;;) {
      const std::uint64_t seen = m.progress->epoch();
      if (s.state == SlotState::kIdle) break;
      if (s.issue && s.issue->phase.load(std::memory_order_acquire) == Issue::kFailed &&
          s.issue->device_failure) {
        m.fail_and_rethrow(std::make_exception_ptr(DeviceError(s.issue->device_failure_text)));
      }
      if (m.source_free(s)) {
        if (s.state == SlotState::kWindow) ++m.stats.evictions;
        if (m.issue_done(s) && m.release_done(s)) {
          m.recycle(s);
        } else {
          // Held like a released layer (its memory counts in the window) until recycled.
          s.state = SlotState::kReleased;
          s.stale = true;
        }
        break;
      }
      m.wait_progress(seen, lock);
    }
    m.fill_window();
  } catch (const DeviceError&) {
    m.fail_and_rethrow(std::current_exception());
  }
}

void LayerPrefetcher::resume(std::size_t layer) {
  Impl& m = *impl_;
  std::lock_guard lock(m.mu);
  m.check_failed();
  Slot& s = m.slot_of(layer, "resume");
  if (!s.suspended) {
    throw UsageError("layer prefetcher: resume of layer " + std::to_string(layer) +
                     ", which is not suspended");
  }
  s.suspended = false;
  try {
    m.fill_window();
  } catch (const DeviceError&) {
    m.fail_and_rethrow(std::current_exception());
  }
}

bool LayerPrefetcher::suspended(std::size_t layer) const {
  std::lock_guard lock(impl_->mu);
  return impl_->slot_of(layer, "suspended").suspended;
}

std::size_t LayerPrefetcher::layer_count() const noexcept { return impl_->slots.size(); }

std::uint64_t LayerPrefetcher::layer_bytes(std::size_t layer) const {
  return impl_->slot_of(layer, "layer_bytes").bytes;
}

std::vector<std::size_t> LayerPrefetcher::predicted_order() const {
  std::lock_guard lock(impl_->mu);
  return impl_->tracing ? std::vector<std::size_t>{} : impl_->order;
}

void LayerPrefetcher::wait_for_reads() { impl_->wait_for_reads(); }

PrefetcherStats LayerPrefetcher::stats() const {
  const Impl& m = *impl_;
  PrefetcherStats s;
  {
    std::lock_guard lock(m.mu);
    s = m.stats;
  }
  s.late_layers = m.counters->late.load(std::memory_order_relaxed);
  s.stall_time = std::chrono::nanoseconds(m.counters->stall_ns.load(std::memory_order_relaxed));
  s.bytes_read = m.bytes_read.load(std::memory_order_relaxed);
  s.bytes_to_device = m.bytes_to_device.load(std::memory_order_relaxed);
  s.read_failures = m.read_failures.load(std::memory_order_relaxed);
  s.read_busy_time = m.read_busy.now_total();
  return s;
}

void test_hooks::set_copy_hook(LayerPrefetcher& prefetcher,
                               std::function<void(std::size_t layer)> hook) {
  std::lock_guard lock(prefetcher.impl_->mu);
  prefetcher.impl_->copy_hook = std::move(hook);
}

}  // namespace zinf::prefetch
