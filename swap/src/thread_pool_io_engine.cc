// SPDX-License-Identifier: Apache-2.0
// ThreadPoolIoEngine: pieces taken from one FIFO by worker threads, each doing one
// pread/pwrite per attempt, with the shared piece logic (engine_core.h) judging results.
#include "thread_pool_io_engine.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>

#include "zinf/common/error.h"

namespace zinf::swap {

namespace {
constexpr std::uint32_t kMaxWorkers = 32;  // IoOptions::threads documents the cap
}  // namespace

ThreadPoolIoEngine::ThreadPoolIoEngine(const IoOptions& options)
    : options_(options), name_(detail::engine_name("threads", options)) {
  detail::validate_options(options_);
  ctx_.backend = name_;
  ctx_.block_size = options_.block_size;
  ctx_.max_eagain_retries = options_.max_eagain_retries;
  ctx_.faults = options_.faults.get();
  ctx_.stats = &stats_;
  // More workers than queue_depth could never all be busy: the in-flight bound stops them.
  std::uint32_t n = options_.threads != 0 ? options_.threads : options_.queue_depth;
  n = std::min({n, options_.queue_depth, kMaxWorkers});
  workers_.reserve(n);
  for (std::uint32_t i = 0; i < n; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPoolIoEngine::~ThreadPoolIoEngine() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  workers_.clear();  // joins; workers leave only once the queue is empty
}

FileId ThreadPoolIoEngine::attach(const File& file) { return files_.attach(file, {}); }

void ThreadPoolIoEngine::detach(FileId id) {
  if (files_.detach(id) == nullptr) {
    throw UsageError("IoEngine::detach: FileId " + std::to_string(id.index) +
                     " is not attached to this " + name_ + " engine");
  }
}

bool ThreadPoolIoEngine::register_buffers(std::span<const std::span<std::byte>>) { return true; }

IoTicket ThreadPoolIoEngine::submit(std::span<const IoRequest> batch, IoCallback on_complete) {
  auto state = detail::prepare_batch(batch, files_, ctx_, std::move(on_complete));
  if (state->pieces_left.load(std::memory_order_relaxed) == 0) return IoTicket(std::move(state));
  {
    std::lock_guard lock(mu_);
    queue_.push(state);
  }
  work_cv_.notify_all();
  return IoTicket(std::move(state));
}

void ThreadPoolIoEngine::worker_loop() {
  // Phases: take one piece (FIFO, at most queue_depth in flight), run all of its attempts on
  // this thread, account it, repeat. Leaves when stopping and nothing is queued; pieces
  // already taken by other workers finish on those workers.
  std::unique_lock lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [this] {
      return (!queue_.empty() && in_flight_ < options_.queue_depth) ||
             (stopping_ && queue_.empty());
    });
    if (queue_.empty()) return;
    detail::Piece piece = queue_.pop(options_.block_size);
    ++in_flight_;
    lock.unlock();
    run_piece(piece);
    piece = detail::Piece{};  // drop the batch reference before taking the lock again
    lock.lock();
    --in_flight_;
    if (!queue_.empty()) work_cv_.notify_one();
  }
}

void ThreadPoolIoEngine::run_piece(detail::Piece& piece) {
  Status failure;
  if (!detail::should_skip(piece)) {
    for (;;) {
      long long result;
      if (auto injected = detail::begin_attempt(piece, ctx_)) {
        result = *injected;
      } else {
        const int fd = piece.req->file->fd;
        const auto off = static_cast<off_t>(piece.attempt_offset());
        const ssize_t n = piece.req->op == IoOp::kRead
                              ? ::pread(fd, piece.attempt_data(), piece.attempt_length(), off)
                              : ::pwrite(fd, piece.attempt_data(), piece.attempt_length(), off);
        result = n < 0 ? -static_cast<long long>(errno) : static_cast<long long>(n);
        result = detail::apply_injected_short(piece, result);
        if (piece.inject_delay.count() > 0) {
          std::this_thread::sleep_for(std::exchange(piece.inject_delay, {}));  // injected delay
        }
      }
      const detail::PieceStep step = detail::on_piece_result(piece, result, ctx_, failure);
      if (step != detail::PieceStep::kAgain) break;
    }
  }
  detail::finish_piece(piece, failure, ctx_);
}

}  // namespace zinf::swap
