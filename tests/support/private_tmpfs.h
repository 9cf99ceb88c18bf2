// SPDX-License-Identifier: Apache-2.0
// A real ENOSPC (or a disk that frees space later) without filling a shared disk: the check
// runs in a forked child with its own mount namespace and a small tmpfs mounted over a test
// directory. One copy of the fork/unshare/mount/waitpid dance for the tests that need it.
#pragma once

#include <functional>
#include <string>

namespace zinf::test {

/// Exit code of run_with_private_tmpfs when the child cannot unshare or mount (not root, a
/// container without CAP_SYS_ADMIN): the test skips.
inline constexpr int kNoPrivateTmpfs = 77;

/// Forks a child that mounts a tmpfs of `size` ("1m", "64k") at `mountpoint` in a private
/// mount namespace and exits with `check()`'s result (an exception: 6). Returns the child's
/// exit code, or kNoPrivateTmpfs. Fork only where the parent runs no other thread of zinf's.
int run_with_private_tmpfs(const std::string& mountpoint, const std::string& size,
                           const std::function<int()>& check);

}  // namespace zinf::test

/// In a GoogleTest test: runs `check` (an int() callable, 0 for pass) with a private tmpfs of
/// `size` at `mountpoint`; skips where that cannot be set up, else expects exit code 0.
#define ZINF_EXPECT_IN_PRIVATE_TMPFS(mountpoint, size, check)                                 \
  do {                                                                                       \
    const int zinf_code_ = ::zinf::test::run_with_private_tmpfs(mountpoint, size, check);   \
    if (zinf_code_ == ::zinf::test::kNoPrivateTmpfs) {                                       \
      GTEST_SKIP() << "cannot mount a private tmpfs here";                                   \
    }                                                                                        \
    EXPECT_EQ(zinf_code_, 0) << "child check " << zinf_code_ << " failed";                  \
  } while (0)
