// SPDX-License-Identifier: Apache-2.0
#include "support/test_dir.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include <gtest/gtest.h>

namespace zinf::test {

TestDir::TestDir() {
  const char* env = std::getenv("ZINF_TEST_DIR");
  std::string parent =
      env != nullptr && *env != '\0' ? env : std::filesystem::temp_directory_path().string();
  std::string name = "zinf-test";
  if (const auto* info = ::testing::UnitTest::GetInstance()->current_test_info()) {
    name = std::string("zinf-") + info->test_suite_name() + "-" + info->name();
    for (char& c : name) {
      if (c == '/') c = '_';
    }
  }
  std::string templ = parent + "/" + name + "-XXXXXX";
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  if (::mkdtemp(buf.data()) == nullptr) {
    ADD_FAILURE() << "mkdtemp " << templ << " failed: " << std::strerror(errno);
    return;
  }
  path_ = buf.data();
}

TestDir::~TestDir() {
  if (path_.empty()) return;
  std::error_code ec;
  std::filesystem::permissions(path_, std::filesystem::perms::owner_all,
                               std::filesystem::perm_options::add, ec);
  std::filesystem::remove_all(path_, ec);
}

std::string TestDir::subdir(const std::string& name) const {
  std::string p = file(name);
  std::filesystem::create_directories(p);
  return p;
}

bool supports_direct_io(const std::string& dir) {
  std::string p = dir + "/.zinf-direct-probe";
  int fd = ::open(p.c_str(), O_CREAT | O_RDWR | O_DIRECT, 0600);
  if (fd < 0) {
    fd = ::open(p.c_str(), O_CREAT | O_RDWR, 0600);
    if (fd >= 0) ::close(fd);
    ::unlink(p.c_str());
    return false;
  }
  ::close(fd);
  ::unlink(p.c_str());
  return true;
}

}  // namespace zinf::test
