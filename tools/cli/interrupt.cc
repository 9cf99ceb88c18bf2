// SPDX-License-Identifier: Apache-2.0
#include "interrupt.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstring>
#include <string>

namespace zinf::tools {
namespace {

// Lock-free, so reading and writing it from a handler is async-signal-safe.
std::atomic<int> g_signal{0};
static_assert(std::atomic<int>::is_always_lock_free);

constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP};

// The second signal's line, prepared before any handler can run (the handler may only call
// async-signal-safe functions: no formatting, no allocation).
char g_second[3][160];
std::size_t g_second_len[3];

void on_signal(int sig) {
  int expected = 0;
  if (g_signal.compare_exchange_strong(expected, sig)) return;  // the first: stop at a check
  // The second: the command did not stop soon enough for the user. Stop now; every scratch
  // file zinf made has no name, so the kernel drops them with the process.
  for (std::size_t i = 0; i < 3; ++i) {
    if (kSignals[i] == sig) {
      ssize_t ignored = ::write(STDERR_FILENO, g_second[i], g_second_len[i]);
      (void)ignored;
    }
  }
  ::_exit(128 + sig);
}

}  // namespace

std::string signal_name(int signal) {
  switch (signal) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGHUP: return "SIGHUP";
    default: return "signal " + std::to_string(signal);
  }
}

void install_interrupt_handlers(std::string_view command) {
  for (std::size_t i = 0; i < 3; ++i) {
    const std::string line = "zinf " + std::string(command) + ": interrupted by " +
                             signal_name(kSignals[i]) + " (again: stopped at once)\n";
    g_second_len[i] = std::min(line.size(), sizeof g_second[i]);
    std::memcpy(g_second[i], line.data(), g_second_len[i]);
  }
  for (int sig : kSignals) {
    struct sigaction old {};
    if (::sigaction(sig, nullptr, &old) == 0 && old.sa_handler == SIG_IGN) continue;
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    // SA_RESTART: a system call the signal interrupts resumes; the loops poll the flag.
    sa.sa_flags = SA_RESTART;
    ::sigaction(sig, &sa, nullptr);
  }
}

int interrupt_signal() noexcept { return g_signal.load(std::memory_order_relaxed); }

void throw_if_interrupted() {
  if (const int sig = interrupt_signal(); sig != 0) throw Interrupted{sig};
}

}  // namespace zinf::tools
