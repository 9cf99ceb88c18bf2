// SPDX-License-Identifier: Apache-2.0
// Dir: a directory zinf creates its own files in, opened once, and the rules that keep zinf
// from touching any file that is not its own. Part of zinf::swap.
//
// Threat model. zinf often runs as root (tuning, huge pages) in directories other users can
// write to (/tmp, a shared scratch drive). A link, FIFO or directory planted at a name zinf
// is about to use must never redirect a write, block a read or be deleted. So:
// - the directory the caller names is opened once (its path followed as given: the caller
//   chose it); every name inside it is resolved relative to that descriptor (openat) and
//   never through a link (O_NOFOLLOW);
// - files zinf creates are created exclusively (O_CREAT|O_EXCL), under names nobody can
//   predict (pid + 64 random bits), or without a name at all (O_TMPFILE);
// - files zinf reads back are opened without following links and refused unless they are
//   regular files (a FIFO would block the open, a device would read forever).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "zinf/common/small_file.h"
#include "zinf/common/status.h"
#include "zinf/common/unique_fd.h"

namespace zinf::swap {

/// A move-only descriptor of an open directory. Thread-safe for concurrent use of its const
/// members (they only pass the descriptor to *at() calls); not for concurrent moves.
class Dir {
 public:
  Dir() = default;
  Dir(Dir&& other) noexcept = default;
  Dir& operator=(Dir&& other) noexcept = default;
  Dir(const Dir&) = delete;
  Dir& operator=(const Dir&) = delete;
  ~Dir() = default;

  /// Opens the directory at `path` (links in `path` followed: it is the caller's choice).
  /// Throws IoError naming the path: ENOENT (does not exist), ENOTDIR, EACCES, or EINVAL for
  /// an empty path (which would otherwise mean the current directory by accident).
  static Dir open(const std::string& path);
  /// Opens subdirectory `name` (one component, no '/') without following a link: a link or a
  /// non-directory there is an IoError (ELOOP / ENOTDIR) naming it.
  Dir open_child(std::string_view name) const;
  /// Creates subdirectory `name` (mode 0700) and opens it. Anything already at that name,
  /// a link included, is an IoError EEXIST naming it: zinf never adopts a directory it did
  /// not create.
  Dir create_child(std::string_view name) const;
  /// A second descriptor of this same directory (openat "."), never through its path: a link
  /// swapped in at path() since cannot redirect it. It has its own open file description, so
  /// its own flock (try_lock), and the same path() for messages. IoError naming path().
  Dir reopen() const;

  bool is_open() const noexcept { return fd_.valid(); }
  int fd() const noexcept { return fd_.get(); }
  const std::string& path() const noexcept { return path_; }
  /// path() + "/" + name, for messages.
  std::string path_of(std::string_view name) const;

  /// The names in this directory (not "." and ".."), in no particular order. Throws IoError
  /// naming the directory.
  std::vector<std::string> list() const;

  /// Opens a new file in this directory that no name points to, with open(2) `flags` (access
  /// mode, O_CLOEXEC, O_DIRECT...; not O_CREAT): O_TMPFILE where the file system has it, else
  /// a file created exclusively under a unique_name() and unlinked at once. Either way it
  /// disappears with its last descriptor and nothing planted here is opened. Logs nothing and
  /// does not throw for the OS's refusals: on failure returns an empty UniqueFd and sets
  /// `failure` (errno kept; an open failure names `shown`, a failed unlink the temporary name),
  /// so that callers for whom a refusal is the answer (an O_DIRECT probe) stay quiet.
  UniqueFd open_unnamed(int flags, const std::string& shown, Status& failure) const;

  /// Makes the directory's entries durable (fsync). Throws IoError naming the directory.
  void sync() const;
  /// Renames entry `from` to `to` inside this directory (renameat; replaces a file at `to`).
  /// Throws IoError naming both.
  void rename(std::string_view from, std::string_view to) const;
  /// Removes entry `name` if it is a file or link (never follows it). Returns false if there
  /// was nothing to remove; throws IoError for any other failure.
  bool remove_file(std::string_view name) const;
  /// Removes subdirectory `name` and everything under it, without following any link inside
  /// (a link is removed, not its target). Returns false if there was nothing to remove;
  /// throws IoError naming the entry that could not be removed.
  bool remove_tree(std::string_view name) const;

  /// Takes an exclusive advisory lock (flock) on this directory for as long as this Dir (or
  /// its moved-to owner) stays open; the kernel drops it when the process dies, so a lock is
  /// never stale. Returns false if another open descriptor (another engine, in this process
  /// or another) holds it; then holder_pid(), where /proc/locks shows it, names the holder.
  bool try_lock() const;
  /// The pid that holds a flock on this directory, read from /proc/locks, if it can be found.
  std::optional<pid_t> holder_pid() const;
  /// try_lock(), or an IoError (EWOULDBLOCK) naming the directory, `what` uses it for, and the
  /// holder's pid where known.
  void lock_or_throw(std::string_view what) const;

 private:
  UniqueFd fd_;
  std::string path_;
};

/// Returns a name no other process or call can predict or reproduce: `prefix` followed by the
/// pid and 64 random bits in hex (getrandom), e.g. "zinf-tmp-4242-9f3a0c1be27d5a11".
std::string unique_name(std::string_view prefix);

/// Writes all of `data` to `fd` at its current position (retries EINTR and short writes).
/// Throws IoError naming `path`, the offset reached and the bytes left.
void write_all(int fd, std::string_view data, const std::string& path);

/// Creates file `name` in `dir` holding `text`, exclusively (anything at that name, a link
/// included, is an IoError EEXIST naming it) and durably (the file fsynced; the directory is
/// the caller's to sync). A failure after the file was created removes it. Throws IoError
/// naming the file, and for a failed write the offset reached and the bytes left.
void create_file_durably(const Dir& dir, std::string_view name, std::string_view text,
                         mode_t mode = 0644);

/// Replaces file `name` in `dir` with `text`, durably and atomically: written to a fresh
/// exclusively-created file under a unique_name(), fsynced, renamed over `name`, and the
/// directory fsynced. A crash leaves either the old or the new file, plus at most a temporary
/// whose name starts with ".zinf-tmp-" (which is_zinf_temporary() recognises). A link at
/// `name` is replaced, never followed. Throws IoError naming the file.
void replace_file_durably(const Dir& dir, std::string_view name, std::string_view text,
                          mode_t mode = 0644);

/// Reads the whole of file `name` in `dir`, at most `max_bytes`: opened without following a
/// link and without blocking, and refused unless it is a regular file (IoError naming it and
/// what it is instead), or larger than max_bytes (kCorrupt).
std::string read_small_file(const Dir& dir, std::string_view name, std::uint64_t max_bytes);

/// True for the names replace_file_durably() gives its temporaries.
bool is_zinf_temporary(std::string_view name) noexcept;

/// What kind of file a stat mode is, in words (common/small_file.h).
using ::zinf::file_kind;

}  // namespace zinf::swap
