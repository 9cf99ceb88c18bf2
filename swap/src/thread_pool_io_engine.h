// SPDX-License-Identifier: Apache-2.0
// ThreadPoolIoEngine: the portable IoEngine backend, worker threads doing pread/pwrite, for
// machines where io_uring is missing or refused. Private to zinf::swap; made by make_io_engine.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine_core.h"
#include "zinf/swap/io_engine.h"

namespace zinf::swap {

/// Workers are std::jthread rather than a Boost.Asio thread_pool: each worker blocks in one
/// pread/pwrite at a time and the engine already needs its own FIFO (requests are cut into
/// pieces lazily, and at most queue_depth pieces may be in flight), so an executor would only
/// add a second, unbounded queue and an allocation per piece.
class ThreadPoolIoEngine final : public IoEngine {
 public:
  /// Starts min(threads or queue_depth, queue_depth, 32) workers. Throws UsageError for bad
  /// options.
  explicit ThreadPoolIoEngine(const IoOptions& options);
  /// Finishes every submitted request, then joins the workers.
  ~ThreadPoolIoEngine() override;

  std::string_view name() const noexcept override { return name_; }
  const IoOptions& options() const noexcept override { return options_; }
  FileId attach(const File& file) override;
  void detach(FileId id) override;
  /// pread/pwrite need no registration: returns true and does nothing.
  bool register_buffers(std::span<const std::span<std::byte>> regions) override;
  IoTicket submit(std::span<const IoRequest> batch, IoCallback on_complete = {}) override;
  IoStats stats() const noexcept override { return stats_.snapshot(); }

 private:
  void worker_loop();
  void run_piece(detail::Piece& piece);

  const IoOptions options_;
  const std::string name_;
  detail::AtomicIoStats stats_;
  detail::EngineContext ctx_;
  detail::FileTable files_;

  std::mutex mu_;
  std::condition_variable work_cv_;
  detail::PieceQueue queue_;           // guarded by mu_
  std::uint32_t in_flight_ = 0;        // guarded by mu_
  bool stopping_ = false;              // guarded by mu_
  std::vector<std::jthread> workers_;  // last: joined first, while the state above is alive
};

}  // namespace zinf::swap
