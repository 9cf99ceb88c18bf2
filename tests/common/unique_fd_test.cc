// SPDX-License-Identifier: Apache-2.0
#include "zinf/common/unique_fd.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include <gtest/gtest.h>

namespace zinf {
namespace {

bool is_open(int fd) { return ::fcntl(fd, F_GETFD) != -1; }

TEST(UniqueFd, ClosesWhenDestroyed) {
  int raw = -1;
  {
    UniqueFd fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    ASSERT_TRUE(fd.valid());
    raw = fd.get();
    EXPECT_TRUE(is_open(raw));
  }
  EXPECT_FALSE(is_open(raw));
}

TEST(UniqueFd, NegativeMeansNone) {
  UniqueFd fd(-5);
  EXPECT_FALSE(fd.valid());
  EXPECT_EQ(fd.get(), -1);
  EXPECT_EQ(fd.close(), 0);
}

TEST(UniqueFd, MoveTransfersOwnership) {
  UniqueFd a(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  const int raw = a.get();
  UniqueFd b(std::move(a));
  EXPECT_FALSE(a.valid());  // NOLINT(bugprone-use-after-move): moved-from is empty by contract
  EXPECT_EQ(b.get(), raw);
  UniqueFd c;
  c = std::move(b);
  EXPECT_EQ(c.get(), raw);
  c = std::move(c);  // self-move keeps it
  EXPECT_TRUE(is_open(raw));
  EXPECT_EQ(c.get(), raw);
}

TEST(UniqueFd, ReleaseGivesItUp) {
  UniqueFd fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  const int raw = fd.release();
  EXPECT_FALSE(fd.valid());
  EXPECT_TRUE(is_open(raw));
  ::close(raw);
}

TEST(UniqueFd, ResetAndDestructionKeepErrno) {
  UniqueFd fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  errno = EACCES;  // an error path about to report this
  fd.reset();
  EXPECT_EQ(errno, EACCES);
  {
    UniqueFd other(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    errno = ENOTDIR;
  }
  EXPECT_EQ(errno, ENOTDIR);
}

TEST(UniqueFd, CloseReportsTheError) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  ::close(fds[1]);
  UniqueFd fd(fds[0]);
  EXPECT_EQ(fd.close(), 0);
  EXPECT_FALSE(fd.valid());
  // A descriptor closed behind the owner's back: close() says EBADF.
  UniqueFd stale(fds[0]);
  EXPECT_EQ(stale.close(), EBADF);
}

}  // namespace
}  // namespace zinf
