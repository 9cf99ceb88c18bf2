// SPDX-License-Identifier: Apache-2.0
// UniqueFd's closes, out of line so that the header needs no POSIX includes.
#include "zinf/common/unique_fd.h"

#include <unistd.h>

#include <cerrno>

namespace zinf {

void UniqueFd::reset(int fd) noexcept {
  const int old = std::exchange(fd_, fd < 0 ? -1 : fd);
  if (old < 0) return;
  const int saved = errno;
  (void)::close(old);
  errno = saved;
}

int UniqueFd::close() noexcept {
  const int old = std::exchange(fd_, -1);
  if (old < 0) return 0;
  return ::close(old) == 0 ? 0 : errno;
}

}  // namespace zinf
