// SPDX-License-Identifier: Apache-2.0
// LogCapture: the library's log lines, collected while a test runs, so that a test can assert
// what a user would have read on stderr (a notice, a warning naming the file and offset).
#pragma once

#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "zinf/common/log.h"

namespace zinf::test {

/// Collects log lines at `level` and above while it lives.
class LogCapture {
 public:
  explicit LogCapture(LogLevel level = LogLevel::kNotice) : old_level_(log_level()) {
    set_log_level(level);
    old_sink_ = set_log_sink([this](LogLevel l, std::string_view m) {
      std::lock_guard lock(mu_);
      lines_.push_back(std::string(level_tag(l)) + std::string(m));
    });
  }
  ~LogCapture() {
    set_log_sink(std::move(old_sink_));
    set_log_level(old_level_);
  }
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;

  std::vector<std::string> lines() const {
    std::lock_guard lock(mu_);
    return lines_;
  }

 private:
  static const char* level_tag(LogLevel l) {
    switch (l) {
      case LogLevel::kDebug: return "debug: ";
      case LogLevel::kInfo: return "info: ";
      case LogLevel::kNotice: return "notice: ";
      case LogLevel::kWarning: return "warning: ";
      case LogLevel::kError: return "error: ";
    }
    return "";
  }

  LogLevel old_level_;
  LogSink old_sink_;
  mutable std::mutex mu_;
  std::vector<std::string> lines_;
};

}  // namespace zinf::test
