// SPDX-License-Identifier: Apache-2.0
// ActivationStore: each saved tensor is an Entry that moves through copy-out (device ->
// pinned, on the store's copy stream), for kNvme a write-back of its staging buffer and, in
// backward, a read back into staging (ahead, in reverse save order, or on demand), then the
// copy-in (pinned -> device) after which it drains: its memory is freed once the copy-in and
// any I/O on it are over. Callbacks (a host function of the copy stream, I/O completions)
// update entries under `mu` and hold raw pointers only: an entry is destroyed only after every
// callback that may touch it has finished (the flags below), so no callback ever owns memory of
// the pool or the store.
#include "zinf/offload/activation_store.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <utility>

#include "zinf/common/align.h"
#include "zinf/common/error.h"
#include "zinf/common/status.h"
#include "zinf/common/log.h"
#include "zinf/swap/buffer_pool.h"
#include "zinf/swap/swap_store.h"

namespace zinf::offload {
namespace {

constexpr std::uint64_t kAlign = 4096;

struct Entry {
  std::string name;
  std::string key;  // kNvme: the swap store's key, "<name>#<handle>"
  std::uint64_t bytes = 0;
  std::uint64_t padded = 0;  // the staging lease and the stored size
  swap::BufferLease lease;   // kCpu: the tensor; kNvme: staging while out or back in
  cuda::Event copied_out;    // the device -> pinned copy is done
  cuda::Event copied_in;     // load's pinned -> device copy is done
  // kNvme, all guarded by Impl::mu:
  bool write_started = false;  // the copy stream's host function submitted the write-back
  bool write_done = false;     // its callback has finished with this entry
  bool stored = false;         // the bytes are on the drive (write succeeded)
  bool read_started = false;
  bool read_done = false;  // the read's callback has finished with this entry
  swap::IoTicket write;
  swap::IoTicket read;
  std::optional<Status> failure;  // the first failed write or read
  bool loaded = false;            // load() has enqueued the copy-in
};

}  // namespace

struct ActivationStore::Impl {
  Impl(cuda::Device& d, ActivationStoreOptions o) : device(d), options(std::move(o)) {}

  cuda::Device& device;
  ActivationStoreOptions options;
  // Declared so that teardown (reverse order) ends the copy stream's users first: entries
  // (cleared by the destructor), the store, its engine, then the registration and the pool.
  std::unique_ptr<swap::BufferPool> pool;
  cuda::PinnedRegistration pinned;
  std::unique_ptr<swap::IoEngine> engine;
  std::unique_ptr<swap::SwapStore> store;
  cuda::Stream copy_stream;
  cuda::Event joined;  // recorded on the trainer's stream for the copy stream to wait on

  mutable std::mutex mu;
  std::condition_variable cv;
  std::map<Handle, std::unique_ptr<Entry>> held;  // saved, not loaded (guarded by mu)
  std::list<std::unique_ptr<Entry>> draining;     // loaded, memory not yet freed (mu)
  Handle next = 1;
  ActivationStats counters;  // guarded by mu

