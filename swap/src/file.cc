// SPDX-License-Identifier: Apache-2.0
// File: open with O_DIRECT (buffered fallback with one notice), the direct-I/O alignment probe
// (statx STATX_DIOALIGN, else the device's logical block size, else 4096), preallocation.
#include "zinf/swap/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <fstream>
#include <string>
#include <utility>

#include "zinf/common/error.h"
#include "zinf/common/log.h"
#include "zinf/swap/dir.h"

namespace zinf::swap {
namespace {

constexpr std::uint32_t kMinDirectAlignment = 512;  // the smallest logical block size there is
constexpr std::uint32_t kDefaultAlignment = 4096;   // safe for every device when nothing says

[[noreturn]] void throw_errno(int err, const char* op, const std::string& path,
                              std::uint64_t offset = Status::kUnset,
                              std::uint64_t length = Status::kUnset) {
  throw IoError(Status::from_errno(err, op, path, offset, length));
}

std::uint32_t read_block_size(const std::string& sysfs_queue_file) {
  std::ifstream in(sysfs_queue_file);
  std::uint64_t value = 0;
  if (in >> value && value >= kMinDirectAlignment && value <= (1u << 20)) {
    return static_cast<std::uint32_t>(value);
  }
  return 0;
}

// Logical block size of the block device holding files with st_dev `dev`, or 0. A partition
// (or a dm/loop device without its own queue) has no queue/ directory: look at its parent.
std::uint32_t device_logical_block_size(dev_t dev) {
  const std::string base =
      "/sys/dev/block/" + std::to_string(major(dev)) + ":" + std::to_string(minor(dev));
  if (std::uint32_t v = read_block_size(base + "/queue/logical_block_size")) return v;
  return read_block_size(base + "/../queue/logical_block_size");
}

// The alignment rule of file.h, for an open descriptor or a path (fd < 0).
std::uint32_t probe_alignment(int fd, const std::string& path) noexcept {
  try {
    struct statx sx {};
    const int rc = fd >= 0 ? ::statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx)
                           : ::statx(AT_FDCWD, path.c_str(), 0, STATX_DIOALIGN, &sx);
    if (rc == 0) {
      if ((sx.stx_mask & STATX_DIOALIGN) != 0 && sx.stx_dio_offset_align != 0 &&
          sx.stx_dio_mem_align != 0) {
        return std::max({sx.stx_dio_mem_align, sx.stx_dio_offset_align, kMinDirectAlignment});
      }
      if (std::uint32_t v =
              device_logical_block_size(makedev(sx.stx_dev_major, sx.stx_dev_minor))) {
        return v;
      }
    }
  } catch (...) {
    // Building the sysfs path can only fail for memory; fall through to the safe default.
  }
  return kDefaultAlignment;
}

}  // namespace

File::File(File&& other) noexcept
    : fd_(std::move(other.fd_)),
      direct_(std::exchange(other.direct_, false)),
      alignment_(std::exchange(other.alignment_, kDefaultAlignment)),
      path_(std::move(other.path_)) {}

File& File::operator=(File&& other) noexcept {
  if (this != &other) {
    close().ignore("move-assignment drops the old descriptor; close() first to see errors");
    fd_ = std::move(other.fd_);
    direct_ = std::exchange(other.direct_, false);
    alignment_ = std::exchange(other.alignment_, kDefaultAlignment);
    path_ = std::move(other.path_);
  }
  return *this;
}

File::~File() {
  if (!fd_.valid()) return;
  Status s = close();
  if (!s.ok()) log(LogLevel::kWarning, s.to_string());
}

namespace {

// Opens `name` relative to `dirfd` (AT_FDCWD for a plain path) with `flags`, asking for
// O_DIRECT first where options.direct says so: EINVAL with O_DIRECT means the file system has
// no direct I/O (older tmpfs, some FUSE), and the file is reopened buffered with one notice.
// `shown` is the path errors and notices name.
int open_with_direct_fallback(int dirfd, const char* name, int flags, const FileOptions& options,
                              const std::string& shown, bool& direct) {
  direct = false;
  if (options.direct) {
    const int fd = ::openat(dirfd, name, flags | O_DIRECT, 0600);
    if (fd >= 0) {
      direct = true;
      return fd;
    }
    const int err = errno;
    if (err != EINVAL) throw_errno(err, "open", shown);
    log(LogLevel::kNotice, "O_DIRECT refused for " + shown + " (EINVAL); using buffered I/O");
  }
  const int fd = ::openat(dirfd, name, flags, 0600);
  if (fd < 0) throw_errno(errno, "open", shown);
  return fd;
}

int base_flags(const FileOptions& options) {
  return O_CLOEXEC | (options.read_only ? O_RDONLY : O_RDWR);
}

// Refuses anything but a regular file or a block device behind `fd`, naming what it is: a FIFO,
// socket or character device would block or lose bytes where zinf expects a file.
void require_data_file(int fd, const std::string& shown, const char* op) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw_errno(errno, "fstat", shown);
  if (S_ISREG(st.st_mode) || S_ISBLK(st.st_mode)) return;
  throw IoError(Status::from_errno(S_ISDIR(st.st_mode) ? EISDIR : EINVAL, op, shown)
                    .with_message("not a regular file but " + std::string(file_kind(st.st_mode))));
}

}  // namespace

