// SPDX-License-Identifier: Apache-2.0
// Dir: directories opened once, names resolved relative to them without following links,
// exclusive creation under unpredictable names, durable replacement, flock ownership.
#include "zinf/swap/dir.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "zinf/common/error.h"
#include "zinf/common/log.h"

namespace zinf::swap {
namespace {

constexpr std::string_view kTempPrefix = ".zinf-tmp-";

[[noreturn]] void throw_errno(int err, const std::string& op, const std::string& path) {
  throw IoError(Status::from_errno(err, op, path));
}

// Names handed to the *at() calls must be one component: a '/' would walk out of the
// directory the descriptor pins down.
void check_component(std::string_view name, const char* op) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string_view::npos) {
    throw UsageError(std::string(op) + ": '" + std::string(name) + "' is not a single file name");
  }
}

}  // namespace

Dir Dir::open(const std::string& path) {
  if (path.empty()) {
    throw IoError(
        Status::from_errno(EINVAL, "open directory", path).with_message("empty directory path"));
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw_errno(errno, "open directory", path);
  Dir d;
  d.fd_ = UniqueFd(fd);
  d.path_ = path;
  return d;
}

Dir Dir::open_child(std::string_view name) const {
  check_component(name, "Dir::open_child");
  const std::string n(name);
  const int fd = ::openat(fd_.get(), n.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) throw_errno(errno, "open directory", path_of(name));
  Dir d;
  d.fd_ = UniqueFd(fd);
  d.path_ = path_of(name);
  return d;
}

Dir Dir::reopen() const {
  const int fd = ::openat(fd_.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw_errno(errno, "open directory", path_);
  Dir d;
  d.fd_ = UniqueFd(fd);
  d.path_ = path_;
  return d;
}

Dir Dir::create_child(std::string_view name) const {
  check_component(name, "Dir::create_child");
  const std::string n(name);
  // mkdirat never follows a link at the name: a planted link makes it fail with EEXIST.
  if (::mkdirat(fd(), n.c_str(), 0700) != 0) throw_errno(errno, "create directory", path_of(name));
  return open_child(name);
}

std::string Dir::path_of(std::string_view name) const {
  std::string out = path_;
  if (out.empty() || out.back() != '/') out += '/';
  out += name;
  return out;
}

std::vector<std::string> Dir::list() const {
  // fdopendir takes the descriptor: give it a duplicate so that this Dir keeps its own.
  UniqueFd dup(::fcntl(fd(), F_DUPFD_CLOEXEC, 0));
  if (!dup.valid()) throw_errno(errno, "dup", path_);
  DIR* d = ::fdopendir(dup.get());
  if (d == nullptr) throw_errno(errno, "read directory", path_);
  dup.release();  // the DIR owns it now: closedir closes it
  // The duplicate shares the file position: start from the beginning whoever read it last.
  ::rewinddir(d);
  std::vector<std::string> names;
  errno = 0;
  while (const dirent* e = ::readdir(d)) {
    const std::string_view en = e->d_name;
    if (en != "." && en != "..") names.emplace_back(en);
    errno = 0;
  }
  const int err = errno;
  ::closedir(d);
  if (err != 0) throw_errno(err, "read directory", path_);
  return names;
}

void Dir::sync() const {
  if (::fsync(fd()) != 0) throw_errno(errno, "fsync directory", path_);
}

void Dir::rename(std::string_view from, std::string_view to) const {
  check_component(from, "Dir::rename");
  check_component(to, "Dir::rename");
  const std::string f(from), t(to);
  if (::renameat(fd(), f.c_str(), fd(), t.c_str()) != 0) {
    throw_errno(errno, "rename to " + path_of(to), path_of(from));
  }
}

bool Dir::remove_file(std::string_view name) const {
  check_component(name, "Dir::remove_file");
  const std::string n(name);
  if (::unlinkat(fd(), n.c_str(), 0) == 0) return true;
  if (errno == ENOENT) return false;
  throw_errno(errno, "remove", path_of(name));
}

bool Dir::remove_tree(std::string_view name) const {
  check_component(name, "Dir::remove_tree");
  const std::string n(name);
  struct stat st {};
  if (::fstatat(fd(), n.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT) return false;
    throw_errno(errno, "stat", path_of(name));
  }
  if (!S_ISDIR(st.st_mode)) return remove_file(name);
  {
    Dir child = open_child(name);
    for (const auto& en : child.list()) child.remove_tree(en);
  }
  if (::unlinkat(fd(), n.c_str(), AT_REMOVEDIR) != 0) {
    if (errno == ENOENT) return false;
    throw_errno(errno, "remove directory", path_of(name));
  }
  return true;
}

bool Dir::try_lock() const {
  int rc;
  do {
    rc = ::flock(fd(), LOCK_EX | LOCK_NB);
  } while (rc != 0 && errno == EINTR);
  if (rc == 0) return true;
  if (errno == EWOULDBLOCK) return false;
  throw_errno(errno, "lock directory", path_);
}

std::optional<pid_t> Dir::holder_pid() const {
  struct stat st {};
  if (::fstat(fd(), &st) != 0) return std::nullopt;
  // Lines look like "1: FLOCK  ADVISORY  WRITE 4242 fd:01:1234567 0 EOF"; the device is in
  // hex major:minor, the inode in decimal.
  std::ifstream in("/proc/locks");
  std::string line;
  char want[64];
  std::snprintf(want, sizeof want, "%02x:%02x:%" PRIu64, major(st.st_dev), minor(st.st_dev),
                static_cast<std::uint64_t>(st.st_ino));
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string index, kind, mode, access, dev_ino;
    long pid = 0;
    if (!(words >> index >> kind)) continue;
    if (kind == "->") continue;  // a waiter, not the holder
    if (!(words >> mode >> access >> pid >> dev_ino)) continue;
    if (kind == "FLOCK" && dev_ino == want && pid > 0) return static_cast<pid_t>(pid);
  }
  return std::nullopt;
}

void Dir::lock_or_throw(std::string_view what) const {
  if (try_lock()) return;
  const auto pid = holder_pid();
  const std::string holder =
      pid ? "zinf process " + std::to_string(*pid) : std::string("another zinf process");
  throw IoError(Status::from_errno(EWOULDBLOCK, "lock directory", path_)
                    .with_message("in use by " + holder + " (" + std::string(what) +
                                  "); use another directory or stop that process"));
}

UniqueFd Dir::open_unnamed(int flags, const std::string& shown, Status& failure) const {
  UniqueFd fd(::openat(fd_.get(), ".", flags | O_TMPFILE | O_EXCL, 0600));
  if (fd.valid()) return fd;
  // No O_TMPFILE here (EOPNOTSUPP, or EISDIR from kernels and file systems that predate it): a
  // name nobody can predict, created exclusively and removed straight away.
  if (errno != EOPNOTSUPP && errno != EISDIR) {
    failure = Status::from_errno(errno, "open", shown);
    return fd;
  }
  const std::string name = unique_name(".zinf-tmp-");
  fd.reset(::openat(fd_.get(), name.c_str(), flags | O_CREAT | O_EXCL | O_NOFOLLOW, 0600));
  if (!fd.valid()) {
    failure = Status::from_errno(errno, "open", shown);
    return fd;
  }
  if (::unlinkat(fd_.get(), name.c_str(), 0) != 0) {
    failure = Status::from_errno(errno, "unlink new file", path_of(name));
    fd.reset();
  }
  return fd;
}

std::string unique_name(std::string_view prefix) {
  std::uint64_t bits = 0;
  std::size_t got = 0;
  while (got < sizeof bits) {
    const ssize_t n = ::getrandom(reinterpret_cast<char*>(&bits) + got, sizeof bits - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_errno(errno, "getrandom", "");
    }
    got += static_cast<std::size_t>(n);
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "%d-%016" PRIx64, static_cast<int>(::getpid()), bits);
  return std::string(prefix) + buf;
}

void write_all(int fd, std::string_view data, const std::string& path) {
  std::size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      throw IoError(Status::from_errno(err, "write", path, done, data.size() - done));
    }
    done += static_cast<std::size_t>(n);
  }
}

