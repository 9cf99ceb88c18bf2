// SPDX-License-Identifier: Apache-2.0
#include "zinf/common/small_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "zinf/common/error.h"
#include "zinf/common/status.h"
#include "zinf/common/unique_fd.h"

namespace zinf {

std::string_view file_kind(mode_t mode) noexcept {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISLNK(mode)) return "a symbolic link";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "a special file";
}

std::string read_small_regular_file(const std::string& path, std::uint64_t max_bytes,
                                    std::string_view what, std::string_view remedy) {
  const std::string w(what);
  // The open's own errno (ENOENT, EACCES, ENOTDIR, ELOOP, ...) is what the caller sees: a file
  // that exists but cannot be opened must not read as a missing one.
  const UniqueFd file(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  if (!file.valid()) throw IoError(Status::from_errno(errno, "open " + w, path));
  const int fd = file.get();
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw IoError(Status::from_errno(errno, "stat " + w, path));
  if (!S_ISREG(st.st_mode)) {
    throw UsageError(path + ": the " + w + " is " + std::string(file_kind(st.st_mode)) +
                     ", not a regular file" + std::string(remedy));
  }
  std::string limit = std::to_string(max_bytes) + " bytes";
  if (max_bytes >= (1u << 20) && max_bytes % (1u << 20) == 0) {
    limit += " (" + std::to_string(max_bytes >> 20) + " MiB)";
  }
  const UsageError too_big(path + ": the " + w + " is larger than the limit of " + limit);
  if (static_cast<std::uint64_t>(st.st_size) > max_bytes) throw too_big;
  // Reads at most one chunk past the cap, so a file that grows while it is read is bounded too.
  std::string text;
  char chunk[1 << 16];
  while (text.size() <= max_bytes) {
    const ssize_t n = ::read(fd, chunk, sizeof chunk);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw IoError(Status::from_errno(errno, "read " + w, path));
    }
    if (n == 0) break;
    text.append(chunk, static_cast<std::size_t>(n));
  }
  if (text.size() > max_bytes) throw too_big;
  return text;
}

}  // namespace zinf