File File::adopt(int fd, bool direct, std::string shown, const FileOptions& options) {
  File f;  // owns fd from here: a failed preallocation closes it
  f.fd_ = UniqueFd(fd);
  f.direct_ = direct;
  f.path_ = std::move(shown);
  f.alignment_ = direct ? probe_alignment(fd, f.path_) : 1;
  if (options.preallocate_bytes > 0) f.preallocate(options.preallocate_bytes);
  return f;
}

File File::open(const std::string& path, const FileOptions& options) {
  if (path.find('\0') != std::string::npos) {
    throw UsageError("open: the path '" + path.substr(0, path.find('\0')) +
                     "\\0...' has an embedded NUL byte");
  }
  int flags = base_flags(options);
  if (options.create) flags |= O_CREAT;
  if (options.truncate) flags |= O_TRUNC;
  // Non-blocking until the kind is known: opening a FIFO would otherwise wait for a peer
  // forever (and O_NONBLOCK changes nothing for regular files and block devices).
  bool direct = false;
  const int fd = open_with_direct_fallback(AT_FDCWD, path.c_str(), flags | O_NONBLOCK, options,
                                           path, direct);
  UniqueFd owned(fd);
  require_data_file(fd, path, "open");
  const int fl = ::fcntl(fd, F_GETFL);
  if (fl < 0 || ::fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) throw_errno(errno, "fcntl", path);
  return adopt(owned.release(), direct, path, options);
}

File File::from_descriptor(int fd, bool need_read, bool need_write) {
  if (fd < 0) throw UsageError("file descriptor " + std::to_string(fd) + " is not valid");
  std::string shown = "descriptor " + std::to_string(fd);
  // The path the descriptor was opened with, for messages only (nothing is opened by it).
  char target[4096];
  const std::string link = "/proc/self/fd/" + std::to_string(fd);
  const ssize_t n = ::readlink(link.c_str(), target, sizeof(target) - 1);
  if (n > 0) shown += " (" + std::string(target, static_cast<std::size_t>(n)) + ")";
  const int fl = ::fcntl(fd, F_GETFL);
  if (fl < 0) throw_errno(errno, "fcntl", shown);
  const int mode = fl & O_ACCMODE;
  if (need_read && mode == O_WRONLY) {
    throw IoError(Status::from_errno(EBADF, "read", shown)
                      .with_message("the descriptor is open for writing only"));
  }
  if (need_write && mode == O_RDONLY) {
    throw IoError(Status::from_errno(EBADF, "write", shown)
                      .with_message("the descriptor is open for reading only"));
  }
  require_data_file(fd, shown, "fstat");
  // A second descriptor of the same open file: the caller's keeps its flags and stays open.
  const int dup = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (dup < 0) throw_errno(errno, "dup", shown);
  return adopt(dup, (fl & O_DIRECT) != 0, std::move(shown), FileOptions{});
}

File File::create_unnamed(const Dir& dir, std::string_view label, const FileOptions& options) {
  if (options.read_only) throw UsageError("File::create_unnamed: a new file cannot be read-only");
  const std::string shown = dir.path_of(label) + " (unlinked)";
  Status failure;
  bool direct = false;
  UniqueFd fd;
  if (options.direct) {
    fd = dir.open_unnamed(base_flags(options) | O_DIRECT, shown, failure);
    direct = fd.valid();
    if (!direct) {
      // EINVAL with O_DIRECT: this file system has no direct I/O (as open_with_direct_fallback).
      if (failure.sys_errno() != EINVAL) throw IoError(failure);
      log(LogLevel::kNotice, "O_DIRECT refused for " + shown + " (EINVAL); using buffered I/O");
    }
  }
  if (!direct) {
    fd = dir.open_unnamed(base_flags(options), shown, failure);
    if (!fd.valid()) throw IoError(failure);
  }
  return adopt(fd.release(), direct, shown, options);
}

