// SPDX-License-Identifier: Apache-2.0
// A temporary directory per test, removed afterwards. ZINF_TEST_DIR points the parent at a
// real NVMe file system; the default is the system temp directory.
#pragma once

#include <string>

namespace zinf::test {

class TestDir {
 public:
  /// Creates <parent>/zinf-<test name>-XXXXXX. Fails the test (ADD_FAILURE) if it cannot.
  TestDir();
  /// Creates <parent>/zinf-<test name>-XXXXXX (e.g. on a file system a test needs).
  explicit TestDir(const std::string& parent);
  ~TestDir();  ///< removes the tree
  TestDir(const TestDir&) = delete;
  TestDir& operator=(const TestDir&) = delete;

  const std::string& path() const { return path_; }
  /// path()/name
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  /// Creates and returns path()/name as a directory.
  std::string subdir(const std::string& name) const;

 private:
  std::string path_;
};

/// True if files under `dir` accept O_DIRECT (tmpfs does not).
bool supports_direct_io(const std::string& dir);

/// True if a file under `dir` can be cloned into another there with ioctl(FICLONE) (XFS
/// with reflink, btrfs; not ext4 or tmpfs); else false with the reason in `why`.
bool supports_reflink(const std::string& dir, std::string& why);

/// The directory ZINF_TEST_REFLINK_DIR names (scripts/test.sh mounts a small XFS image there
/// where it runs as root), if it is set and supports_reflink(); else "" with the reason in
/// `why`, for a test that needs reflinks to skip with.
std::string reflink_test_dir(std::string& why);

}  // namespace zinf::test