void create_file_durably(const Dir& dir, std::string_view name, std::string_view text,
                         mode_t mode) {
  check_component(name, "create_file_durably");
  const std::string n(name);
  const std::string shown = dir.path_of(name);
  UniqueFd fd(
      ::openat(dir.fd(), n.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode));
  if (!fd.valid()) throw_errno(errno, "create", shown);
  try {
    write_all(fd.get(), text, shown);
    if (::fsync(fd.get()) != 0) throw_errno(errno, "fsync", shown);
    if (const int err = fd.close(); err != 0) throw_errno(err, "close", shown);
  } catch (...) {
    // Created exclusively above, so the file at that name is ours to remove.
    fd.reset();
    ::unlinkat(dir.fd(), n.c_str(), 0);
    throw;
  }
}

void replace_file_durably(const Dir& dir, std::string_view name, std::string_view text,
                          mode_t mode) {
  check_component(name, "replace_file_durably");
  const std::string tmp = unique_name(kTempPrefix);
  try {
    create_file_durably(dir, tmp, text, mode);
  } catch (const IoError& e) {
    // The user asked for `name`: the error names it (a full disk fails the temporary file).
    const std::string why = e.status().message().empty() ? std::string()
                                                         : e.status().message() + "; ";
    throw IoError(Status(e.status())
                      .with_path(dir.path_of(name))
                      .with_message(why + "writing its temporary file " + tmp + " first"));
  }
  try {
    dir.rename(tmp, name);
  } catch (...) {
    ::unlinkat(dir.fd(), tmp.c_str(), 0);
    throw;
  }
  dir.sync();
}

std::string read_small_file(const Dir& dir, std::string_view name, std::uint64_t max_bytes) {
  check_component(name, "read_small_file");
  const std::string n(name);
  const std::string shown = dir.path_of(name);
  const UniqueFd fd(::openat(dir.fd(), n.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (!fd.valid()) throw_errno(errno, "open", shown);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) throw_errno(errno, "fstat", shown);
  if (!S_ISREG(st.st_mode)) {
    throw IoError(Status::from_errno(EINVAL, "open", shown)
                      .with_message("not a regular file but " + std::string(file_kind(st.st_mode)) +
                                    "; zinf only reads files it wrote"));
  }
  std::string out;
  char buf[8192];
  for (;;) {
    const ssize_t got = ::read(fd.get(), buf, sizeof buf);
    if (got < 0) {
      if (errno == EINTR) continue;
      throw IoError(Status::from_errno(errno, "read", shown, out.size(), sizeof buf));
    }
    if (got == 0) break;
    out.append(buf, static_cast<std::size_t>(got));
    if (out.size() > max_bytes) {
      throw IoError(Status::error(ErrorCode::kCorrupt, "larger than the " +
                                                           std::to_string(max_bytes) +
                                                           " bytes such a file can have")
                        .with_operation("read")
                        .with_path(shown));
    }
  }
  return out;
}

bool is_zinf_temporary(std::string_view name) noexcept { return name.starts_with(kTempPrefix); }

}  // namespace zinf::swap
