// SPDX-License-Identifier: Apache-2.0
// UringIoEngine: one io_uring driven by one thread that submits and reaps, with fixed files and
// fixed buffers where the kernel allows them, an eventfd read kept armed in the ring to wake it,
// and the shared piece logic (engine_core.h) judging every CQE. liburing (Debian's
// liburing-dev) is the library; the engine on top of it (batching, resubmission of short
// transfers, completion checks) is zinf's, since no packaged library does that part.
#include "uring_io_engine.h"

#include <liburing.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <utility>

#include "zinf/common/check.h"
#include "zinf/common/error.h"
#include "zinf/common/log.h"

namespace zinf::swap {
namespace {

constexpr std::uint64_t kWakeTag = ~std::uint64_t{0};
constexpr std::uint64_t kDelayBit = std::uint64_t{1} << 32;
// Fixed-file table size: more than any swap layout attaches; the kernel caps it at
// RLIMIT_NOFILE, which is checked below.
constexpr unsigned kFixedFileSlots = 256;
// The kernel refuses a single registered buffer over 1 GiB (io_uring/rsrc.c), so larger
// regions are registered as several.
constexpr std::size_t kMaxRegisteredChunk = std::size_t{1} << 30;

std::string errno_reason(const char* op, int err) {
  return std::string(op) + ": " + errno_name(err);
}

// The value of kernel.io_uring_disabled (0 if absent: older kernels have no such switch).
int io_uring_disabled_sysctl() {
  std::ifstream in("/proc/sys/kernel/io_uring_disabled");
  int v = 0;
  if (in >> v) return v;
  return 0;
}

std::string setup_reason(int err) {
  std::string reason = errno_reason("io_uring_setup", err);
  if (int d = io_uring_disabled_sysctl(); d != 0) {
    reason += ", kernel.io_uring_disabled=" + std::to_string(d);
  }
  return reason;
}

unsigned ring_entries(std::uint32_t queue_depth) {
  // queue_depth pieces (each with either its I/O or its injected-delay timeout in flight) plus
  // the armed eventfd read.
  unsigned n = 1;
  while (n < queue_depth + 1) n <<= 1;
  return n;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Ring

void Ring::Exit::operator()(io_uring* ring) const noexcept {
  io_uring_queue_exit(ring);
  delete ring;
}

Ring::Ring(Ring&& other) noexcept
    : ring_(std::move(other.ring_)), flags_(std::exchange(other.flags_, 0)) {}

Ring& Ring::operator=(Ring&& other) noexcept {
  ring_ = std::move(other.ring_);
  flags_ = std::exchange(other.flags_, 0);
  return *this;
}

Ring::~Ring() = default;

int Ring::setup(unsigned entries) {
  // SINGLE_ISSUER|DEFER_TASKRUN (6.1): completions run only when the one issuing thread asks,
  // which is exactly our ring thread. The ring starts disabled so that the ring thread, not
  // the constructing thread, becomes its issuer when it enables it. COOP_TASKRUN (5.19) is
  // the next best. SUBMIT_ALL (5.18) keeps a bad SQE from stalling the ones behind it.
  const unsigned tries[] = {
      IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN | IORING_SETUP_R_DISABLED |
          IORING_SETUP_SUBMIT_ALL,
      IORING_SETUP_COOP_TASKRUN | IORING_SETUP_SUBMIT_ALL,
      0,
  };
  auto ring = std::unique_ptr<io_uring, Exit>();
  int rc = -EINVAL;
  for (unsigned flags : tries) {
    auto* raw = new io_uring{};
    io_uring_params params{};
    params.flags = flags;
    rc = io_uring_queue_init_params(entries, raw, &params);
    if (rc == 0) {
      ring_.reset(raw);
      flags_ = flags;
      return 0;
    }
    delete raw;
    if (rc != -EINVAL) return rc;  // EPERM, ENOSYS, ENOMEM: other flags will not help
  }
  return rc;
}

std::string uring_probe() {
  Ring ring;
  if (int rc = ring.setup(4); rc < 0) return setup_reason(-rc);
  return {};
}

// ---------------------------------------------------------------------------------------------
// Engine

struct UringIoEngine::Slot {
  detail::Piece piece;
  long long stashed_result = 0;  // the I/O result held while an injected delay runs
  __kernel_timespec delay{};     // read by the kernel when the timeout SQE is submitted
};

std::unique_ptr<UringIoEngine> UringIoEngine::create(const IoOptions& options,
                                                     detail::UringUnavailable& why) {
  detail::validate_options(options);
  Ring ring;
  if (int rc = ring.setup(ring_entries(options.queue_depth)); rc < 0) {
    why.reason = setup_reason(-rc);
    why.status = Status::from_errno(-rc, "io_uring_setup").with_backend("uring");
    if (int d = io_uring_disabled_sysctl(); d != 0) {
      const char* text = strerrordesc_np(-rc);
      why.status.with_message(std::string(text != nullptr ? text : "io_uring_setup failed") +
                              "; kernel.io_uring_disabled=" + std::to_string(d));
    }
    return nullptr;
  }
  try {
    return std::unique_ptr<UringIoEngine>(new UringIoEngine(options, std::move(ring)));
  } catch (const IoError& e) {
    why.status = e.status();
    why.reason = e.status().sys_errno() != 0
                     ? errno_reason(e.status().operation().c_str(), e.status().sys_errno())
                     : e.status().to_string();
    return nullptr;
  }
}

UringIoEngine::UringIoEngine(const IoOptions& options, Ring ring)
    : options_(options), name_(detail::engine_name("uring", options)), ring_(std::move(ring)) {
  ctx_.backend = name_;
  ctx_.block_size = options_.block_size;
  ctx_.max_eagain_retries = options_.max_eagain_retries;
  ctx_.faults = options_.faults.get();
  ctx_.stats = &stats_;

  const int efd = ::eventfd(0, EFD_CLOEXEC);
  if (efd < 0) throw IoError(Status::from_errno(errno, "eventfd").with_backend(name_));
  wake_fd_ = UniqueFd(efd);

  slots_.resize(options_.queue_depth);
  free_slots_.reserve(options_.queue_depth);
  for (std::uint32_t i = options_.queue_depth; i > 0; --i) free_slots_.push_back(i - 1);
  reaped_.reserve(2 * ring_entries(options_.queue_depth));

  // The thread owns the promise: the constructor may return (and throw) as soon as the value
  // is set, so the promise must not live in this frame.
  std::promise<Status> started;
  std::future<Status> result = started.get_future();
  thread_ = std::jthread([this, p = std::move(started)]() mutable { ring_main(p); });
  Status s = result.get();
  if (!s.ok()) {
    thread_.join();  // the thread returned right after reporting
    throw IoError(std::move(s));
  }
}

UringIoEngine::~UringIoEngine() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  // Unconditional: the ring thread may be about to block with sleeping_ not yet set.
  const std::uint64_t one = 1;
  if (::write(wake_fd_.get(), &one, sizeof one) < 0) {
    log(LogLevel::kError, "uring engine: eventfd write failed at shutdown");
  }
  if (thread_.joinable()) thread_.join();
}

void UringIoEngine::ring_main(std::promise<Status>& started) noexcept {
  try {
    ring_thread_id_ = std::this_thread::get_id();
    Status s = start_ring();
    const bool ok = s.ok();
    started.set_value(std::move(s));
    if (!ok) return;
    ring_loop();
  } catch (const std::exception& e) {
    // Only memory exhaustion can get here (building a Status or a vector); the ring state may
    // be half-updated, so continuing could lose a completion. Stop loudly instead.
    log(LogLevel::kError, std::string("uring engine: ring thread failed: ") + e.what());
    ::zinf::detail::check_failed("ring thread exception", e.what(), __FILE__, __LINE__);
  }
}

Status UringIoEngine::start_ring() {
  io_uring* ring = ring_.get();
  if ((ring_.flags() & IORING_SETUP_R_DISABLED) != 0) {
    // liburing 2.3 declares io_uring_enable_rings but does not export it: call the syscall.
    if (::syscall(__NR_io_uring_register, ring->ring_fd, IORING_REGISTER_ENABLE_RINGS, nullptr, 0) <
        0) {
      return Status::from_errno(errno, "io_uring_register(ENABLE_RINGS)").with_backend(name_);
    }
  }
  // Fixed files: a sparse table filled on attach. Bounded by RLIMIT_NOFILE.
  unsigned slots = kFixedFileSlots;
  if (rlimit rl{}; ::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < slots) {
    slots = static_cast<unsigned>(rl.rlim_cur);
  }
  if (int rc = io_uring_register_files_sparse(ring, slots); rc < 0) {
    log(LogLevel::kNotice, "io_uring: fixed files unavailable (" +
                               errno_reason("register_files_sparse", -rc) +
                               "); using plain descriptors");
    fixed_file_notice_given_ = true;
  } else {
    fixed_file_slots_ = slots;
  }
  arm_wake();
  int rc;
  do {
    rc = io_uring_submit(ring);
  } while (rc == -EINTR);
  if (rc < 0) return Status::from_errno(-rc, "io_uring_enter").with_backend(name_);
  return Status::ok_status();
}

// The ring thread's loop.
//
// Phases of one turn: (1) run queued commands (attach/detach/register_buffers must come from
// the issuing thread under SINGLE_ISSUER); (2) fill: cut pieces from the FIFO into free slots
// and prepare their SQEs (injected errors and EAGAINs are judged at once, without SQEs);
// (3) one io_uring_enter that submits everything prepared and, unless more work is already
// waiting, blocks for at least one completion; (4) reap every CQE and judge it: EINTR/EAGAIN
// retry and short-transfer remainders get a new SQE at once, so the queue stays full.
//
// Waking: an eventfd read is kept armed in the ring (tag kWakeTag). A submitter writes the
// eventfd when sleeping_ says the thread may block, which completes that read and so ends the
// wait inside io_uring_enter: no polling timeout, and no second fd to poll, which would not
// work with DEFER_TASKRUN anyway (completions there are only posted from inside the wait).
//
// Bounds: at most queue_depth pieces in flight (one slot each); the SQ has queue_depth + 1
// entries, so it never overflows, and the CQ (twice that) never does either.
void UringIoEngine::ring_loop() {
  io_uring* ring = ring_.get();
  for (;;) {
    bool more = run_commands();
    more = fill() || more;
    // Announce the intent to block, then look again: a submitter that pushed before the look
    // is seen here; one that pushes after it sees sleeping_ and writes the eventfd.
    sleeping_.store(true);
    bool work_waiting;
    {
      std::lock_guard lock(mu_);
      if (stopping_ && queue_.empty() && commands_.empty() && in_flight_ == 0) return;
      work_waiting = !commands_.empty() || (!queue_.empty() && !free_slots_.empty());
    }
    const unsigned wait_nr = more || work_waiting ? 0 : 1;
    const int rc = io_uring_submit_and_wait(ring, wait_nr);
    sleeping_.store(false);
    if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY && rc != -ETIME) {
      // The ring worked at startup; a failing enter now means a kernel or accounting bug.
      // Pieces already submitted would be lost if we went on, so stop loudly.
      log(LogLevel::kError, "uring engine: " + errno_reason("io_uring_enter", -rc));
      ZINF_CHECK(false, "io_uring_enter failed after the ring had started");
    }
    reap();
  }
}

bool UringIoEngine::run_commands() {
  std::deque<std::function<void()>> todo;
  {
    std::lock_guard lock(mu_);
    todo.swap(commands_);
  }
  for (auto& c : todo) c();  // each is a packaged_task: exceptions reach the caller
  return false;
}

bool UringIoEngine::fill() {
  // Returns true if more work can be done at once (pieces left and slots free after inline
  // completions freed some).
  for (;;) {
    std::vector<detail::Piece> taken;
    {
      std::lock_guard lock(mu_);
      std::size_t n = std::min<std::size_t>(free_slots_.size(), 64);
      while (n-- > 0 && !queue_.empty()) taken.push_back(queue_.pop(options_.block_size));
    }
    if (taken.empty()) return false;
    for (auto& p : taken) {
      const std::uint32_t slot = free_slots_.back();
      free_slots_.pop_back();
      ++in_flight_;
      slots_[slot].piece = std::move(p);
      issue(slot);
    }
  }
}

void UringIoEngine::issue(std::uint32_t slot) {
  detail::Piece& p = slots_[slot].piece;
  Status failure;
  for (;;) {
    if (detail::should_skip(p)) break;
    const auto injected = detail::begin_attempt(p, ctx_);
    if (!injected) {
      prep_io(slot);
      return;
    }
    if (detail::on_piece_result(p, *injected, ctx_, failure) != detail::PieceStep::kAgain) break;
  }
  finish(slot, failure);
}

int UringIoEngine::find_region(const std::byte* data, std::uint32_t length) const noexcept {
  const auto begin = reinterpret_cast<std::uintptr_t>(data);
  auto it = std::upper_bound(regions_.begin(), regions_.end(), begin,
                             [](std::uintptr_t v, const Region& r) { return v < r.begin; });
  if (it == regions_.begin()) return -1;
  --it;
  return begin >= it->begin && begin + length <= it->end ? it->index : -1;
}

void UringIoEngine::prep_io(std::uint32_t slot) {
  const detail::Piece& p = slots_[slot].piece;
  io_uring_sqe* sqe = io_uring_get_sqe(ring_.get());
  ZINF_CHECK(sqe != nullptr, "SQ full: more than queue_depth + 1 entries in flight");
  const detail::AttachedFile& f = *p.req->file;
  const bool fixed_file = f.fixed_index >= 0;
  const int fd = fixed_file ? f.fixed_index : f.fd;
  const int buf = find_region(p.attempt_data(), p.attempt_length());
  if (p.req->op == IoOp::kRead) {
    if (buf >= 0) {
      io_uring_prep_read_fixed(sqe, fd, p.attempt_data(), p.attempt_length(), p.attempt_offset(),
                               buf);
    } else {
      io_uring_prep_read(sqe, fd, p.attempt_data(), p.attempt_length(), p.attempt_offset());
    }
  } else {
    if (buf >= 0) {
      io_uring_prep_write_fixed(sqe, fd, p.attempt_data(), p.attempt_length(), p.attempt_offset(),
                                buf);
    } else {
      io_uring_prep_write(sqe, fd, p.attempt_data(), p.attempt_length(), p.attempt_offset());
    }
  }
  if (fixed_file) sqe->flags |= IOSQE_FIXED_FILE;
  io_uring_sqe_set_data64(sqe, slot);
}

void UringIoEngine::prep_delay(std::uint32_t slot) {
  Slot& s = slots_[slot];
  const auto us = std::exchange(s.piece.inject_delay, {}).count();
  s.delay.tv_sec = us / 1000000;
  s.delay.tv_nsec = (us % 1000000) * 1000;
  io_uring_sqe* sqe = io_uring_get_sqe(ring_.get());
  ZINF_CHECK(sqe != nullptr, "SQ full: more than queue_depth + 1 entries in flight");
  io_uring_prep_timeout(sqe, &s.delay, 0, 0);
  io_uring_sqe_set_data64(sqe, kDelayBit | slot);
}

void UringIoEngine::arm_wake() {
  io_uring_sqe* sqe = io_uring_get_sqe(ring_.get());
  ZINF_CHECK(sqe != nullptr, "SQ full while arming the wake read");
  io_uring_prep_read(sqe, wake_fd_.get(), &wake_value_, sizeof wake_value_, 0);
  io_uring_sqe_set_data64(sqe, kWakeTag);
}

void UringIoEngine::reap() {
  // Copy the CQEs out and release the CQ before judging them: judging prepares new SQEs and
  // may run callbacks.
  reaped_.clear();
  io_uring* ring = ring_.get();
  unsigned head;
  io_uring_cqe* cqe;
  unsigned n = 0;
  io_uring_for_each_cqe(ring, head, cqe) {
    reaped_.emplace_back(cqe->user_data, cqe->res);
    ++n;
  }
  io_uring_cq_advance(ring, n);
  for (const auto& [data, res] : reaped_) {
    if (data == kWakeTag) {
      // 8 bytes is the normal case; anything else (EINTR, a cancelled read) is re-armed too:
      // the read is only a doorbell, its value carries nothing.
      if (res < 0 && res != -EINTR && res != -EAGAIN && res != -ECANCELED) {
        log(LogLevel::kWarning, "uring engine: wake read failed: " + errno_name(-res));
      }
      arm_wake();
    } else if ((data & kDelayBit) != 0) {
      // The injected delay ran out (-ETIME is the timer's normal result); judge the held result.
      const auto slot = static_cast<std::uint32_t>(data & 0xffffffffu);
      on_io_result(slot, slots_[slot].stashed_result);
    } else {
      const auto slot = static_cast<std::uint32_t>(data);
      ZINF_CHECK(slot < slots_.size(), "CQE with an unknown user_data");
      detail::Piece& p = slots_[slot].piece;
      const long long result = detail::apply_injected_short(p, res);
      if (p.inject_delay.count() > 0) {
        slots_[slot].stashed_result = result;
        prep_delay(slot);
      } else {
        on_io_result(slot, result);
      }
    }
  }
}

void UringIoEngine::on_io_result(std::uint32_t slot, long long result) {
  Status failure;
  switch (detail::on_piece_result(slots_[slot].piece, result, ctx_, failure)) {
    case detail::PieceStep::kAgain: issue(slot); return;
    case detail::PieceStep::kComplete:
    case detail::PieceStep::kFailed: finish(slot, failure); return;
  }
}

void UringIoEngine::finish(std::uint32_t slot, const Status& failure) {
  detail::Piece p = std::move(slots_[slot].piece);
  slots_[slot].piece = detail::Piece{};
  free_slots_.push_back(slot);
  --in_flight_;
  detail::finish_piece(p, failure, ctx_);  // may run a callback that submits more work
}

// ---------------------------------------------------------------------------------------------
// Commands: work that must run on the ring thread.

void UringIoEngine::wake() noexcept {
  if (!sleeping_.exchange(false)) return;
  const std::uint64_t one = 1;
  // An eventfd write fails only if the counter would overflow, which cannot happen with the
  // ring reading it; nothing else to do about it here.
  [[maybe_unused]] const ssize_t n = ::write(wake_fd_.get(), &one, sizeof one);
}

void UringIoEngine::post(std::function<void()> command) {
  {
    std::lock_guard lock(mu_);
    commands_.push_back(std::move(command));
  }
  wake();
}

template <class F>
auto UringIoEngine::run_on_ring(F&& f) -> decltype(f()) {
  using R = decltype(f());
  if (std::this_thread::get_id() == ring_thread_id_) return f();  // from a callback
  auto task = std::make_shared<std::packaged_task<R()>>(std::forward<F>(f));
  std::future<R> result = task->get_future();
  post([task] { (*task)(); });
  return result.get();
}

int UringIoEngine::register_file(FileId id, int fd) {
  if (id.index >= fixed_file_slots_) return -1;
  int rc = io_uring_register_files_update(ring_.get(), id.index, &fd, 1);
  if (rc == 1) return static_cast<int>(id.index);
  if (!fixed_file_notice_given_) {
    fixed_file_notice_given_ = true;
    log(LogLevel::kNotice, "io_uring: fixed file registration refused (" +
                               errno_reason("register_files_update", rc < 0 ? -rc : EIO) +
                               "); using plain descriptors");
  }
  return -1;
}

void UringIoEngine::unregister_file(FileId id) {
  if (id.index >= fixed_file_slots_) return;
  int none = -1;
  // A failure leaves a stale slot that no request can name any more (the id is detached and
  // the next attach at this index overwrites it); log it and go on.
  if (int rc = io_uring_register_files_update(ring_.get(), id.index, &none, 1); rc < 0) {
    log(LogLevel::kWarning, "io_uring: clearing fixed file slot failed: " + errno_name(-rc));
  }
}

FileId UringIoEngine::attach(const File& file) {
  return files_.attach(file, [this](FileId id, int fd) {
    return run_on_ring([this, id, fd] { return register_file(id, fd); });
  });
}

void UringIoEngine::detach(FileId id) {
  auto entry = files_.find(id);
  if (entry == nullptr) {
    throw UsageError("IoEngine::detach: FileId " + std::to_string(id.index) +
                     " is not attached to this " + name_ + " engine");
  }
  // Clear the fixed slot before the id can be reused by another attach.
  if (entry->fixed_index >= 0) run_on_ring([this, id] { unregister_file(id); });
  files_.detach(id).reset();
}

bool UringIoEngine::do_register_buffers(const std::vector<std::span<std::byte>>& regions) {
  io_uring* ring = ring_.get();
  if (buffers_registered_) {
    io_uring_unregister_buffers(ring);
    buffers_registered_ = false;
  }
  regions_.clear();
  if (regions.empty()) return true;
  std::vector<iovec> iovecs;
  std::vector<Region> table;
  for (const auto& r : regions) {
    for (std::size_t at = 0; at < r.size(); at += kMaxRegisteredChunk) {
      const std::size_t len = std::min(kMaxRegisteredChunk, r.size() - at);
      iovecs.push_back(iovec{r.data() + at, len});
      const auto begin = reinterpret_cast<std::uintptr_t>(r.data() + at);
      table.push_back(Region{begin, begin + len, static_cast<int>(iovecs.size() - 1)});
    }
  }
  const int rc =
      io_uring_register_buffers(ring, iovecs.data(), static_cast<unsigned>(iovecs.size()));
  if (rc < 0) {
    std::string why = errno_reason("io_uring_register_buffers", -rc);
    if (-rc == ENOMEM) {
      rlimit rl{};
      if (::getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
        why += ", memlock limit " + std::to_string(rl.rlim_cur >> 10) + " KiB";
      }
    }
    log(LogLevel::kNotice,
        "io_uring: fixed buffers unavailable (" + why + "); using plain reads and writes");
    return false;
  }
  std::sort(table.begin(), table.end(),
            [](const Region& a, const Region& b) { return a.begin < b.begin; });
  regions_ = std::move(table);
  buffers_registered_ = true;
  return true;
}

bool UringIoEngine::register_buffers(std::span<const std::span<std::byte>> regions) {
  std::vector<std::span<std::byte>> copy(regions.begin(), regions.end());
  return run_on_ring([this, copy = std::move(copy)] { return do_register_buffers(copy); });
}

IoTicket UringIoEngine::submit(std::span<const IoRequest> batch, IoCallback on_complete) {
  auto state = detail::prepare_batch(batch, files_, ctx_, std::move(on_complete));
  if (state->pieces_left.load(std::memory_order_relaxed) == 0) return IoTicket(std::move(state));
  {
    std::lock_guard lock(mu_);
    queue_.push(state);
  }
  wake();
  return IoTicket(std::move(state));
}

}  // namespace zinf::swap
