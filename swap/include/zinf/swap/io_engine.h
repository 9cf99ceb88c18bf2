// SPDX-License-Identifier: Apache-2.0
// IoEngine: the one interface for asynchronous positional reads and writes between host
// buffers and files, with backends for io_uring, a portable thread pool, and fault injection.
// Part of zinf::swap; made only through make_io_engine().
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "zinf/common/status.h"

namespace zinf::swap {

class File;
struct FaultPlan;
namespace detail {
struct TicketState;
}

/// Which backend make_io_engine builds.
enum class IoEngineKind {
  kAuto,     ///< io_uring if it starts, else threads with one notice saying why
  kUring,    ///< io_uring or an error
  kThreads,  ///< pread/pwrite thread pool
};

/// Parses "auto" | "uring" | "threads"; throws zinf::UsageError otherwise.
IoEngineKind parse_io_engine_kind(std::string_view text);
std::string_view io_engine_kind_name(IoEngineKind kind) noexcept;

struct IoOptions {
  IoEngineKind kind = IoEngineKind::kAuto;
  /// Requests larger than this are split into pieces of this size (a multiple of 4096).
  /// Why 1 MiB: docs/benchmarks.md, "Figures behind the defaults".
  std::uint32_t block_size = 1u << 20;
  /// Pieces kept in flight per engine (io_uring SQ depth; threads: in-flight bound).
  std::uint32_t queue_depth = 16;
  /// Worker threads for the threads backend (0: queue_depth; never more than queue_depth or
  /// 32). uring ignores it.
  std::uint32_t threads = 0;
  /// EAGAIN retries per piece before the request fails with kTimedOut.
  std::uint32_t max_eagain_retries = 64;
  /// Tests and `zinf stress` only: faults applied to raw piece results inside the backend, so
  /// that the backend's own retry and resubmission code is what handles them.
  std::shared_ptr<FaultPlan> faults;
};

/// Identifies a file attached to an engine.
struct FileId {
  std::uint32_t index = ~0u;
  bool valid() const noexcept { return index != ~0u; }
  friend bool operator==(FileId, FileId) = default;
};

enum class IoOp : std::uint8_t { kRead, kWrite };

/// One transfer. For a file with O_DIRECT, `buffer.data()`, `offset` and `buffer.size()` must be
/// multiples of File::alignment() (UsageError at submit otherwise). The buffer must stay valid,
/// and untouched by the caller for writes' sake, until the request's ticket completes.
struct IoRequest {
  IoOp op = IoOp::kRead;
  FileId file;
  std::uint64_t offset = 0;
  std::span<std::byte> buffer;
};

/// Called once, on an engine thread, when a batch completes, with the batch's Status: must not
/// block or throw (an exception is caught and logged). It runs after completed_at() is set and
/// before waiters are released, so wait() returning means the callback has returned. It may
/// submit more work. An empty batch completes (and calls back) on the submitting thread.
using IoCallback = std::function<void(const Status&)>;

/// A handle on one submitted batch. Copyable (shared); all members thread-safe.
/// Completion is exactly once; a batch succeeds only if every byte of every request moved.
class IoTicket {
 public:
  IoTicket() = default;  ///< an empty ticket, already complete with success
  explicit IoTicket(std::shared_ptr<detail::TicketState> state);

  /// True once the batch has completed (success or failure). Never blocks.
  bool poll() const noexcept;
  /// Blocks until completion; throws zinf::IoError with the first failure's Status.
  void wait() const;
  /// Waits at most `timeout`; returns false if still running, throws IoError on failure.
  bool wait_for(std::chrono::nanoseconds timeout) const;
  /// Blocks until completion and returns the Status without throwing.
  Status wait_status() const;
  /// Bytes transferred so far by requests of this batch.
  std::uint64_t bytes_done() const noexcept;
  /// When the batch's last piece completed (steady clock); unset until then (and for an empty
  /// ticket). For latency measurements.
  std::optional<std::chrono::steady_clock::time_point> completed_at() const noexcept;