File File::create_exclusive(const Dir& dir, std::string_view name, const FileOptions& options) {
  if (options.read_only) throw UsageError("File::create_exclusive: a new file cannot be read-only");
  const std::string shown = dir.path_of(name);
  const std::string n(name);
  bool direct = false;
  const int fd = open_with_direct_fallback(dir.fd(), n.c_str(),
                                           base_flags(options) | O_CREAT | O_EXCL | O_NOFOLLOW,
                                           options, shown, direct);
  return adopt(fd, direct, shown, options);
}

File File::open_existing(const Dir& dir, std::string_view name, const FileOptions& options) {
  if (options.create || options.truncate) {
    throw UsageError("File::open_existing: create and truncate do not apply");
  }
  const std::string shown = dir.path_of(name);
  const std::string n(name);
  // Opened buffered and non-blocking first (a FIFO would otherwise wait for a writer forever),
  // checked to be a regular file, and only then switched to O_DIRECT: F_SETFL can set it.
  const int fd = ::openat(dir.fd(), n.c_str(), base_flags(options) | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) throw_errno(errno, "open", shown);
  File f;  // owns fd from here
  f.fd_ = UniqueFd(fd);
  f.path_ = shown;
  f.alignment_ = 1;
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw_errno(errno, "fstat", shown);
  if (!S_ISREG(st.st_mode)) {
    throw IoError(Status::from_errno(EINVAL, "open", shown)
                      .with_message("not a regular file but " + std::string(file_kind(st.st_mode)) +
                                    "; zinf only reads files it wrote"));
  }
  const int fl = ::fcntl(fd, F_GETFL);
  if (fl < 0) throw_errno(errno, "fcntl", shown);
  if (::fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) throw_errno(errno, "fcntl", shown);
  if (options.direct) {
    if (::fcntl(fd, F_SETFL, (fl & ~O_NONBLOCK) | O_DIRECT) == 0) {
      f.direct_ = true;
      f.alignment_ = probe_alignment(fd, shown);
    } else if (errno == EINVAL) {
      log(LogLevel::kNotice, "O_DIRECT refused for " + shown + " (EINVAL); using buffered I/O");
    } else {
      throw_errno(errno, "fcntl O_DIRECT", shown);
    }
  }
  return f;
}

bool File::reserve(std::uint64_t offset, std::uint64_t length, const char* op) const {
  int rc;
  do {
    rc = ::fallocate(fd_.get(), 0, static_cast<off_t>(offset), static_cast<off_t>(length));
  } while (rc != 0 && errno == EINTR);
  if (rc == 0) return true;
  if (errno == EOPNOTSUPP) return false;
  throw_errno(errno, op, path_, offset, length);
}

void File::preallocate(std::uint64_t bytes) {
  if (reserve(0, bytes, "preallocate")) return;
  // No fallocate on this file system: at least give the file its size (sparse).
  if (size() < bytes) {
    int rc;
    do {
      rc = ::ftruncate(fd_.get(), static_cast<off_t>(bytes));
    } while (rc != 0 && errno == EINTR);
    if (rc != 0) throw_errno(errno, "preallocate (ftruncate)", path_, 0, bytes);
  }
}

std::uint64_t File::size() const {
  struct stat st {};
  if (::fstat(fd_.get(), &st) != 0) throw_errno(errno, "fstat", path_);
  return static_cast<std::uint64_t>(st.st_size);
}

Status File::sync() const {
  int rc;
  do {
    rc = ::fdatasync(fd_.get());
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) return Status::from_errno(errno, "fdatasync", path_);
  return Status::ok_status();
}

Status File::close() {
  if (!fd_.valid()) return Status::ok_status();
  direct_ = false;
  // Never retried on EINTR (UniqueFd::close): on Linux the descriptor is gone either way.
  if (const int err = fd_.close(); err != 0) return Status::from_errno(err, "close", path_);
  return Status::ok_status();
}

std::uint32_t probe_direct_io_alignment(const std::string& path) noexcept {
  return probe_alignment(-1, path);
}

std::uint32_t probe_direct_io_alignment(const Dir& dir) noexcept {
  return probe_alignment(dir.fd(), dir.path());
}

}  // namespace zinf::swap
