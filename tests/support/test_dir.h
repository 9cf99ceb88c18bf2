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

}  // namespace zinf::test
