// SPDX-License-Identifier: Apache-2.0
// File: the one owner of a data file's descriptor, opened for direct I/O where the file system
// allows it, with the alignment that direct I/O needs. Part of zinf::swap.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "zinf/common/status.h"
#include "zinf/common/unique_fd.h"

namespace zinf::swap {

class Dir;

/// How File::open treats the file.
struct FileOptions {
  bool create = false;     ///< create if missing (mode 0600)
  bool truncate = false;   ///< truncate to zero on open
  bool read_only = false;  ///< open O_RDONLY instead of O_RDWR
  bool direct = true;      ///< ask for O_DIRECT; falls back to buffered with one notice
  std::uint64_t preallocate_bytes = 0;  ///< fallocate this many bytes (0: none)
};

/// A move-only open file. Thread-safe for concurrent positional I/O (the descriptor is never
/// moved while in use); not for concurrent open/close.
class File {
 public:
  File() = default;
  File(File&& other) noexcept;
  File& operator=(File&& other) noexcept;
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  ~File();  ///< closes; a close error is logged (use close() to see it)

  /// Opens `path`. If O_DIRECT is refused (EINVAL: tmpfs, some FUSE), reopens buffered and
  /// logs one notice naming the path. Throws zinf::IoError (path, errno) on failure, including
  /// ENOSPC from preallocation.
  /// A FIFO, socket or character device at `path` is refused with an IoError naming it
  /// (opened non-blocking first, so a FIFO never blocks), as is a path with an embedded NUL
  /// (UsageError).
  static File open(const std::string& path, const FileOptions& options);
  /// A second descriptor (dup) of the caller's open file `fd`, which keeps its flags and stays
  /// open and the caller's: closing the File closes only the copy. O_DIRECT and the alignment
  /// come from the descriptor's own flags (nothing is changed on it). IoError naming the
  /// descriptor and its path when it is not open, not a regular file or block device, or lacks
  /// the access asked for (need_read, need_write).
  static File from_descriptor(int fd, bool need_read, bool need_write);
  /// Creates a data file in `dir` that no name points to: O_TMPFILE where the file system has
  /// it, else a file created exclusively under a unique_name() and unlinked at once. Either
  /// way it disappears with its last descriptor, so a killed process leaves nothing behind and
  /// no link or file planted in `dir` is ever opened. path() is "<dir>/<label> (unlinked)", for
  /// messages. options.create/truncate are implied; the rest as open().
  static File create_unnamed(const Dir& dir, std::string_view label, const FileOptions& options);
  /// Creates file `name` in `dir` exclusively and without following a link (O_CREAT|O_EXCL|
  /// O_NOFOLLOW): anything already at that name is an IoError EEXIST naming it.
  static File create_exclusive(const Dir& dir, std::string_view name, const FileOptions& options);
  /// Opens the existing file `name` in `dir` without following a link and without blocking
  /// (a FIFO), and refuses anything but a regular file with an IoError naming it and what it
  /// is. options.create/truncate must be false.
  static File open_existing(const Dir& dir, std::string_view name, const FileOptions& options);

  bool is_open() const noexcept { return fd_.valid(); }
  int fd() const noexcept { return fd_.get(); }
  const std::string& path() const noexcept { return path_; }
  /// True when the descriptor has O_DIRECT.
  bool is_direct() const noexcept { return direct_; }
  /// The alignment that buffer address, offset and length must have for I/O on this file:
  /// statx STATX_DIOALIGN where the kernel reports it, else the device's logical block size,
  /// else 4096. 1 for buffered files (any alignment works), though zinf still uses 4096.
  std::uint32_t alignment() const noexcept { return alignment_; }
  /// Returns the current size in bytes (fstat). Throws IoError.
  std::uint64_t size() const;

  /// Allocates the blocks of [offset, offset + length) (fallocate, mode 0: the file grows to
  /// cover it), so that later writes there cannot fail for space. Returns false, changing
  /// nothing, where the file system has no fallocate (EOPNOTSUPP); throws IoError naming the
  /// file, the range and the errno (kNoSpace for a full drive) with operation `op` otherwise.
  bool reserve(std::uint64_t offset, std::uint64_t length, const char* op = "reserve") const;

  /// Flushes data to stable storage (fdatasync).
  Status sync() const;
  /// Closes and reports the close error, if any. The File is empty afterwards.
  Status close();

 private:
  // Takes ownership of `fd` (closed if this throws), probes its alignment and
  // preallocates as `options` says.
  static File adopt(int fd, bool direct, std::string shown, const FileOptions& options);
  void preallocate(std::uint64_t bytes);

  UniqueFd fd_;
  bool direct_ = false;
  std::uint32_t alignment_ = 4096;
  std::string path_;
};

/// Returns the direct-I/O alignment of files under `path` (file or directory) as File does.
std::uint32_t probe_direct_io_alignment(const std::string& path) noexcept;
/// The same for files in the open directory `dir` (no second lookup of its path).
std::uint32_t probe_direct_io_alignment(const Dir& dir) noexcept;

}  // namespace zinf::swap
