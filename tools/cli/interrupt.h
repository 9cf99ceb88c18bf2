// SPDX-License-Identifier: Apache-2.0
// How every zinf command stops on SIGINT, SIGTERM or SIGHUP: the handler only records the
// signal; the command's long loops check it at points where stopping is safe and unwind (so
// every destructor runs: engines drain their requests, files close, any named file is
// removed), and main prints one line and exits with 128 + the signal's number. A second
// signal stops the process at once (_exit from the handler): the kernel drops zinf's
// unnamed scratch files with their descriptors, so nothing is left behind either way.
#pragma once

#include <string_view>

namespace zinf::tools {

/// Thrown by throw_if_interrupted(). Deliberately not a std::exception: the commands' own
/// `catch (const std::exception&)` (stress judging failures, parsers) must not absorb it.
struct Interrupted {
  int signal = 0;
};

/// Installs the handlers for SIGINT, SIGTERM and SIGHUP (a signal the parent set to be ignored,
/// e.g. SIGHUP under nohup, stays ignored). `command` names the command in the message a
/// second signal prints ("zinf <command>: interrupted by SIGINT").
void install_interrupt_handlers(std::string_view command);

/// The first of those signals received, or 0. Safe from any thread.
int interrupt_signal() noexcept;
inline bool interrupted() noexcept { return interrupt_signal() != 0; }

/// Throws Interrupted if a signal was received.
void throw_if_interrupted();

/// "SIGINT", "SIGTERM", "SIGHUP", or "signal N".
std::string signal_name(int signal);

}  // namespace zinf::tools
