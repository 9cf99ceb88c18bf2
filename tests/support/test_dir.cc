// SPDX-License-Identifier: Apache-2.0
#include "support/test_dir.h"

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include <gtest/gtest.h>

namespace zinf::test {

namespace {

std::string default_parent() {
  const char* env = std::getenv("ZINF_TEST_DIR");
  return env != nullptr && *env != '\0' ? env : std::filesystem::temp_directory_path().string();
}

}  // namespace

TestDir::TestDir() : TestDir(default_parent()) {}

TestDir::TestDir(const std::string& parent) {
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

bool supports_reflink(const std::string& dir, std::string& why) {
  const std::string src_path = dir + "/.zinf-reflink-probe-src";
  const std::string dst_path = dir + "/.zinf-reflink-probe-dst";
  const int src = ::open(src_path.c_str(), O_CREAT | O_TRUNC | O_RDWR, 0600);
  if (src < 0) {
    why = "cannot create a file in " + dir + ": " + std::strerror(errno);
    return false;
  }
  const int dst = ::open(dst_path.c_str(), O_CREAT | O_TRUNC | O_RDWR, 0600);
  std::vector<char> block(4096, 'z');
  bool ok = false;
  if (dst < 0) {
    why = "cannot create a file in " + dir + ": " + std::strerror(errno);
  } else if (::write(src, block.data(), block.size()) != static_cast<ssize_t>(block.size())) {
    why = "cannot write a file in " + dir + ": " + std::strerror(errno);
  } else if (::ioctl(dst, FICLONE, src) != 0) {
    why = "FICLONE does not work in " + dir + ": " + std::strerror(errno);
  } else {
    ok = true;
  }
  if (dst >= 0) ::close(dst);
  ::close(src);
  ::unlink(dst_path.c_str());
  ::unlink(src_path.c_str());
  return ok;
}

std::string reflink_test_dir(std::string& why) {
  const char* env = std::getenv("ZINF_TEST_REFLINK_DIR");
  if (env == nullptr || *env == '\0') {
    why =
        "ZINF_TEST_REFLINK_DIR is not set (scripts/test.sh sets it, as root, to a loop-mounted "
        "XFS image)";
    return "";
  }
  if (!supports_reflink(env, why)) return "";
  return env;
}

}  // namespace zinf::test
