// SPDX-License-Identifier: Apache-2.0
// HostDevice: streams as worker threads over an operation queue, events as generation counters,
// "device memory" as aligned host memory, copies as a copy engine makes them (dma_copy),
// optionally throttled by a shared CopyLane. A queue is the simulation's native stream: any
// host device may adopt it (adopt_stream), as any CUDA context user may a cudaStream_t.
#include "host_device.h"

#include <condition_variable>
#include <cstring>
#include <deque>
#include <new>
#include <stop_token>
#include <string>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <variant>

#include "dma_copy.h"
#include "zinf/cuda/testing.h"
#include "zinf/common/error.h"
#include "zinf/common/log.h"

namespace zinf::cuda::detail {
namespace {

// cudaMalloc returns 256-byte aligned memory; the simulation promises the same.
constexpr std::align_val_t kDeviceAlignment{256};

// An event is a pair of generation counters: record() takes the next generation on the host
// (so that wait() and synchronize() know which record they refer to), and the recording
// stream's worker completes it in stream order, carrying that stream's failure if any.
// Completion keeps the highest generation, so the latest record() wins as in CUDA.
class HostEvent final : public EventImpl, public std::enable_shared_from_this<HostEvent> {
 public:
  std::uint64_t next_generation() {
    std::lock_guard lock(mu_);
    return ++recorded_;
  }
  std::uint64_t recorded() const {
    std::lock_guard lock(mu_);
    return recorded_;
  }
  void complete(std::uint64_t generation, const Status& failure) {
    {
      std::lock_guard lock(mu_);
      if (generation > completed_) {
        completed_ = generation;
        failure_ = failure;
      }
    }
    cv_.notify_all();
  }
  /// Blocks until `generation` has completed; returns the failure it carries (ok if none).
  Status wait_for(std::uint64_t generation) const {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return completed_ >= generation; });
    return failure_;
  }
  /// True if the latest record has completed; then `*failure` is its failure (ok if none).
  bool query(Status* failure) const {
    std::lock_guard lock(mu_);
    if (completed_ < recorded_) return false;
    *failure = failure_;
    return true;
  }

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::uint64_t recorded_ = 0;   // generations handed out by record()
  std::uint64_t completed_ = 0;  // highest generation a worker has completed
  Status failure_;               // of generation completed_
};

// A copy carries the lane of the device that enqueued it: an adopted queue runs copies of
// several devices, each throttled by its own device's link.
struct CopyOp {
  std::byte* dst;
  const std::byte* src;
  std::size_t n;
  CopyLane* lane;
};
struct RecordOp {
  std::shared_ptr<HostEvent> event;
  std::uint64_t generation;
};
struct WaitOp {
  std::shared_ptr<HostEvent> event;
  std::uint64_t generation;
};
struct WorkOp {
  std::function<void()> work;
};
struct BusyOp {
  std::chrono::nanoseconds duration;
};
using Op = std::variant<CopyOp, RecordOp, WaitOp, WorkOp, BusyOp>;

// One native host stream: the operation queue and its worker. Shared by the Stream that made
// it (its owner, which stops it) and by the streams that adopted it.
class HostQueue {
 public:
  HostQueue(std::uint64_t queue_id, std::string backend)
      : id(queue_id),
        backend_(std::move(backend)),
        worker_([this](std::stop_token stop) { run(stop); }) {}
  HostQueue(const HostQueue&) = delete;
  HostQueue& operator=(const HostQueue&) = delete;

  /// Throws UsageError once the owner has stopped the queue (an adoption outliving it).
  void enqueue(Op op) {
    {
      std::lock_guard lock(mu_);
      if (stopped_) {
        throw UsageError("host stream " + std::to_string(id) +
                         " was destroyed by its owner while still adopted");
      }
      queue_.push_back(std::move(op));
      ++enqueued_;
    }
    cv_.notify_all();
  }

