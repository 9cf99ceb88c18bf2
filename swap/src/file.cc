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

namespace zinf::swap {
namespace {

constexpr std::uint32_t kMinDirectAlignment = 512;   // the smallest logical block size there is
constexpr std::uint32_t kDefaultAlignment = 4096;    // safe for every device when nothing says

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
      if (std::uint32_t v = device_logical_block_size(makedev(sx.stx_dev_major, sx.stx_dev_minor))) {
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
    : fd_(std::exchange(other.fd_, -1)),
      direct_(std::exchange(other.direct_, false)),
      alignment_(std::exchange(other.alignment_, kDefaultAlignment)),
      path_(std::move(other.path_)) {}

File& File::operator=(File&& other) noexcept {
  if (this != &other) {
    close().ignore("move-assignment drops the old descriptor; close() first to see errors");
    fd_ = std::exchange(other.fd_, -1);
    direct_ = std::exchange(other.direct_, false);
    alignment_ = std::exchange(other.alignment_, kDefaultAlignment);
    path_ = std::move(other.path_);
  }
  return *this;
}

File::~File() {
  if (fd_ < 0) return;
  Status s = close();
  if (!s.ok()) log(LogLevel::kWarning, s.to_string());
}

File File::open(const std::string& path, const FileOptions& options) {
  int flags = O_CLOEXEC | (options.read_only ? O_RDONLY : O_RDWR);
  if (options.create) flags |= O_CREAT;
  if (options.truncate) flags |= O_TRUNC;
  File f;
  f.path_ = path;
  int fd = -1;
  if (options.direct) {
    fd = ::open(path.c_str(), flags | O_DIRECT, 0600);
    if (fd < 0) {
      const int err = errno;
      if (err != EINVAL) throw_errno(err, "open", path);
      // EINVAL with O_DIRECT: this file system has no direct I/O (older tmpfs, some FUSE).
      log(LogLevel::kNotice, "O_DIRECT refused for " + path + " (EINVAL); using buffered I/O");
    } else {
      f.direct_ = true;
    }
  }
  if (fd < 0) {
    fd = ::open(path.c_str(), flags, 0600);
    if (fd < 0) throw_errno(errno, "open", path);
  }
  f.fd_ = fd;
  f.alignment_ = f.direct_ ? probe_alignment(fd, path) : 1;

  if (options.preallocate_bytes > 0) {
    const auto length = static_cast<off_t>(options.preallocate_bytes);
    int rc;
    do {
      rc = ::fallocate(fd, 0, 0, length);
    } while (rc != 0 && errno == EINTR);
    if (rc != 0) {
      const int err = errno;
      if (err != EOPNOTSUPP) throw_errno(err, "preallocate", path, 0, options.preallocate_bytes);
      // No fallocate on this file system: at least give the file its size (sparse).
      if (f.size() < options.preallocate_bytes) {
        do {
          rc = ::ftruncate(fd, length);
        } while (rc != 0 && errno == EINTR);
        if (rc != 0) throw_errno(errno, "preallocate (ftruncate)", path, 0, options.preallocate_bytes);
      }
    }
  }
  return f;
}

std::uint64_t File::size() const {
  struct stat st {};
  if (::fstat(fd_, &st) != 0) throw_errno(errno, "fstat", path_);
  return static_cast<std::uint64_t>(st.st_size);
}

Status File::sync() const {
  int rc;
  do {
    rc = ::fdatasync(fd_);
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) return Status::from_errno(errno, "fdatasync", path_);
  return Status::ok_status();
}

Status File::close() {
  if (fd_ < 0) return Status::ok_status();
  const int fd = std::exchange(fd_, -1);
  direct_ = false;
  // Never retry close on EINTR: on Linux the descriptor is gone either way.
  if (::close(fd) != 0) return Status::from_errno(errno, "close", path_);
  return Status::ok_status();
}

std::uint32_t probe_direct_io_alignment(const std::string& path) noexcept {
  return probe_alignment(-1, path);
}

}  // namespace zinf::swap
