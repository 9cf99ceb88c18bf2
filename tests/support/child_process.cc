// SPDX-License-Identifier: Apache-2.0
#include "support/child_process.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include <gtest/gtest.h>

namespace zinf::test {

Child::Child(const std::function<void(const std::function<void()>& ready)>& body) {
  int pipe_fds[2];
  if (::pipe(pipe_fds) != 0) {
    ADD_FAILURE() << "pipe failed";
    return;
  }
  std::fflush(nullptr);  // buffered output would otherwise be written twice
  pid_ = ::fork();
  if (pid_ < 0) {
    ADD_FAILURE() << "fork failed";
    ::close(pipe_fds[0]);
    ::close(pipe_fds[1]);
    return;
  }
  if (pid_ == 0) {
    ::close(pipe_fds[0]);
    const int out = pipe_fds[1];
    try {
      body([out] {
        const char one = '1';
        if (::write(out, &one, 1) != 1) ::_exit(4);
      });
    } catch (...) {
      ::_exit(3);
    }
    ::_exit(0);
  }
  ::close(pipe_fds[1]);
  char got = 0;
  ready_ = ::read(pipe_fds[0], &got, 1) == 1;
  ::close(pipe_fds[0]);
}

Child::~Child() {
  if (pid_ > 0 && !reaped_) (void)kill_and_reap();
}

int Child::kill_and_reap() {
  int status = 0;
  if (pid_ <= 0 || reaped_) return status;
  ::kill(pid_, SIGKILL);
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {}
  reaped_ = true;
  return status;
}

}  // namespace zinf::test
