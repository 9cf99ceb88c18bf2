// SPDX-License-Identifier: Apache-2.0
// UniqueFd: the one owner of a raw file descriptor, so that no error path closes one by hand
// (and none is leaked or closed twice). Part of zinf::common.
#pragma once

#include <utility>

namespace zinf {

/// Owns one descriptor (or none: -1) and closes it when destroyed, reset or assigned over.
/// Move-only. A close from the destructor or reset() ignores close(2)'s result and leaves
/// errno as it was, so an error path that reads errno after the owner is gone reads the
/// failure it is reporting; a writer that must know its close succeeded calls close().
/// Not thread-safe (one owner, like the descriptor itself).
class UniqueFd {
 public:
  UniqueFd() noexcept = default;
  /// Takes `fd` (a negative value, such as a failed open's -1, means none).
  explicit UniqueFd(int fd) noexcept : fd_(fd < 0 ? -1 : fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    reset(other.release());  // self-move: release() first leaves nothing to close
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  int get() const noexcept { return fd_; }
  bool valid() const noexcept { return fd_ >= 0; }
  /// Gives the descriptor up without closing it (-1 if none).
  int release() noexcept { return std::exchange(fd_, -1); }
  /// Closes the descriptor held (result ignored, errno kept) and takes `fd`.
  void reset(int fd = -1) noexcept;
  /// Closes now and returns 0, or close(2)'s errno. Never retried: on Linux the descriptor is
  /// gone even when close fails (EINTR included). No-op returning 0 when none is held.
  int close() noexcept;

 private:
  int fd_ = -1;
};

}  // namespace zinf
