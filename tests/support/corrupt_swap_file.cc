// SPDX-License-Identifier: Apache-2.0
#include "support/corrupt_swap_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <set>
#include <stdexcept>
#include <utility>

namespace zinf::test {
namespace {

std::string errno_text(const std::string& what, int err) {
  return what + ": " + std::strerror(err);
}

// The descriptor's link target, or "" if it went away meanwhile.
std::string link_of(int fd) {
  const std::string link = "/proc/self/fd/" + std::to_string(fd);
  std::string buf(4096, '\0');
  const ssize_t n = ::readlink(link.c_str(), buf.data(), buf.size());
  if (n <= 0) return "";
  buf.resize(static_cast<std::size_t>(n));
  return buf;
}

OpenFile the_file_under(const std::string& dir) {
  std::vector<OpenFile> files = open_files_under(dir);
  if (files.size() == 1) return files.front();
  std::string list;
  for (const OpenFile& f : files) list += (list.empty() ? "" : ", ") + f.target;
  throw std::runtime_error("corrupt_swap_file: expected one file open under " + dir + ", found " +
                           std::to_string(files.size()) + (list.empty() ? "" : ": " + list));
}

// A fresh descriptor on the same file: buffered, whatever flags the store opened it with.
int reopen(const OpenFile& f, int flags) {
  const std::string link = "/proc/self/fd/" + std::to_string(f.fd);
  const int fd = ::open(link.c_str(), flags | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error(errno_text("corrupt_swap_file: open " + f.target, errno));
  return fd;
}

void read_exactly(int fd, const OpenFile& f, std::byte* out, std::size_t length,
                  std::uint64_t offset) {
  const ssize_t n = ::pread(fd, out, length, static_cast<off_t>(offset));
  if (n != static_cast<ssize_t>(length)) {
    const int err = n < 0 ? errno : 0;
    ::close(fd);
    throw std::runtime_error(
        "corrupt_swap_file: read of " + f.target + " offset=" + std::to_string(offset) +
        " length=" + std::to_string(length) +
        (n < 0 ? ": " + std::string(std::strerror(err)) : " returned " + std::to_string(n)));
  }
}

}  // namespace

std::vector<OpenFile> open_files_under(const std::string& dir) {
  std::error_code ec;
  std::string prefix = std::filesystem::weakly_canonical(dir, ec).string();
  if (ec) prefix = dir;
  prefix += "/";
  DIR* d = ::opendir("/proc/self/fd");
  if (d == nullptr) throw std::runtime_error(errno_text("corrupt_swap_file: /proc/self/fd", errno));
  std::vector<int> fds;
  while (const dirent* e = ::readdir(d)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end != e->d_name && *end == '\0' && fd != ::dirfd(d)) fds.push_back(static_cast<int>(fd));
  }
  ::closedir(d);
  std::vector<OpenFile> out;
  std::set<std::pair<dev_t, ino_t>> seen;
  for (int fd : fds) {
    std::string target = link_of(fd);
    if (target.rfind(prefix, 0) != 0) continue;
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) continue;
    if (!seen.insert({st.st_dev, st.st_ino}).second) continue;
    out.push_back(OpenFile{fd, std::move(target)});
  }
  return out;
}

FlippedByte flip_swap_file_byte(const std::string& dir, std::uint64_t offset, std::byte mask) {
  FlippedByte flip;
  flip.file = the_file_under(dir);
  flip.offset = offset;
  const int fd = reopen(flip.file, O_RDWR);
  read_exactly(fd, flip.file, &flip.before, 1, offset);
  flip.after = flip.before ^ mask;
  if (::pwrite(fd, &flip.after, 1, static_cast<off_t>(offset)) != 1 || ::fdatasync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    throw std::runtime_error(errno_text("corrupt_swap_file: write of " + flip.file.target +
                                            " offset=" + std::to_string(offset) + " length=1",
                                        err));
  }
  ::close(fd);
  return flip;
}

std::vector<std::byte> read_swap_file(const std::string& dir, std::uint64_t offset,
                                      std::size_t length) {
  const OpenFile f = the_file_under(dir);
  std::vector<std::byte> out(length);
  const int fd = reopen(f, O_RDONLY);
  read_exactly(fd, f, out.data(), length, offset);
  ::close(fd);
  return out;
}

}  // namespace zinf::test