  /// Waits for everything enqueued so far, throwing nothing (an adoption ending): the failure,
  /// if any, stays for the owner's synchronize() to report.
  void wait_quietly() noexcept {
    std::unique_lock lock(mu_);
    const std::uint64_t target = enqueued_;
    cv_.wait(lock, [&] { return completed_ >= target; });
    if (!failure_.ok()) {
      try {
        log(LogLevel::kDebug, "adoption of host stream " + std::to_string(id) +
                                  " ended on a failed stream: " + failure_.to_string());
      } catch (...) {
        // Logging is best effort here.
      }
    }
  }

  void synchronize() {
    std::unique_lock lock(mu_);
    const std::uint64_t target = enqueued_;
    cv_.wait(lock, [&] { return completed_ >= target; });
    if (!failure_.ok()) {
      failure_reported_ = true;
      throw DeviceError(failure_.to_string());
    }
  }

  const std::uint64_t id;

  /// Lets the worker finish everything queued, then joins it; later enqueues throw.
  void drain_and_stop() noexcept {
    {
      std::lock_guard lock(mu_);
      stopped_ = true;
    }
    worker_.request_stop();
    if (worker_.joinable()) worker_.join();
    std::lock_guard lock(mu_);
    if (!failure_.ok() && !failure_reported_) {
      log(LogLevel::kWarning,
          "stream " + std::to_string(id) +
              " destroyed after a failure no synchronize() reported: " + failure_.to_string());
    }
  }

 private:
  // The worker: take the next operation, run it without the lock, record a failure (the first
  // one sticks), count it complete and wake synchronize() and the next enqueue's waiters. It
  // exits only when a stop was requested and the queue is empty, so destruction drains.
  void run(std::stop_token stop) {
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, stop, [&] { return !queue_.empty(); });
      if (queue_.empty()) return;
      Op op = std::move(queue_.front());
      queue_.pop_front();
      Status failed_before = failure_;
      lock.unlock();
      Status result = execute(op, failed_before);
      op = Op{};  // drop captured state (host work closures) before taking the lock
      lock.lock();
      if (!result.ok() && failure_.ok()) failure_ = std::move(result);
      ++completed_;
      cv_.notify_all();
    }
  }

  // Runs one operation. After a failure the stream only completes events (with the failure)
  // and skips everything else, so nothing runs on top of bad data.
  Status execute(Op& op, const Status& failed_before) noexcept {
    const bool failed = !failed_before.ok();
    try {
      return std::visit(
          [&](auto& o) -> Status {
            using T = std::decay_t<decltype(o)>;
            if constexpr (std::is_same_v<T, CopyOp>) {
              if (failed) return Status::ok_status();
              copy(o);
              return Status::ok_status();
            } else if constexpr (std::is_same_v<T, RecordOp>) {
              o.event->complete(o.generation, failed_before);
              return Status::ok_status();
            } else if constexpr (std::is_same_v<T, WaitOp>) {
              if (failed) return Status::ok_status();
              return o.event->wait_for(o.generation);
            } else if constexpr (std::is_same_v<T, BusyOp>) {
              // Sleeping, not spinning: a kernel leaves the host's CPUs to the host.
              if (!failed) std::this_thread::sleep_for(o.duration);
              return Status::ok_status();
            } else {
              if (failed) return Status::ok_status();
              return run_work(o.work);
            }
          },
          op);
    } catch (const std::exception& e) {
      return host_work_failure(std::string("internal error: ") + e.what());
    }
  }

  void copy(const CopyOp& op) {
    CopyLane& lane = *op.lane;
    if (!lane.capped()) {
      dma_copy(op.dst, op.src, op.n);
      return;
    }
    // The copy itself runs at memory speed; sleeping to the end of the lane's slot makes it
    // take n / bandwidth, as over PCIe.
    auto done = lane.reserve(op.n);
    dma_copy(op.dst, op.src, op.n);
    std::this_thread::sleep_until(done);
  }

  Status run_work(const std::function<void()>& work) {
    try {
      work();
      return Status::ok_status();
    } catch (const std::exception& e) {
      return host_work_failure(e.what());
    } catch (...) {
      return host_work_failure("unknown exception");
    }
  }

  Status host_work_failure(std::string what) const {
    return Status::error(ErrorCode::kIo, std::move(what))
        .with_operation("host work on stream " + std::to_string(id))
        .with_backend(backend_);
  }

  const std::string backend_;
  std::mutex mu_;
  std::condition_variable_any cv_;
  std::deque<Op> queue_;
  std::uint64_t enqueued_ = 0;
  std::uint64_t completed_ = 0;
  Status failure_;  // first failure; sticks
  bool failure_reported_ = false;
  bool stopped_ = false;
  std::jthread worker_;  // last: starts once the state above exists
};

