// SPDX-License-Identifier: Apache-2.0
// IoTicket, the kind names, and make_io_engine: the one probe that picks io_uring or threads
// and says why in one line when it falls back.
#include "zinf/swap/io_engine.h"

#include <memory>
#include <string>

#include "engine_core.h"
#include "thread_pool_io_engine.h"
#include "ticket_state.h"
#include "zinf/common/error.h"
#include "zinf/common/log.h"
#include "zinf/config.h"
#if ZINF_HAVE_LIBURING
#include "uring_io_engine.h"
#endif

namespace zinf::swap {

IoTicket::IoTicket(std::shared_ptr<detail::TicketState> state) : state_(std::move(state)) {}

bool IoTicket::poll() const noexcept {
  return state_ == nullptr || state_->done_flag.load(std::memory_order_acquire);
}

void IoTicket::wait() const { throw_if_error(wait_status()); }

bool IoTicket::wait_for(std::chrono::nanoseconds timeout) const {
  if (state_ == nullptr) return true;
  Status status;
  {
    std::unique_lock lock(state_->mu);
    if (!state_->cv.wait_for(lock, timeout, [this] { return state_->done; })) return false;
    status = state_->status;
  }
  throw_if_error(status);
  return true;
}

Status IoTicket::wait_status() const {
  if (state_ == nullptr) return Status::ok_status();
  std::unique_lock lock(state_->mu);
  state_->cv.wait(lock, [this] { return state_->done; });
  return state_->status;
}

std::uint64_t IoTicket::bytes_done() const noexcept {
  return state_ == nullptr ? 0 : state_->bytes_done.load(std::memory_order_relaxed);
}

std::optional<std::chrono::steady_clock::time_point> IoTicket::completed_at() const noexcept {
  if (state_ == nullptr) return std::nullopt;
  const std::int64_t ns = state_->completed_at_ns.load(std::memory_order_acquire);
  if (ns == detail::TicketState::kNotCompleted) return std::nullopt;
  return std::chrono::steady_clock::time_point(
      std::chrono::duration_cast<std::chrono::steady_clock::duration>(
          std::chrono::nanoseconds(ns)));
}

IoEngineKind parse_io_engine_kind(std::string_view text) {
  if (text == "auto") return IoEngineKind::kAuto;
  if (text == "uring") return IoEngineKind::kUring;
  if (text == "threads") return IoEngineKind::kThreads;
  throw UsageError("unknown I/O engine '" + std::string(text) +
                   "' (expected auto, uring or threads)");
}

std::string_view io_engine_kind_name(IoEngineKind kind) noexcept {
  switch (kind) {
    case IoEngineKind::kAuto: return "auto";
    case IoEngineKind::kUring: return "uring";
    case IoEngineKind::kThreads: return "threads";
  }
  return "unknown";
}

namespace {

#if ZINF_HAVE_LIBURING
std::unique_ptr<IoEngine> try_uring(const IoOptions& options, detail::UringUnavailable& why) {
  return UringIoEngine::create(options, why);
}
#else
std::unique_ptr<IoEngine> try_uring(const IoOptions&, detail::UringUnavailable& why) {
  why.reason = "built without liburing";
  why.status = Status::error(ErrorCode::kUnsupported, "zinf was built without liburing")
                   .with_operation("io_uring")
                   .with_backend("uring");
  return nullptr;
}
#endif

}  // namespace

std::unique_ptr<IoEngine> make_io_engine(const IoOptions& options) {
  detail::validate_options(options);
  if (options.kind == IoEngineKind::kThreads) return std::make_unique<ThreadPoolIoEngine>(options);
  detail::UringUnavailable why;
  if (auto engine = try_uring(options, why)) return engine;
  if (options.kind == IoEngineKind::kUring) throw IoError(why.status);
  log(LogLevel::kNotice, "io_uring unavailable (" + why.reason + "); using threads");
  return std::make_unique<ThreadPoolIoEngine>(options);
}

std::string io_uring_unavailable_reason() {
#if ZINF_HAVE_LIBURING
  return uring_probe();
#else
  return "built without liburing";
#endif
}

}  // namespace zinf::swap
