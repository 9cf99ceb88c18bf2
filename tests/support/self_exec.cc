// SPDX-License-Identifier: Apache-2.0
#include "support/self_exec.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include <gtest/gtest.h>

namespace zinf::test {
namespace {

std::string probe() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return std::string("pipe failed: ") + std::strerror(errno);
  std::fflush(nullptr);  // buffered output would otherwise be written twice
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return std::string("fork failed: ") + std::strerror(errno);
  }
  if (pid == 0) {
    // Lists no test and exits 0 in a process that can exec; the pipe closes on exec, so the
    // parent reads nothing. If exec fails, its errno goes up the pipe.
    ::close(fds[0]);
    char arg0[] = "self_exec_probe";
    char arg1[] = "--gtest_list_tests";
    char arg2[] = "--gtest_filter=-*";
    char* argv[] = {arg0, arg1, arg2, nullptr};
    ::execv("/proc/self/exe", argv);
    const int err = errno;
    [[maybe_unused]] const ssize_t n = ::write(fds[1], &err, sizeof err);
    ::_exit(127);
  }
  ::close(fds[1]);
  int err = 0;
  ssize_t n;
  do {
    n = ::read(fds[0], &err, sizeof err);
  } while (n < 0 && errno == EINTR);
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (n == static_cast<ssize_t>(sizeof err)) {
    return std::string("exec of /proc/self/exe failed: ") + std::strerror(err) +
           " (a user-mode emulator such as qemu-user without binfmt_misc cannot exec a foreign "
           "executable)";
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return "a fresh copy of this executable did not exit cleanly (wait status " +
           std::to_string(status) + ")";
  }
  return "";
}

}  // namespace

const std::string& self_exec_unavailable_reason() {
  static const std::string reason = probe();
  return reason;
}

void prefer_threadsafe_death_tests() {
  GTEST_FLAG_SET(death_test_style, self_exec_unavailable_reason().empty() ? "threadsafe" : "fast");
}

}  // namespace zinf::test
