// SPDX-License-Identifier: Apache-2.0
// Starts the zinf tool as a separate process that a test can signal, and the adversary's
// moves around it: links planted at the names the tool might use (including names that embed
// its pid, known before it runs), a signal sent at a random moment of its run, and a look at
// what it left in its directory.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace zinf::test {

/// A running tool. Its stdout and stderr go together to an unnamed memory file.
struct ToolProcess {
  pid_t pid = -1;
  int out_fd = -1;
};

/// How a ToolProcess ended.
struct ToolEnd {
  int status = -1;  ///< exit status, or -1 if killed by a signal
  int signal = 0;   ///< the signal that killed it, or 0
  std::string out;  ///< stdout and stderr
};

/// Starts `tool` with `args` (no shell), with SIGINT, SIGTERM and SIGHUP at their default
/// dispositions and unblocked, as from a terminal, even where this test runs with them ignored.
/// `before_exec(pid)` runs in the parent once the child exists and before it executes the tool,
/// so a name that embeds the tool's pid can be planted first. Fails the test (ADD_FAILURE) and
/// returns pid -1 if the process cannot be started.
ToolProcess spawn_tool(const std::string& tool, const std::vector<std::string>& args,
                       const std::function<void(pid_t)>& before_exec = {});

/// Waits for the process to end and collects its output.
ToolEnd wait_tool(ToolProcess& p);

/// Waits (up to `timeout_ms`) until the process has a handler installed for `sig` (its
/// /proc/<pid>/status SigCgt): from then on, a signal reaches the tool's own code, not the
/// default action at start-up. False if it ended or the time ran out.
bool wait_for_handler(pid_t pid, int sig, int timeout_ms);

/// A run of `tool args` ended by `sig`, sent a random delay after the tool installed its
/// handlers. The delay is drawn in [min_ms, max_ms) from `seed`; the test prints both.
struct SignalledRun {
  ToolEnd end;
  pid_t pid = -1;
  int delay_ms = 0;
};
SignalledRun run_and_signal(const std::string& tool, const std::vector<std::string>& args, int sig,
                            int min_ms, int max_ms, std::uint64_t seed);

/// The seed for run_and_signal's delays: ZINF_TEST_SEED if set, else drawn (and either way
/// printed on stdout, so that a failing delay can be replayed).
std::uint64_t signal_test_seed();

/// How a run_bounded command ended: `ended` false if it still ran at the limit (it was then
/// killed with SIGKILL and reaped); `status` is waitpid's status either way.
struct BoundedRun {
  bool ended = false;
  int status = 0;
  std::chrono::milliseconds took{0};
};

/// Runs `args` (args[0] found on PATH, no shell, stdout and stderr inherited) and waits for it
/// up to `limit`, polling every `poll` rather than blocking in waitpid, so that a hang (what the
/// MPI fault tests exist to catch) ends in a killed process and a clear message instead of the
/// ctest timeout. Fails the test (ADD_FAILURE) and returns ended = false if it cannot start.
BoundedRun run_bounded(const std::vector<std::string>& args, std::chrono::seconds limit,
                       std::chrono::milliseconds poll);

/// The entries of `dir` (without . and ..), sorted.
std::vector<std::string> dir_entries(const std::string& dir);

/// The files an adversary points links at: `existing` holds `content`, `absent` does not exist
/// (a link to it catches an open with O_CREAT that follows links). Both lie in their own
/// directory outside the tool's.
struct Victims {
  std::string dir;
  std::string existing;
  std::string absent;
  std::string content;
};
Victims make_victims(const std::string& dir);
/// Plants a link in `dir` at each of `names`: the even ones to v.existing, the odd ones to
/// v.absent.
void plant_links(const std::string& dir, const std::vector<std::string>& names, const Victims& v);
/// Empty if both victims are as made; otherwise what changed.
std::string victims_changed(const Victims& v);

/// The link tests' common body for a command whose only name of its own in its directory was
/// the write probe: runs `tool args` with "--dir <parent>/work" after `args`, planting links
/// (to victims under <parent>/victims) at `.zinf-write-probe-<pid>` between fork and exec,
/// and expects exit status 0, both victims unchanged and nothing in the directory but the
/// planted link.
void expect_follows_no_probe_link(const std::string& tool, std::vector<std::string> args,
                                  const std::string& parent);

/// The signal tests' common body. For each of SIGINT, SIGTERM, SIGHUP and SIGKILL, runs
/// `tool command args --dir D` (D a fresh directory under `parent`), sends the signal a random
/// delay in [min_ms, max_ms) after start-up (seeded by signal_test_seed()) and expects: exit
/// status 128 + signal and "zinf <command>: interrupted by SIG..." on stderr (SIGKILL: killed),
/// and D empty afterwards: every file a command makes there has no name, so not even SIGKILL
/// can leave one behind.
void expect_signals_stop_cleanly(const std::string& tool, const std::string& command,
                                 const std::vector<std::string>& args, const std::string& parent,
                                 int min_ms, int max_ms);

}  // namespace zinf::test