// A stream of one HostDevice over a queue: the queue's owner, or an adoption of it.
struct HostStream final : StreamImpl {
  HostStream(std::uint64_t stream_id, bool is_adopted, std::shared_ptr<HostQueue> q)
      : StreamImpl(stream_id, is_adopted), queue(std::move(q)) {}
  const std::shared_ptr<HostQueue> queue;
};

HostQueue& queue_of(StreamImpl& stream) { return *static_cast<HostStream&>(stream).queue; }

// The live queues by native handle, so that adopt_stream checks a handle without touching what
// it points to. Never destroyed: streams may still die during static destruction.
struct QueueRegistry {
  std::mutex mu;
  std::unordered_map<const void*, std::weak_ptr<HostQueue>> live;
};
QueueRegistry& registry() {
  static auto* r = new QueueRegistry;
  return *r;
}

}  // namespace

std::chrono::steady_clock::time_point CopyLane::reserve(std::size_t bytes) {
  auto now = std::chrono::steady_clock::now();
  auto length = std::chrono::ceil<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(static_cast<double>(bytes) / bytes_per_second_));
  std::lock_guard lock(mu_);
  auto start = free_at_ > now ? free_at_ : now;
  free_at_ = start + length;
  return free_at_;
}

HostDevice::HostDevice(const DeviceOptions& options)
    : DeviceBase(options.host_memory_bytes, /*enforce_capacity=*/true),
      to_device_(options.host_copy_bandwidth_gbps * 1e9),
      to_host_(options.host_copy_bandwidth_gbps * 1e9) {}

HostDevice::~HostDevice() { check_no_live_owners(); }

std::byte* HostDevice::do_allocate(std::size_t bytes) {
  void* p = ::operator new(bytes, kDeviceAlignment, std::nothrow);
  if (p == nullptr) {
    throw DeviceError(
        usage_text("allocate", "out of host memory for " + std::to_string(bytes) + " bytes"));
  }
  // GPU memory is resident once cudaMalloc returns. Fresh host pages are not: the first copy
  // into them takes the page faults, which on the build VM made a 4 MiB copy into a new buffer
  // take 30-80 ms instead of 0.3-0.5 ms, so the simulation would charge its own faults to the
  // first copies. Touch the pages here, inside allocate(), which blocks anyway.
  std::memset(p, 0, bytes);
  {
    std::lock_guard lock(allocations_mu_);
    allocations_.emplace(reinterpret_cast<std::uintptr_t>(p), bytes);
  }
  return static_cast<std::byte*>(p);
}

void HostDevice::do_free(std::byte* data, std::size_t /*bytes*/) noexcept {
  {
    std::lock_guard lock(allocations_mu_);
    allocations_.erase(reinterpret_cast<std::uintptr_t>(data));
  }
  ::operator delete(data, kDeviceAlignment);
}

bool HostDevice::owns(const void* data, std::size_t bytes) const {
  const auto start = reinterpret_cast<std::uintptr_t>(data);
  std::lock_guard lock(allocations_mu_);
  auto it = allocations_.upper_bound(start);
  if (it == allocations_.begin()) return false;
  --it;
  return start - it->first <= it->second && bytes <= it->second - (start - it->first);
}

std::shared_ptr<StreamImpl> HostDevice::do_create_stream(std::uint64_t id) {
  auto queue = std::make_shared<HostQueue>(id, std::string(name()));
  auto stream = std::make_shared<HostStream>(id, /*is_adopted=*/false, queue);
  QueueRegistry& r = registry();
  std::lock_guard lock(r.mu);
  r.live.emplace(queue.get(), queue);
  return stream;
}

