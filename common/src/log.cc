// SPDX-License-Identifier: Apache-2.0
// The log sink and level, and the abort path of ZINF_CHECK.
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "zinf/common/check.h"
#include "zinf/common/log.h"

namespace zinf {
namespace {

LogLevel level_from_env() noexcept {
  const char* v = std::getenv("ZINF_LOG_LEVEL");
  if (v == nullptr) return LogLevel::kNotice;
  if (std::strcmp(v, "debug") == 0) return LogLevel::kDebug;
  if (std::strcmp(v, "info") == 0) return LogLevel::kInfo;
  if (std::strcmp(v, "warning") == 0) return LogLevel::kWarning;
  if (std::strcmp(v, "error") == 0) return LogLevel::kError;
  return LogLevel::kNotice;
}

struct LogState {
  std::atomic<int> level{static_cast<int>(level_from_env())};
  std::mutex mu;
  LogSink sink;
};

LogState& state() {
  static LogState s;  // never destroyed before last use: function-local static
  return s;
}

const char* level_name(LogLevel l) {
  switch (l) {
    case LogLevel::kDebug: return "debug";
    case LogLevel::kInfo: return "info";
    case LogLevel::kNotice: return "notice";
    case LogLevel::kWarning: return "warning";
    case LogLevel::kError: return "error";
  }
  return "log";
}

}  // namespace

void log(LogLevel level, std::string_view message) noexcept {
  LogState& s = state();
  if (static_cast<int>(level) < s.level.load(std::memory_order_relaxed)) return;
  try {
    std::lock_guard lock(s.mu);
    if (s.sink) {
      s.sink(level, message);
      return;
    }
    std::fprintf(stderr, "zinf %s: %.*s\n", level_name(level), static_cast<int>(message.size()),
                 message.data());
  } catch (...) {
    // Logging must never take the caller down.
  }
}

void set_log_level(LogLevel level) noexcept {
  state().level.store(static_cast<int>(level), std::memory_order_relaxed);
}

LogLevel log_level() noexcept { return static_cast<LogLevel>(state().level.load()); }

LogSink set_log_sink(LogSink sink) {
  LogState& s = state();
  std::lock_guard lock(s.mu);
  LogSink old = std::move(s.sink);
  s.sink = std::move(sink);
  return old;
}

namespace detail {
void check_failed(const char* expr, const char* msg, const char* file, int line) noexcept {
  std::fprintf(stderr, "zinf: internal check failed at %s:%d: %s (%s)\n", file, line, msg, expr);
  std::fflush(stderr);
  std::abort();
}
}  // namespace detail

}  // namespace zinf
