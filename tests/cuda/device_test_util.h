// SPDX-License-Identifier: Apache-2.0
// Helpers for the Device tests: page-aligned host memory (cudaHostRegister pins whole pages, so
// ranges registered separately must not share one), a gate that host work blocks on (ordering
// without sleeps); the log capture is tests/support/log_capture.h.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <span>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "support/log_capture.h"
#include "zinf/common/align.h"

namespace zinf::test {

/// Zeroed host memory starting on a page and padded to whole pages; a contiguous range, so it
/// converts to std::span like a vector. Move-only.
class PageBuffer {
 public:
  static constexpr std::size_t kPage = 4096;
  explicit PageBuffer(std::size_t size)
      : size_(size),
        data_(static_cast<std::byte*>(std::aligned_alloc(kPage, align_up(size, kPage) + kPage))) {
    std::memset(data_.get(), 0, size_);
  }
  std::byte* data() const { return data_.get(); }
  std::size_t size() const { return size_; }
  std::byte* begin() const { return data_.get(); }
  std::byte* end() const { return data_.get() + size_; }
  std::span<std::byte> span() const { return {data_.get(), size_}; }

 private:
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  std::size_t size_;
  std::unique_ptr<std::byte, Free> data_;
};

/// A gate that host work on a stream can block on until the test opens it. The state is shared
/// with the work, so the Gate may go before the work returns; its destructor opens it, so a
/// failing test never leaves a stream stuck (declare it after the streams it blocks).
class Gate {
 public:
  Gate() : state_(std::make_shared<State>()) {}
  ~Gate() { open(); }
  Gate(const Gate&) = delete;
  Gate& operator=(const Gate&) = delete;

  void open() {
    {
      std::lock_guard lock(state_->mu);
      state_->open = true;
    }
    state_->cv.notify_all();
  }
  /// Host work that returns once the gate is open.
  std::function<void()> waiter() const {
    return [s = state_] {
      std::unique_lock lock(s->mu);
      s->cv.wait(lock, [&] { return s->open; });
    };
  }

 private:
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    bool open = false;
  };
  std::shared_ptr<State> state_;
};

}  // namespace zinf::test
