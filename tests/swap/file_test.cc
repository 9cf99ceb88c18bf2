// SPDX-License-Identifier: Apache-2.0
// File: open errors name the path and errno, the O_DIRECT fallback logs one notice, the
// alignment probe follows statx/sysfs, preallocation sizes the file, ENOSPC is kNoSpace.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "support/private_tmpfs.h"
#include "support/test_dir.h"
#include "zinf/common/error.h"
#include "zinf/common/log.h"
#include "zinf/swap/file.h"

namespace zinf::swap {
namespace {

// Captures log lines for the life of the object.
class LogCapture {
 public:
  LogCapture() {
    previous_ = set_log_sink([this](LogLevel level, std::string_view line) {
      std::lock_guard lock(mu_);
      lines_.emplace_back(level, std::string(line));
    });
  }
  ~LogCapture() { set_log_sink(std::move(previous_)); }
  std::vector<std::pair<LogLevel, std::string>> lines() {
    std::lock_guard lock(mu_);
    return lines_;
  }

 private:
  std::mutex mu_;
  std::vector<std::pair<LogLevel, std::string>> lines_;
  LogSink previous_;
};

TEST(File, MissingDirectoryIsNotFoundNamingThePath) {
  test::TestDir dir;
  const std::string path = dir.file("no/such/dir/x.swp");
  try {
    File::open(path, FileOptions{.create = true});
    FAIL() << "opened " << path;
  } catch (const IoError& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound);
    EXPECT_EQ(e.sys_errno(), ENOENT);
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("ENOENT"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("open failed"), std::string::npos) << e.what();
  }
}

TEST(File, PathThroughARegularFileIsENOTDIR) {
  test::TestDir dir;
  { File f = File::open(dir.file("plain"), FileOptions{.create = true}); }
  const std::string path = dir.file("plain/x.swp");
  try {
    File::open(path, FileOptions{.create = true});
    FAIL() << "opened " << path;
  } catch (const IoError& e) {
    EXPECT_EQ(e.sys_errno(), ENOTDIR);
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}

// A FIFO at a path the user names must neither block the open (no peer ever comes) nor be
// used as a file: refused at once, naming it and what it is, for reading and for writing.
TEST(File, AFifoIsRefusedWithoutBlocking) {
  test::TestDir dir;
  const std::string path = dir.file("fifo");
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  for (const bool read_only : {true, false}) {
    try {
      File::open(path, FileOptions{.read_only = read_only});
      FAIL() << "opened the FIFO " << path;
    } catch (const IoError& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("FIFO"), std::string::npos) << e.what();
    }
  }
}

TEST(File, APathWithANulByteIsRefusedNotCut) {
  test::TestDir dir;
  const std::string path = dir.file("n.bin") + std::string("\0zzz", 4);
  EXPECT_THROW(File::open(path, FileOptions{.create = true}), UsageError);
  struct stat st {};
  EXPECT_NE(::stat(dir.file("n.bin").c_str(), &st), 0) << "the cut path was created";
}

// The caller's descriptor keeps its flags and stays open; the File closes only its copy.
TEST(File, FromDescriptorUsesTheCallersOpenFileAndLeavesItOpen) {
  test::TestDir dir;
  const std::string path = dir.file("mine");
  const int fd = ::open(path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0);
  const int flags_before = ::fcntl(fd, F_GETFL);
  {
    File f = File::from_descriptor(fd, true, true);
    EXPECT_NE(f.fd(), fd);
    EXPECT_FALSE(f.is_direct());
    EXPECT_NE(f.path().find("descriptor " + std::to_string(fd)), std::string::npos) << f.path();
    EXPECT_NE(f.path().find(path), std::string::npos) << f.path();
    ASSERT_EQ(::pwrite(f.fd(), "abcd", 4, 0), 4);
  }
  EXPECT_EQ(::fcntl(fd, F_GETFL), flags_before);
  char back[4] = {};
  ASSERT_EQ(::pread(fd, back, 4, 0), 4);  // still open, and the bytes are in its file
  EXPECT_EQ(std::string(back, 4), "abcd");
  ::close(fd);
}

TEST(File, FromDescriptorRefusesMissingAccessAndNonFiles) {
  test::TestDir dir;
  const std::string path = dir.file("ro");
  { File f = File::open(path, FileOptions{.create = true}); }
  const int ro = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(ro, 0);
  try {
    File::from_descriptor(ro, false, true);
    FAIL() << "a read-only descriptor was taken for writing";
  } catch (const IoError& e) {
    EXPECT_EQ(e.sys_errno(), EBADF);
    EXPECT_NE(std::string(e.what()).find("reading only"), std::string::npos) << e.what();
  }
  ::close(ro);
  int pipefd[2];
  ASSERT_EQ(::pipe(pipefd), 0);
  try {
    File::from_descriptor(pipefd[0], true, false);
    FAIL() << "a pipe was taken as a file";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("FIFO"), std::string::npos) << e.what();
  }
  ::close(pipefd[0]);
  ::close(pipefd[1]);
  EXPECT_THROW(File::from_descriptor(-1, true, false), UsageError);
}

