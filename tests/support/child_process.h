// SPDX-License-Identifier: Apache-2.0
// A forked child that runs until the test kills it: for the tests that check what a process
// leaves behind, or holds, when it dies without a chance to clean up. One copy instead of a
// fork/pipe/waitpid dance per test file.
#pragma once

#include <sys/types.h>

#include <functional>

namespace zinf::test {

/// Forks a child that runs `body(ready)`; `body` calls `ready()` once it has reached the point
/// the test waits for, then keeps running (it may loop, block or pause). A child whose body
/// returns exits with 0, one that throws with 3. The parent returns once `ready()` was called
/// or the child ended first. Fork only where the parent runs no other thread of zinf's.
class Child {
 public:
  explicit Child(const std::function<void(const std::function<void()>& ready)>& body);
  ~Child();  ///< kills (SIGKILL) and reaps the child if the test did not
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  pid_t pid() const { return pid_; }
  /// True if the child called ready() before it ended.
  bool ready() const { return ready_; }
  /// Sends SIGKILL, waits for the child and returns its wait status.
  int kill_and_reap();

 private:
  pid_t pid_ = -1;
  bool ready_ = false;
  bool reaped_ = false;
};

}  // namespace zinf::test
