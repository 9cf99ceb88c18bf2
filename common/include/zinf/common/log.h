// SPDX-License-Identifier: Apache-2.0
// Logging for the library: one line per message to a replaceable sink (stderr by default).
// The library never prints to stdout; only tools/ does. Part of zinf::common.
#pragma once

#include <functional>
#include <string_view>

namespace zinf {

enum class LogLevel : int { kDebug = 0, kInfo = 1, kNotice = 2, kWarning = 3, kError = 4 };

/// Receives each message that passes the level filter. Called from any thread, one call at a
/// time (serialised by zinf); must not throw.
using LogSink = std::function<void(LogLevel, std::string_view)>;

/// Writes `message` as one line if `level` passes the threshold. Thread-safe, never throws.
void log(LogLevel level, std::string_view message) noexcept;

/// Sets the minimum level (default kNotice, or ZINF_LOG_LEVEL=debug|info|notice|warning|error).
void set_log_level(LogLevel level) noexcept;
LogLevel log_level() noexcept;

/// Replaces the sink; an empty function restores stderr. Returns the previous sink.
LogSink set_log_sink(LogSink sink);

}  // namespace zinf
