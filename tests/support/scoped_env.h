// SPDX-License-Identifier: Apache-2.0
// ScopedEnv: an environment variable set for one scope and restored after, for tests of what
// the library reads from the environment when an object is built.
#pragma once

#include <cstdlib>
#include <optional>
#include <string>

namespace zinf::test {

/// Sets `name` to `value` while it lives; restores the old value, or unsets it, after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

}  // namespace zinf::test