 private:
  std::shared_ptr<detail::TicketState> state_;
};

/// Counters since the engine was made. Monotone; read with relaxed ordering.
struct IoStats {
  std::uint64_t requests = 0;
  std::uint64_t pieces = 0;
  std::uint64_t bytes_read = 0;
  std::uint64_t bytes_written = 0;
  std::uint64_t short_resubmits = 0;  ///< short transfers resubmitted for their remainder
  std::uint64_t retries = 0;          ///< EINTR/EAGAIN retries
  std::uint64_t failures = 0;         ///< requests that completed with an error
};

/// Asynchronous positional I/O.
///
/// Contract, for every backend:
/// - Thread-safe: any thread may attach, submit and wait concurrently.
/// - Alignment: see IoRequest. Lengths need not be multiples of block_size; large requests are
///   split into block_size pieces and the queue is kept at queue_depth.
/// - Lifetime: files stay attached and buffers valid until every ticket using them completes.
///   The destructor waits for in-flight work to finish (it does not cancel reads halfway).
/// - Completion: exactly once per batch. Every piece's result is checked: EINTR is retried,
///   EAGAIN is retried up to IoOptions::max_eagain_retries, a short transfer is resubmitted for
///   its remainder, zero bytes before the end is kShortTransfer, anything else fails the
///   request with its errno. A failure names operation, path, offset, length, bytes done and
///   backend. A partial transfer never completes as success.
///   Once a request has failed, its pieces not yet started are skipped; other requests of the
///   batch still run, and the batch reports the first failure.
/// - Ordering: none between requests, even in one batch; the caller orders with tickets.
/// - Cancellation: none; a ticket always completes.
class IoEngine {
 public:
  virtual ~IoEngine() = default;
  IoEngine(const IoEngine&) = delete;
  IoEngine& operator=(const IoEngine&) = delete;

  /// "uring" or "threads" (with "+faults" when a fault plan is installed).
  virtual std::string_view name() const noexcept = 0;
  virtual const IoOptions& options() const noexcept = 0;

  /// Attaches `file` (which must outlive its use) and returns its id. uring registers it in
  /// its fixed-file table where it can. Throws UsageError if the file is not open.
  virtual FileId attach(const File& file) = 0;
  /// Detaches a file; no request on it may be in flight.
  virtual void detach(FileId id) = 0;

  /// Registers host memory for faster I/O (io_uring fixed buffers). Call while no request is
  /// in flight; replaces earlier registrations. Returns false, with one notice logged, where
  /// the memlock limit or the kernel refuses; I/O then works unregistered. Never throws for that.
  /// Registered memory must stay mapped until it is unregistered (an empty call) or the engine
  /// is destroyed: io_uring keeps the pages pinned, so memory mapped later at the same address
  /// would not be what the kernel reads into.
  virtual bool register_buffers(std::span<const std::span<std::byte>> regions) = 0;

  /// Submits a batch; returns at once. Throws UsageError for misaligned or unknown-file
  /// requests before any of the batch starts. `on_complete`, if given, runs once on an engine
  /// thread after the ticket completes.
  virtual IoTicket submit(std::span<const IoRequest> batch, IoCallback on_complete = {}) = 0;

  virtual IoStats stats() const noexcept = 0;

 protected:
  IoEngine() = default;
};

/// Builds the engine `options.kind` names. kAuto tries io_uring and, if it cannot start, logs
/// one line with the reason (`io_uring unavailable (io_uring_setup: EPERM); using threads`) and
/// builds threads. An explicitly named kind that cannot start throws zinf::IoError.
std::unique_ptr<IoEngine> make_io_engine(const IoOptions& options = {});

/// Why io_uring cannot be used here ("" if it can): the kernel.io_uring_disabled sysctl,
/// EPERM from seccomp, ENOSYS on old kernels, or a build without liburing.
std::string io_uring_unavailable_reason();

}  // namespace zinf::swap