TEST(File, DirectOpenReportsTheProbedAlignment) {
  test::TestDir dir;
  if (!test::supports_direct_io(dir.path())) GTEST_SKIP() << dir.path() << " refuses O_DIRECT";
  File f = File::open(dir.file("a.swp"), FileOptions{.create = true});
  ASSERT_TRUE(f.is_open());
  EXPECT_TRUE(f.is_direct());
  const std::uint32_t a = f.alignment();
  EXPECT_GE(a, 512u);
  EXPECT_EQ(a & (a - 1), 0u) << a << " is not a power of two";
  EXPECT_EQ(probe_direct_io_alignment(f.path()), a);
  // statx's own figure, where the kernel gives one, is what File uses (at least 512).
  struct statx sx {};
  ASSERT_EQ(::statx(AT_FDCWD, f.path().c_str(), 0, STATX_DIOALIGN, &sx), 0);
  if ((sx.stx_mask & STATX_DIOALIGN) != 0 && sx.stx_dio_offset_align != 0) {
    EXPECT_EQ(a, std::max({sx.stx_dio_mem_align, sx.stx_dio_offset_align, 512u}));
  }
}

TEST(File, BufferedOpenHasNoAlignment) {
  test::TestDir dir;
  File f = File::open(dir.file("b.swp"), FileOptions{.create = true, .direct = false});
  EXPECT_FALSE(f.is_direct());
  EXPECT_EQ(f.alignment(), 1u);
}

TEST(File, RefusedDirectIoFallsBackWithOneNotice) {
  // procfs refuses O_DIRECT with EINVAL, as tmpfs did before Linux 6.6: a real refusal.
  const std::string path = "/proc/self/status";
  LogCapture logs;
  File f = File::open(path, FileOptions{.read_only = true});
  EXPECT_TRUE(f.is_open());
  EXPECT_FALSE(f.is_direct());
  EXPECT_EQ(f.alignment(), 1u);
  auto lines = logs.lines();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0].first, LogLevel::kNotice);
  EXPECT_NE(lines[0].second.find(path), std::string::npos) << lines[0].second;
  char buf[64];
  EXPECT_GT(::pread(f.fd(), buf, sizeof buf, 0), 0);
}

TEST(File, PreallocateSizesAndAllocatesTheFile) {
  test::TestDir dir;
  constexpr std::uint64_t kBytes = 8 << 20;
  File f = File::open(dir.file("p.swp"), FileOptions{.create = true, .preallocate_bytes = kBytes});
  EXPECT_EQ(f.size(), kBytes);
  struct stat st {};
  ASSERT_EQ(::fstat(f.fd(), &st), 0);
  EXPECT_GE(static_cast<std::uint64_t>(st.st_blocks) * 512, kBytes) << "space not allocated";
  // Reopening with truncate empties it.
  File g = File::open(f.path(), FileOptions{.truncate = true});
  EXPECT_EQ(g.size(), 0u);
}

TEST(File, MoveLeavesTheSourceEmptyAndCloseReports) {
  test::TestDir dir;
  File a = File::open(dir.file("m.swp"), FileOptions{.create = true});
  const int fd = a.fd();
  File b = std::move(a);
  EXPECT_FALSE(a.is_open());  // NOLINT(bugprone-use-after-move): checking the moved-from state
  EXPECT_EQ(b.fd(), fd);
  EXPECT_TRUE(b.sync().ok());
  EXPECT_TRUE(b.close().ok());
  EXPECT_FALSE(b.is_open());
  EXPECT_TRUE(b.close().ok());  // closing twice is a no-op
}

TEST(File, PreallocationBeyondTheDeviceIsNoSpace) {
  // A real ENOSPC without filling a shared disk: a 1 MiB private tmpfs asked for 8 MiB.
  test::TestDir dir;
  const std::string mnt = dir.subdir("small");
  ZINF_EXPECT_IN_PRIVATE_TMPFS(mnt, "1m", [&] {
    const std::string path = mnt + "/big.swp";
    try {
      File::open(path, FileOptions{.create = true, .preallocate_bytes = 8 << 20});
      return 1;
    } catch (const IoError& e) {
      if (e.code() != ErrorCode::kNoSpace) return 2;
      if (e.sys_errno() != ENOSPC) return 3;
      const std::string what = e.what();
      if (what.find(path) == std::string::npos) return 4;
      if (what.find("length=8388608") == std::string::npos) return 5;
      return 0;
    }
  });
}

}  // namespace
}  // namespace zinf::swap