  bool nvme() const noexcept { return options.tier == ActivationTier::kNvme; }
  Entry& find(Handle h, const char* op);
  void on_copied_out(Entry& e);
  // Starts reading e back into staging (mu held by `lock`, released while submitting: the
  // store may run the callback, which takes mu, on this thread). With `wait`, blocks until
  // staging has room; without, gives up if it has none now.
  void issue_read(Entry& e, std::unique_lock<std::mutex>& lock, bool wait);
  void read_ahead(Handle below, std::unique_lock<std::mutex>& lock);
  bool can_free(const Entry& e) const;    // mu held
  void reap(std::unique_lock<std::mutex>& lock);
  void wait_idle(Entry& e, std::unique_lock<std::mutex>& lock);
  // Staging of `bytes` for tensor `name`, on the trainer's thread (mu held by `lock`). Waits
  // only while something in flight will free staging without this thread (a write-back, whose
  // callback frees it; a loaded tensor's copy-in, freed here by reap once done); when the rest
  // is held by tensors read ahead or saved and not yet loaded, nothing ever would: a
  // UsageError naming the figures instead of waiting for ever.
  swap::BufferLease staging(std::uint64_t bytes, const std::string& name,
                            std::unique_lock<std::mutex>& lock);
};


Entry& ActivationStore::Impl::find(Handle h, const char* op) {
  auto it = held.find(h);
  if (it == held.end()) {
    throw UsageError(std::string("ActivationStore::") + op + ": no tensor with handle " +
                     std::to_string(h) + " (never saved, loaded already, or cleared)");
  }
  return *it->second;
}

// On the copy stream's worker, once the tensor is in staging: hand it to the swap store.
void ActivationStore::Impl::on_copied_out(Entry& e) {
  std::unique_lock lock(mu);
  if (e.loaded) {
    // Loaded straight from staging before the write-back started: no need to write it.
    e.write_done = true;
    cv.notify_all();
    return;
  }
  e.write_started = true;
  lock.unlock();
  swap::IoTicket t;
  std::optional<Status> refused;
  try {
    t = store->swap_out(e.key, e.lease.span().first(e.padded), [this, &e](const Status& st) {
      std::lock_guard g(mu);
      if (st.ok()) {
        e.stored = true;
        counters.bytes_written += e.padded;
      } else if (!e.failure) {
        e.failure = st;  // reported at the tensor's load
      }
      // Unless a load is copying from it, staging is free for other tensors now.
      if (!e.loaded) e.lease = swap::BufferLease();
      e.write_done = true;
      cv.notify_all();
    });
  } catch (...) {
    refused = status_from_current_exception();
  }
  lock.lock();
  e.write = std::move(t);
  if (refused) {
    if (!e.failure) e.failure = *refused;
    e.write_done = true;
    cv.notify_all();
  }
}

swap::BufferLease ActivationStore::Impl::staging(std::uint64_t bytes, const std::string& name,
                                                 std::unique_lock<std::mutex>& lock) {
  for (;;) {
    if (swap::BufferLease lease = pool->try_acquire(bytes)) return lease;
    reap(lock);
    if (swap::BufferLease lease = pool->try_acquire(bytes)) return lease;
    bool will_free = false;
    std::uint64_t stuck_bytes = 0;
    std::size_t stuck = 0;
    for (const auto& [h, e] : held) {
      if (!e->lease) continue;
      if (!e->loaded && !e->write_done) {
        will_free = true;  // staged: its write-back's callback gives the lease back
      } else {
        ++stuck;  // read ahead: held until its load
        stuck_bytes += e->padded;
      }
    }
    for (const auto& e : draining) will_free = will_free || static_cast<bool>(e->lease);
    if (!will_free) {
      throw UsageError(
          "ActivationStore: tensor '" + name + "' needs " + std::to_string(bytes) +
          " bytes of pinned staging, but the budget of " + std::to_string(pool->budget_bytes()) +
          " bytes is held by " + std::to_string(stuck) + " tensors read back ahead of their load (" +
          std::to_string(stuck_bytes) + " bytes), which only their loads free; raise "
          "pinned_budget_bytes to at least " + std::to_string(2 * bytes) +
          " (twice the largest tensor) plus the read-ahead, or load in the reverse order of the "
          "saves");
    }
    // Write-backs notify mu's condition variable; a copy-in completes on the device, which
    // does not: look again within a millisecond either way.
    cv.wait_for(lock, std::chrono::milliseconds(1));
  }
}

void ActivationStore::Impl::issue_read(Entry& e, std::unique_lock<std::mutex>& lock, bool wait) {
  if (e.read_started || e.lease || !e.stored) return;
  swap::BufferLease lease = pool->try_acquire(e.padded);
  if (!lease) {
    if (!wait) return;
    lease = staging(e.padded, e.name, lock);
  }
  e.lease = std::move(lease);
  e.read_started = true;
  // Only this (the trainer's) thread destroys entries or changes `held`: e stays valid.
  lock.unlock();
  swap::IoTicket t;
  std::optional<Status> refused;
  try {
    t = store->swap_in(e.key, e.lease.span().first(e.padded), [this, &e](const Status& st) {
      std::lock_guard g(mu);
      if (st.ok()) {
        counters.bytes_read += e.padded;
      } else if (!e.failure) {
        e.failure = st;
      }
      e.read_done = true;
      cv.notify_all();
    });
  } catch (...) {
    refused = status_from_current_exception();
  }
  lock.lock();
  e.read = std::move(t);
  if (refused) {
    if (!e.failure) e.failure = *refused;
    e.read_done = true;
  }
}

// Reads ahead the `prefetch_depth` tensors saved just before `below` (mu held by `lock`).
void ActivationStore::Impl::read_ahead(Handle below, std::unique_lock<std::mutex>& lock) {
  std::size_t issued = 0;
  for (auto it = held.lower_bound(below); it != held.begin() && issued < options.prefetch_depth;) {
    --it;
    Entry& e = *it->second;
    ++issued;
    if (e.read_started || e.lease) continue;  // in flight, read, or still in staging
    if (!e.stored) continue;                  // its write-back is not over: staging has it
    issue_read(e, lock, /*wait=*/false);
    if (!e.read_started) return;  // staging is full: keep the order, try again next load
  }
}

// Whether a loaded entry's memory may go: its copy-in done and no callback left to touch it.
bool ActivationStore::Impl::can_free(const Entry& e) const {
  if (nvme()) {
    if (e.write_started && !e.write_done) return false;
    if (e.read_started && !e.read_done) return false;
    if (!e.write_started && !e.write_done) return false;  // the host function has not run
  }
  return e.copied_in.query();  // throws DeviceError if the copy failed
}

// Frees the loaded entries that are done (mu held; released while freeing store keys).
void ActivationStore::Impl::reap(std::unique_lock<std::mutex>& lock) {
  for (auto it = draining.begin(); it != draining.end();) {
    if (!can_free(**it)) {
      ++it;
      continue;
    }
    std::unique_ptr<Entry> e = std::move(*it);
    it = draining.erase(it);
    if (nvme()) store->release(e->key);
  }
  (void)lock;
}

// Blocks until every callback that may touch e has finished (mu held via lock).
void ActivationStore::Impl::wait_idle(Entry& e, std::unique_lock<std::mutex>& lock) {
  if (!nvme()) return;
  cv.wait(lock, [&] {
    return (!e.write_started || e.write_done) && (!e.read_started || e.read_done);
  });
}

ActivationStore::ActivationStore(cuda::Device& device, ActivationStoreOptions options)
    : impl_(std::make_unique<Impl>(device, std::move(options))) {
  Impl& s = *impl_;
  const ActivationStoreOptions& o = s.options;
  if (o.pinned_budget_bytes == 0) throw UsageError("ActivationStore: pinned_budget_bytes is 0");
  std::uint32_t alignment = kAlign;
  if (s.nvme()) {
    if (o.directories.empty()) {
      throw UsageError("ActivationStore: the nvme tier needs at least one directory");
    }
    if (o.capacity_bytes == 0) {
      throw UsageError("ActivationStore: the nvme tier needs capacity_bytes (the most bytes of "
                       "activations held on NVMe at once)");
    }
    s.engine = swap::make_io_engine(o.io);
    swap::SwapStoreOptions so;
    so.directories = o.directories;
    so.capacity_bytes = o.capacity_bytes;
    so.checksums = o.checksums;
    s.store = std::make_unique<swap::SwapStore>(so, *s.engine);
    alignment = std::max(alignment, s.store->alignment());
  }
  swap::BufferPoolOptions po;
  po.budget_bytes = o.pinned_budget_bytes;
  po.alignment = alignment;
  po.huge_pages = true;
  s.pool = std::make_unique<swap::BufferPool>(po);
  s.pinned = device.register_host(s.pool->arena());
  s.copy_stream = device.create_stream();
  s.joined = device.create_event();
}

ActivationStore::~ActivationStore() {
  try {
    clear();
  } catch (const std::exception& e) {
    log(LogLevel::kWarning, std::string("ActivationStore: ") + e.what());
  }
}

ActivationStore::Handle ActivationStore::save(const std::string& name, cuda::DeviceSpan src,
                                              cuda::StreamRef stream) {
  Impl& s = *impl_;
  if (name.empty()) throw UsageError("ActivationStore::save: the tensor needs a name");
  if (src.size() == 0) throw UsageError("ActivationStore::save: tensor '" + name + "' is empty");
  std::unique_lock lock(s.mu);
  s.reap(lock);
  auto e = std::make_unique<Entry>();
  e->name = name;
  e->bytes = src.size();
  e->padded = align_up(e->bytes, std::uint64_t{s.pool->alignment()});
  const std::uint64_t budget = s.pool->budget_bytes();
  if (e->padded > budget) {
    throw UsageError("ActivationStore::save: tensor '" + name + "' of " +
                     std::to_string(e->bytes) + " bytes does not fit the pinned budget of " +
                     std::to_string(budget) + " bytes");
  }
  e->lease = s.pool->try_acquire(e->padded);
  if (!e->lease) {
    if (!s.nvme()) {
      throw UsageError("ActivationStore::save: tensor '" + name + "' of " +
                       std::to_string(e->bytes) + " bytes does not fit: " +
                       std::to_string(s.held.size()) + " tensors held fill " +
                       std::to_string(s.pool->bytes_in_use()) + " of the pinned budget's " +
                       std::to_string(budget) +
                       " bytes; raise pinned_budget_bytes or use the nvme tier");
    }
    // Staging frees as write-backs and copy-ins finish.
    e->lease = s.staging(e->padded, name, lock);
  }
  const Handle h = s.next;
  if (s.nvme()) {
    e->key = name + "#" + std::to_string(h);
    s.store->allocate(e->key, e->padded);  // IoError kNoSpace naming the key when full
  }
  try {
    e->copied_out = s.device.create_event();
    e->copied_in = s.device.create_event();
    s.device.record(s.joined, stream);
    s.device.wait(s.copy_stream, s.joined);
    s.device.copy_to_host(s.copy_stream, e->lease.span().first(e->bytes), src);
    s.device.record(e->copied_out, s.copy_stream);
    if (s.nvme()) {
      Entry* raw = e.get();
      s.device.enqueue_host_work(s.copy_stream, [&s, raw] { s.on_copied_out(*raw); });
    }
  } catch (...) {
    // Only calls before the host function can throw (a misused stream or span): nothing of
    // this entry is in flight but possibly the copy, which the stream orders before any
    // later use of the lease; wait for it before the lease goes back.
    s.device.synchronize(s.copy_stream);
    if (s.nvme()) s.store->release(e->key);
    throw;
  }
  ++s.next;
  ++s.counters.saved;
  s.counters.bytes_saved += e->bytes;
  s.counters.pinned_bytes_peak = s.pool->peak_bytes_in_use();
  s.held.emplace(h, std::move(e));
  return h;
}

void ActivationStore::wait_saved(Handle handle, cuda::StreamRef stream) {
  Impl& s = *impl_;
  std::lock_guard lock(s.mu);
  s.device.wait(stream, s.find(handle, "wait_saved").copied_out);
}

void ActivationStore::load(Handle handle, cuda::DeviceSpan dst, cuda::StreamRef stream) {
  Impl& s = *impl_;
  std::unique_lock lock(s.mu);
  Entry& e = s.find(handle, "load");
  if (dst.size() != e.bytes) {
    throw UsageError("ActivationStore::load: tensor '" + e.name + "' has " +
                     std::to_string(e.bytes) + " bytes, the destination " +
                     std::to_string(dst.size()));
  }
  if (s.nvme()) {
    e.loaded = true;  // from now on the write-back keeps the staging lease (or is skipped)
    if (!e.lease) {
      ++s.counters.on_demand;
      s.issue_read(e, lock, /*wait=*/true);
    } else {
      ++s.counters.hits;
    }
    // Wait for what the copy-in reads from: the read back, or (still in staging) nothing
    // more than the copy stream's order.
    s.cv.wait(lock, [&] { return !e.read_started || e.read_done; });
    if (e.failure) {
      // The tensor is lost: forget it once nothing touches it, and report.
      const Status failure = *e.failure;
      s.wait_idle(e, lock);
      auto it = s.held.find(handle);
      std::unique_ptr<Entry> gone = std::move(it->second);
      s.held.erase(it);
      s.store->release(gone->key);
      throw IoError(Status(failure).with_operation("ActivationStore::load of tensor '" +
                                                    gone->name + "': " + failure.operation()));
    }
  }
  s.device.record(s.joined, stream);
  s.device.wait(s.copy_stream, s.joined);
  s.device.copy_to_device(s.copy_stream, dst, e.lease.span().first(e.bytes));
  s.device.record(e.copied_in, s.copy_stream);
  s.device.wait(stream, e.copied_in);
  ++s.counters.loaded;
  auto it = s.held.find(handle);
  s.draining.push_back(std::move(it->second));
  s.held.erase(it);
  s.reap(lock);  // first, so that staging freed by earlier loads serves the reads ahead
  if (s.nvme()) s.read_ahead(handle, lock);
  s.counters.pinned_bytes_peak = s.pool->peak_bytes_in_use();
}

void ActivationStore::clear() {
  Impl& s = *impl_;
  // Every copy and host function has run (or, on a failed stream, will never run); the I/O
  // they started is waited for below before any entry goes, also when the stream failed.
  std::exception_ptr device_failure;
  try {
    s.device.synchronize(s.copy_stream);
  } catch (...) {
    device_failure = std::current_exception();
  }
  std::unique_lock lock(s.mu);
  for (auto& [h, e] : s.held) {
    e->loaded = true;
    s.wait_idle(*e, lock);
    if (s.nvme()) s.store->release(e->key);
  }
  s.held.clear();
  for (auto& e : s.draining) {
    s.wait_idle(*e, lock);
    if (s.nvme()) s.store->release(e->key);
  }
  s.draining.clear();
  if (device_failure) std::rethrow_exception(device_failure);
}

ActivationStats ActivationStore::stats() const {
  const Impl& s = *impl_;
  std::lock_guard lock(s.mu);
  ActivationStats out = s.counters;
  out.held_tensors = s.held.size();
  for (const auto& [h, e] : s.held) out.held_bytes += e->bytes;
  out.pinned_bytes_peak = s.pool->peak_bytes_in_use();
  return out;
}

ActivationTier ActivationStore::tier() const noexcept { return impl_->options.tier; }

}  // namespace zinf::offload