std::shared_ptr<StreamImpl> HostDevice::do_adopt_stream(std::uint64_t id, void* native) {
  std::shared_ptr<HostQueue> queue;
  {
    QueueRegistry& r = registry();
    std::lock_guard lock(r.mu);
    auto it = r.live.find(native);
    if (it != r.live.end()) queue = it->second.lock();
  }
  if (queue == nullptr) {
    throw UsageError(usage_text("adopt_stream",
                                "native stream " + hex_address(native) +
                                    " is not a live host stream (give native_stream() of a Stream "
                                    "of a host device)"));
  }
  return std::make_shared<HostStream>(id, /*is_adopted=*/true, std::move(queue));
}

void HostDevice::do_destroy_stream(StreamImpl& stream) noexcept {
  HostQueue& queue = queue_of(stream);
  if (stream.adopted) {
    queue.wait_quietly();
    return;
  }
  {
    QueueRegistry& r = registry();
    std::lock_guard lock(r.mu);
    r.live.erase(&queue);
  }
  queue.drain_and_stop();
}

void* HostDevice::do_native_handle(StreamImpl& stream) const noexcept { return &queue_of(stream); }

std::shared_ptr<EventImpl> HostDevice::do_create_event() { return std::make_shared<HostEvent>(); }

// Host memory is always "pinned" for the simulation; DeviceBase keeps the bookkeeping.
void HostDevice::do_register_host(std::span<std::byte> /*host*/) {}
Status HostDevice::do_unregister_host(std::span<std::byte> /*host*/) noexcept {
  return Status::ok_status();
}

void HostDevice::do_copy(StreamImpl& stream, std::byte* dst, const std::byte* src, std::size_t n,
                         CopyDirection direction) {
  queue_of(stream).enqueue(CopyOp{dst, src, n, &lane(direction)});
}

void HostDevice::do_record(EventImpl& event, StreamImpl& stream) {
  auto& e = static_cast<HostEvent&>(event);
  queue_of(stream).enqueue(RecordOp{e.shared_from_this(), e.next_generation()});
}

void HostDevice::do_wait(StreamImpl& stream, EventImpl& event) {
  auto& e = static_cast<HostEvent&>(event);
  const std::uint64_t generation = e.recorded();
  if (generation == 0) return;  // never recorded: nothing to wait for (as cudaStreamWaitEvent)
  queue_of(stream).enqueue(WaitOp{e.shared_from_this(), generation});
}

void HostDevice::do_host_work(StreamImpl& stream, std::function<void()> work) {
  queue_of(stream).enqueue(WorkOp{std::move(work)});
}

void HostDevice::do_busy(StreamImpl& stream, std::chrono::nanoseconds duration) {
  queue_of(stream).enqueue(BusyOp{duration});
}

void HostDevice::do_synchronize(StreamImpl& stream) { queue_of(stream).synchronize(); }

bool HostDevice::query_event(const EventImpl& event) {
  Status failure;
  if (!static_cast<const HostEvent&>(event).query(&failure)) return false;
  if (!failure.ok()) throw DeviceError(failure.to_string());
  return true;
}

void HostDevice::synchronize_event(const EventImpl& event) {
  const auto& e = static_cast<const HostEvent&>(event);
  Status failure = e.wait_for(e.recorded());
  if (!failure.ok()) throw DeviceError(failure.to_string());
}

std::unique_ptr<Device> make_host_device(const DeviceOptions& options) {
  return std::make_unique<HostDevice>(options);
}

}  // namespace zinf::cuda::detail

namespace zinf::cuda::test_hooks {

bool host_device_owns(const Device& device, const void* data, std::size_t bytes) {
  // kHost is made only by make_host_device, so the device is a HostDevice.
  if (device.kind() != DeviceKind::kHost) {
    throw UsageError("host_device_owns: " + std::string(device.name()) +
                     " is not the host simulation");
  }
  return static_cast<const detail::HostDevice&>(device).owns(data, bytes);
}

}  // namespace zinf::cuda::test_hooks
