// SPDX-License-Identifier: Apache-2.0
// What both IoEngine backends share: batch state, the attached-file table, submit-time
// validation, the split of requests into block_size pieces, and the per-piece result logic
// (EINTR/EAGAIN retry, short-transfer resubmission, fault injection, error text), so that the
// threads and uring backends differ only in how a piece attempt reaches the kernel.
// Private to zinf::swap.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ticket_state.h"
#include "zinf/common/status.h"
#include "zinf/swap/fault_injection.h"
#include "zinf/swap/file.h"
#include "zinf/swap/io_engine.h"

namespace zinf::swap::detail {

/// Why io_uring cannot start: a short reason for the fallback notice ("io_uring_setup: EPERM")
/// and the Status an explicit request for uring throws.
struct UringUnavailable {
  std::string reason;
  Status status;
};

/// Stats counters kept with relaxed atomics; snapshot() gives the public IoStats.
struct AtomicIoStats {
  std::atomic<std::uint64_t> requests{0};
  std::atomic<std::uint64_t> pieces{0};
  std::atomic<std::uint64_t> bytes_read{0};
  std::atomic<std::uint64_t> bytes_written{0};
  std::atomic<std::uint64_t> short_resubmits{0};
  std::atomic<std::uint64_t> retries{0};
  std::atomic<std::uint64_t> failures{0};
  IoStats snapshot() const noexcept;
};

/// A file as an engine sees it: copied at attach time so that requests never touch File.
struct AttachedFile {
  FileId id;
  int fd = -1;
  std::string path;
  bool direct = false;
  std::uint32_t alignment = 1;  ///< what submit() checks; 1 for buffered files
  int fixed_index = -1;         ///< uring: slot in the registered file table, -1 if none
};

/// FileId -> AttachedFile. Thread-safe. Ids are reused after detach.
class FileTable {
 public:
  /// Adds `file` and returns its id. `register_fixed(id, fd)` (may be empty) returns the fixed
  /// table slot, or -1; it runs before the file becomes visible to submit(), without the table
  /// lock held (it may wait for an engine thread that is itself looking files up).
  FileId attach(const File& file, const std::function<int(FileId, int)>& register_fixed);
  /// Removes `id`; returns the removed entry (null if unknown).
  std::shared_ptr<const AttachedFile> detach(FileId id);
  /// Returns the entry or null.
  std::shared_ptr<const AttachedFile> find(FileId id) const;

 private:
  mutable std::mutex mu_;
  std::vector<std::shared_ptr<const AttachedFile>> files_;  // null: free or reserved
  std::vector<bool> reserved_;                              // taken by an attach in progress
};

/// One request of a batch. Pieces are cut from it lazily by PieceQueue.
struct RequestState {
  IoOp op = IoOp::kRead;
  std::shared_ptr<const AttachedFile> file;
  std::uint64_t offset = 0;
  std::byte* data = nullptr;
  std::uint64_t length = 0;
  std::atomic<std::uint64_t> pieces_left{0};
  std::atomic<std::uint64_t> bytes_done{0};
  std::atomic<bool> failed{false};  ///< set by the first failed piece; later pieces are skipped
};

/// A batch as the backends see it: its ticket's state and its requests.
struct BatchState : TicketState {
  std::unique_ptr<RequestState[]> requests;
  std::size_t request_count = 0;
};

/// Everything the piece logic needs from its engine.
struct EngineContext {
  std::string_view backend;  ///< name(), e.g. "uring+faults"
  std::uint32_t block_size = 0;
  std::uint32_t max_eagain_retries = 0;
  FaultPlan* faults = nullptr;
  AtomicIoStats* stats = nullptr;
};

/// Validates `options` (block_size a non-zero multiple of 4096, queue_depth >= 1); throws
/// UsageError naming the bad field.
void validate_options(const IoOptions& options);

/// Returns "threads"/"uring" with "+faults" when a plan is installed.
std::string engine_name(std::string_view base, const IoOptions& options);

/// Validates every request of `batch` (known file, alignment, buffer) and builds its state.
/// Throws UsageError before anything is started. Counts requests and pieces in the stats.
std::shared_ptr<BatchState> prepare_batch(std::span<const IoRequest> batch, const FileTable& files,
                                          const EngineContext& ctx, IoCallback on_complete);

/// One block_size piece of a request, with the progress of its current attempt.
struct Piece {
  std::shared_ptr<BatchState> batch;
  RequestState* req = nullptr;
  std::uint64_t offset = 0;  ///< file offset of the piece
  std::byte* data = nullptr;
  std::uint32_t length = 0;
  std::uint32_t done = 0;           ///< bytes from the piece start known to have moved
  std::uint32_t attempt_start = 0;  ///< where the current attempt starts (<= done, aligned)
  std::uint32_t eagain_retries = 0;
  bool fresh = true;  ///< the next attempt is new (consults the fault plan), not a retry
  // Faults decided for the current attempt.
  std::uint32_t inject_eagain = 0;
  std::optional<std::uint32_t> inject_short;
  std::chrono::microseconds inject_delay{0};

  std::uint64_t attempt_offset() const noexcept { return offset + attempt_start; }
  std::byte* attempt_data() const noexcept { return data + attempt_start; }
  std::uint32_t attempt_length() const noexcept { return length - attempt_start; }
};

/// FIFO of batches not yet fully cut into pieces. Not thread-safe: the backend locks.
class PieceQueue {
 public:
  void push(std::shared_ptr<BatchState> batch);
  bool empty() const noexcept { return batches_.empty(); }
  /// Cuts the next piece (requests in submission order, each from its start).
  Piece pop(std::uint32_t block_size);

 private:
  std::deque<std::shared_ptr<BatchState>> batches_;
  std::size_t request_ = 0;     // of the front batch
  std::uint64_t position_ = 0;  // within that request
  void skip_empty();
};

/// Starts an attempt of `piece`. Returns a raw result to process without doing any I/O
/// (an injected error or EAGAIN), or nullopt: do the I/O for attempt_offset/data/length.
std::optional<long long> begin_attempt(Piece& piece, const EngineContext& ctx);

/// Applies an injected short transfer to the raw result of real I/O.
long long apply_injected_short(Piece& piece, long long result) noexcept;

/// What to do after a raw result.
enum class PieceStep { kAgain, kComplete, kFailed };

/// Judges one raw result (bytes, or -errno): kAgain to retry or resubmit the remainder
/// (begin_attempt again), kComplete, or kFailed with `failure` set.
PieceStep on_piece_result(Piece& piece, long long result, const EngineContext& ctx,
                          Status& failure);

/// Accounts a finished piece (success, failure, or skipped) and completes its batch after
/// its last piece. Never throws.
void finish_piece(Piece& piece, const Status& failure, const EngineContext& ctx) noexcept;

/// True when the piece's request already failed, so the piece is skipped without I/O.
inline bool should_skip(const Piece& piece) noexcept {
  return piece.req->failed.load(std::memory_order_relaxed);
}

}  // namespace zinf::swap::detail
