// SPDX-License-Identifier: Apache-2.0
// Runs a shell command or the built `zinf` tool as a user would and returns its exit status and
// output, for the CLI tests (one copy instead of one per test file).
#pragma once

#include <string>

namespace zinf::test {

struct ToolRun {
  int status = -1;  ///< the exit status, or -1 if the command could not run or was killed
  std::string out;  ///< stdout, and stderr too when merged
};

/// Runs `cmd` with /bin/sh; stderr is merged into `out`, or discarded (merge_stderr false: for
/// output that must be only what the tool prints on stdout, e.g. a JSON summary).
ToolRun run_shell(const std::string& cmd, bool merge_stderr = true);

#ifdef ZINF_TOOL_PATH
/// Runs the zinf tool this test target was built against (ZINF_TOOL_PATH) with `args`.
inline ToolRun run_zinf(const std::string& args, bool merge_stderr = true) {
  return run_shell(std::string(ZINF_TOOL_PATH) + " " + args, merge_stderr);
}
#endif

}  // namespace zinf::test
