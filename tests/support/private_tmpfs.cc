// SPDX-License-Identifier: Apache-2.0
#include "support/private_tmpfs.h"

#include <sched.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

namespace zinf::test {

int run_with_private_tmpfs(const std::string& mountpoint, const std::string& size,
                           const std::function<int()>& check) {
  const pid_t pid = ::fork();
  if (pid < 0) return kNoPrivateTmpfs;
  if (pid == 0) {
    if (::unshare(CLONE_NEWNS) != 0) ::_exit(kNoPrivateTmpfs);
    if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
      ::_exit(kNoPrivateTmpfs);
    }
    const std::string options = "size=" + size;
    if (::mount("tmpfs", mountpoint.c_str(), "tmpfs", 0, options.c_str()) != 0) {
      ::_exit(kNoPrivateTmpfs);
    }
    int code = 6;
    try {
      code = check();
    } catch (...) {
      code = 6;
    }
    ::_exit(code);
  }
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return 99;
  return WEXITSTATUS(status);
}

}  // namespace zinf::test
