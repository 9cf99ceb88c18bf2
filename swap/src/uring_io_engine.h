// SPDX-License-Identifier: Apache-2.0
// UringIoEngine: the io_uring IoEngine backend (liburing). One ring, owned by one thread that
// both submits and reaps. Private to zinf::swap; made by make_io_engine. Only the .cc includes
// liburing.h (this header forward-declares struct io_uring).
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "engine_core.h"
#include "zinf/common/unique_fd.h"
#include "zinf/swap/io_engine.h"

struct io_uring;

namespace zinf::swap {

/// Returns "" if an io_uring can be set up here, else why not ("io_uring_setup: EPERM").
/// Uses the same setup probe as UringIoEngine::create.
std::string uring_probe();

/// The one owner of an io_uring instance (io_uring_queue_exit in its destructor).
class Ring {
 public:
  Ring() = default;
  Ring(Ring&& other) noexcept;
  Ring& operator=(Ring&& other) noexcept;
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;
  ~Ring();

  /// Sets up a ring of `entries` with the best flags this kernel takes, in order:
  /// SINGLE_ISSUER|DEFER_TASKRUN (started disabled, enabled by its thread), COOP_TASKRUN, none;
  /// a try refused with EINVAL (flag unknown to the kernel) moves to the next. Returns 0 or the
  /// -errno of io_uring_setup.
  int setup(unsigned entries);
  io_uring* get() const noexcept { return ring_.get(); }
  unsigned flags() const noexcept { return flags_; }
  explicit operator bool() const noexcept { return ring_ != nullptr; }

 private:
  struct Exit {
    void operator()(io_uring* ring) const noexcept;
  };
  std::unique_ptr<io_uring, Exit> ring_;
  unsigned flags_ = 0;
};

class UringIoEngine final : public IoEngine {
 public:
  /// Builds the engine, or returns null with `why` filled in when io_uring cannot start here
  /// (setup refused, ring could not be enabled or entered). Throws UsageError for bad options.
  static std::unique_ptr<UringIoEngine> create(const IoOptions& options,
                                               detail::UringUnavailable& why);
  /// Finishes every submitted request, then stops the ring thread and tears the ring down.
  ~UringIoEngine() override;

  std::string_view name() const noexcept override { return name_; }
  const IoOptions& options() const noexcept override { return options_; }
  FileId attach(const File& file) override;
  void detach(FileId id) override;
  bool register_buffers(std::span<const std::span<std::byte>> regions) override;
  IoTicket submit(std::span<const IoRequest> batch, IoCallback on_complete = {}) override;
  IoStats stats() const noexcept override { return stats_.snapshot(); }

  /// The setup flags the ring runs with (IORING_SETUP_*), for logs and tests.
  unsigned ring_flags() const noexcept { return ring_.flags(); }

 private:
  struct Slot;
  struct Region {
    std::uintptr_t begin = 0;
    std::uintptr_t end = 0;
    int index = 0;
  };

  UringIoEngine(const IoOptions& options, Ring ring);

  // Ring thread.
  void ring_main(std::promise<Status>& started) noexcept;
  Status start_ring();
  void ring_loop();
  bool run_commands();
  bool fill();
  void issue(std::uint32_t slot);
  void prep_io(std::uint32_t slot);
  void prep_delay(std::uint32_t slot);
  void arm_wake();
  void reap();
  void on_io_result(std::uint32_t slot, long long result);
  void finish(std::uint32_t slot, const Status& failure);
  int register_file(FileId id, int fd);
  void unregister_file(FileId id);
  bool do_register_buffers(const std::vector<std::span<std::byte>>& regions);
  int find_region(const std::byte* data, std::uint32_t length) const noexcept;

  // Any thread.
  void wake() noexcept;
  void post(std::function<void()> command);
  template <class F>
  auto run_on_ring(F&& f) -> decltype(f());

  const IoOptions options_;
  const std::string name_;
  detail::AtomicIoStats stats_;
  detail::EngineContext ctx_;
  detail::FileTable files_;

  // Acquisition order: ring, then the eventfd it reads, then the thread that drives both.
  Ring ring_;
  UniqueFd wake_fd_;

  // Owned by the ring thread (touched by no other thread once it runs).
  std::vector<Slot> slots_;
  std::vector<std::uint32_t> free_slots_;
  std::uint32_t in_flight_ = 0;
  std::vector<Region> regions_;
  bool buffers_registered_ = false;
  unsigned fixed_file_slots_ = 0;
  bool fixed_file_notice_given_ = false;
  std::uint64_t wake_value_ = 0;
  std::vector<std::pair<std::uint64_t, int>> reaped_;

  // Shared with submitting threads.
  std::mutex mu_;
  detail::PieceQueue queue_;                    // guarded by mu_
  std::deque<std::function<void()>> commands_;  // guarded by mu_
  bool stopping_ = false;                       // guarded by mu_
  std::atomic<bool> sleeping_{false};           // the ring thread may block: write wake_fd_
  std::thread::id ring_thread_id_;              // set before the startup promise

  std::jthread thread_;  // last: stops and joins first
};

}  // namespace zinf::swap
