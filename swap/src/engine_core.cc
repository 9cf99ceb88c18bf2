// SPDX-License-Identifier: Apache-2.0
// The piece logic both IoEngine backends share (engine_core.h): validation, splitting,
// retry/resubmit decisions, fault application, error text and batch completion.
#include "engine_core.h"

#include <cerrno>
#include <cstring>
#include <exception>
#include <sstream>
#include <utility>

#include "zinf/common/check.h"
#include "zinf/common/error.h"
#include "zinf/common/log.h"

namespace zinf::swap::detail {
namespace {

const char* op_name(IoOp op) noexcept { return op == IoOp::kRead ? "read" : "write"; }

std::string describe_errno(int err) {
  const char* text = strerrordesc_np(err);  // thread-safe, unlike strerror
  return text != nullptr ? text : "errno " + std::to_string(err);
}

std::string piece_text(const Piece& piece) {
  return "piece offset=" + std::to_string(piece.attempt_offset()) +
         " length=" + std::to_string(piece.attempt_length());
}

// The Status every piece failure starts from: the request's op, path, range and progress.
Status request_failure(const Piece& piece, Status status, const EngineContext& ctx) {
  const RequestState& req = *piece.req;
  return std::move(status)
      .with_operation(op_name(req.op))
      .with_path(req.file->path)
      .with_range(req.offset, req.length)
      .with_bytes_done(req.bytes_done.load(std::memory_order_relaxed) + piece.done)
      .with_backend(std::string(ctx.backend));
}

}  // namespace

IoStats AtomicIoStats::snapshot() const noexcept {
  IoStats s;
  s.requests = requests.load(std::memory_order_relaxed);
  s.pieces = pieces.load(std::memory_order_relaxed);
  s.bytes_read = bytes_read.load(std::memory_order_relaxed);
  s.bytes_written = bytes_written.load(std::memory_order_relaxed);
  s.short_resubmits = short_resubmits.load(std::memory_order_relaxed);
  s.retries = retries.load(std::memory_order_relaxed);
  s.failures = failures.load(std::memory_order_relaxed);
  return s;
}

FileId FileTable::attach(const File& file, const std::function<int(FileId, int)>& register_fixed) {
  if (!file.is_open()) throw UsageError("IoEngine::attach: the File is not open");
  auto entry = std::make_shared<AttachedFile>();
  entry->fd = file.fd();
  entry->path = file.path();
  entry->direct = file.is_direct();
  entry->alignment = file.is_direct() ? file.alignment() : 1;
  std::uint32_t index = 0;
  {
    std::lock_guard lock(mu_);
    while (index < files_.size() && (files_[index] != nullptr || reserved_[index])) ++index;
    if (index == files_.size()) {
      files_.emplace_back();
      reserved_.push_back(false);
    }
    reserved_[index] = true;
  }
  entry->id = FileId{index};
  try {
    if (register_fixed) entry->fixed_index = register_fixed(entry->id, entry->fd);
  } catch (...) {
    std::lock_guard lock(mu_);
    reserved_[index] = false;
    throw;
  }
  std::lock_guard lock(mu_);
  reserved_[index] = false;
  files_[index] = std::move(entry);
  return FileId{index};
}

std::shared_ptr<const AttachedFile> FileTable::detach(FileId id) {
  std::lock_guard lock(mu_);
  if (!id.valid() || id.index >= files_.size()) return nullptr;
  return std::exchange(files_[id.index], nullptr);
}

std::shared_ptr<const AttachedFile> FileTable::find(FileId id) const {
  std::lock_guard lock(mu_);
  if (!id.valid() || id.index >= files_.size()) return nullptr;
  return files_[id.index];
}

void validate_options(const IoOptions& options) {
  if (options.block_size == 0 || options.block_size % 4096 != 0) {
    throw UsageError("IoOptions.block_size=" + std::to_string(options.block_size) +
                     " must be a non-zero multiple of 4096");
  }
  if (options.queue_depth == 0 || options.queue_depth > 4096) {
    throw UsageError("IoOptions.queue_depth=" + std::to_string(options.queue_depth) +
                     " must be in [1, 4096]");
  }
}

std::string engine_name(std::string_view base, const IoOptions& options) {
  std::string name(base);
  if (options.faults) name += "+faults";
  return name;
}

std::shared_ptr<BatchState> prepare_batch(std::span<const IoRequest> batch, const FileTable& files,
                                          const EngineContext& ctx, IoCallback on_complete) {
  auto state = std::make_shared<BatchState>();
  state->requests = std::make_unique<RequestState[]>(batch.size());
  state->request_count = batch.size();
  std::uint64_t pieces = 0;
  for (std::size_t i = 0; i < batch.size(); ++i) {
    const IoRequest& r = batch[i];
    auto file = files.find(r.file);
    if (file == nullptr) {
      throw UsageError("IoEngine::submit: request " + std::to_string(i) + " names FileId " +
                       std::to_string(r.file.index) + ", which is not attached to this " +
                       std::string(ctx.backend) + " engine");
    }
    const std::uint64_t length = r.buffer.size();
    const auto address = reinterpret_cast<std::uintptr_t>(r.buffer.data());
    if (length > 0 && r.buffer.data() == nullptr) {
      throw UsageError(std::string("IoEngine::submit: ") + op_name(r.op) + " on " + file->path +
                       " offset=" + std::to_string(r.offset) + " length=" + std::to_string(length) +
                       " has a null buffer");
    }
    if (r.offset > ~std::uint64_t{0} - length) {
      throw UsageError(std::string("IoEngine::submit: ") + op_name(r.op) + " on " + file->path +
                       " offset=" + std::to_string(r.offset) + " length=" + std::to_string(length) +
                       " overflows the file offset");
    }
    const std::uint64_t a = file->alignment;
    if (a > 1 && (address % a != 0 || r.offset % a != 0 || length % a != 0)) {
      std::ostringstream os;
      os << "IoEngine::submit: misaligned " << op_name(r.op) << " on " << file->path
         << " offset=" << r.offset << " length=" << length << " buffer=" << std::hex
         << std::showbase << address << std::dec << ": O_DIRECT needs buffer address, offset "
         << "and length to be multiples of " << a;
      throw UsageError(os.str());
    }
    RequestState& req = state->requests[i];
    req.op = r.op;
    req.file = std::move(file);
    req.offset = r.offset;
    req.data = r.buffer.data();
    req.length = length;
    const std::uint64_t n = (length + ctx.block_size - 1) / ctx.block_size;
    req.pieces_left.store(n, std::memory_order_relaxed);
    pieces += n;
  }
  state->pieces_left.store(pieces, std::memory_order_relaxed);
  state->callback = std::move(on_complete);
  ctx.stats->requests.fetch_add(batch.size(), std::memory_order_relaxed);
  ctx.stats->pieces.fetch_add(pieces, std::memory_order_relaxed);
  if (pieces == 0) state->complete();  // nothing to move: complete on the submitting thread
  return state;
}

void PieceQueue::push(std::shared_ptr<BatchState> batch) {
  batches_.push_back(std::move(batch));
  skip_empty();
}

void PieceQueue::skip_empty() {
  while (!batches_.empty()) {
    const BatchState& b = *batches_.front();
    while (request_ < b.request_count && position_ >= b.requests[request_].length) {
      ++request_;
      position_ = 0;
    }
    if (request_ < b.request_count) return;
    batches_.pop_front();
    request_ = 0;
    position_ = 0;
  }
}

Piece PieceQueue::pop(std::uint32_t block_size) {
  ZINF_CHECK(!batches_.empty(), "PieceQueue::pop on an empty queue");
  Piece p;
  p.batch = batches_.front();
  p.req = &p.batch->requests[request_];
  const std::uint64_t left = p.req->length - position_;
  p.length = static_cast<std::uint32_t>(left < block_size ? left : block_size);
  p.offset = p.req->offset + position_;
  p.data = p.req->data + position_;
  position_ += p.length;
  skip_empty();
  return p;
}

std::optional<long long> begin_attempt(Piece& piece, const EngineContext& ctx) {
  if (piece.fresh) {
    piece.fresh = false;
    // A direct file cannot resume at an unaligned position: redo the bytes from the aligned
    // point below (same buffer, same file range, so harmless for reads and writes alike).
    const std::uint32_t a = piece.req->file->alignment;
    piece.attempt_start = a > 1 ? piece.done - piece.done % a : piece.done;
    piece.inject_eagain = 0;
    piece.inject_short.reset();
    piece.inject_delay = std::chrono::microseconds{0};
    if (ctx.faults != nullptr) {
      const FaultDecision d =
          ctx.faults->decide(piece.req->op, piece.req->file->id, piece.attempt_offset());
      if (d.fired) {
        switch (d.kind) {
          case FaultKind::kError: return -static_cast<long long>(d.err > 0 ? d.err : EIO);
          case FaultKind::kShort: piece.inject_short = d.short_bytes; break;
          case FaultKind::kEagain: piece.inject_eagain = d.eagain_count; break;
          case FaultKind::kDelay: piece.inject_delay = d.delay; break;
        }
      }
    }
  }
  if (piece.inject_eagain > 0) {
    --piece.inject_eagain;
    return -static_cast<long long>(EAGAIN);
  }
  return std::nullopt;
}

long long apply_injected_short(Piece& piece, long long result) noexcept {
  if (piece.inject_short && result > 0) {
    const long long limit = *piece.inject_short;
    piece.inject_short.reset();
    if (result > limit) return limit;
  }
  return result;
}

PieceStep on_piece_result(Piece& piece, long long result, const EngineContext& ctx,
                          Status& failure) {
  if (result == -EINTR) {
    ctx.stats->retries.fetch_add(1, std::memory_order_relaxed);
    return PieceStep::kAgain;
  }
  if (result == -EAGAIN) {
    if (piece.eagain_retries >= ctx.max_eagain_retries) {
      failure = request_failure(piece,
                                Status::from_errno(EAGAIN, "")
                                    .with_code(ErrorCode::kTimedOut)
                                    .with_message(describe_errno(EAGAIN) + " after " +
                                                  std::to_string(piece.eagain_retries) +
                                                  " retries (the bound) at " + piece_text(piece)),
                                ctx);
      return PieceStep::kFailed;
    }
    ++piece.eagain_retries;
    ctx.stats->retries.fetch_add(1, std::memory_order_relaxed);
    return PieceStep::kAgain;
  }
  if (result < 0) {
    const int err = static_cast<int>(-result);
    failure = request_failure(
        piece,
        Status::from_errno(err, "").with_message(describe_errno(err) + " at " + piece_text(piece)),
        ctx);
    return PieceStep::kFailed;
  }
  ZINF_CHECK(result <= static_cast<long long>(piece.attempt_length()),
             "the kernel reported more bytes than the attempt asked for");
  const auto new_done = static_cast<std::uint32_t>(piece.attempt_start + result);
  if (new_done <= piece.done) {
    // Zero bytes (or no progress past what was already done) before the end: end of file for
    // a read, a device that takes nothing for a write. Never success.
    failure = request_failure(
        piece,
        Status::error(ErrorCode::kShortTransfer,
                      "transfer stopped after " + std::to_string(piece.done) + " of " +
                          std::to_string(piece.length) +
                          " bytes at piece offset=" + std::to_string(piece.offset) +
                          (piece.req->op == IoOp::kRead ? " (end of file)" : " (no progress)")),
        ctx);
    return PieceStep::kFailed;
  }
  piece.done = new_done;
  if (piece.done == piece.length) return PieceStep::kComplete;
  ctx.stats->short_resubmits.fetch_add(1, std::memory_order_relaxed);
  piece.fresh = true;
  return PieceStep::kAgain;
}

void finish_piece(Piece& piece, const Status& failure, const EngineContext& ctx) noexcept {
  RequestState& req = *piece.req;
  BatchState& batch = *piece.batch;
  if (piece.done > 0) {
    req.bytes_done.fetch_add(piece.done, std::memory_order_relaxed);
    batch.bytes_done.fetch_add(piece.done, std::memory_order_relaxed);
    (req.op == IoOp::kRead ? ctx.stats->bytes_read : ctx.stats->bytes_written)
        .fetch_add(piece.done, std::memory_order_relaxed);
  }
  if (!failure.ok() && !req.failed.exchange(true, std::memory_order_acq_rel)) {
    try {
      batch.record_failure(failure);
    } catch (...) {
      // Copying the Status can only fail for memory; keep a bare failure rather than none.
      std::lock_guard lock(batch.mu);
      if (batch.status.ok()) batch.status = Status::error(failure.code(), {});
    }
  }
  if (req.pieces_left.fetch_sub(1, std::memory_order_acq_rel) == 1 &&
      req.failed.load(std::memory_order_acquire)) {
    ctx.stats->failures.fetch_add(1, std::memory_order_relaxed);
  }
  if (batch.pieces_left.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    std::shared_ptr<BatchState> keep = piece.batch;  // the piece may be reset by the callback
    keep->complete();
  }
}

}  // namespace zinf::swap::detail
