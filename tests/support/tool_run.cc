// SPDX-License-Identifier: Apache-2.0
#include "support/tool_run.h"

#include <sys/wait.h>

#include <array>
#include <cstdio>

namespace zinf::test {

ToolRun run_shell(const std::string& cmd, bool merge_stderr) {
  ToolRun r;
  std::FILE* p = ::popen((cmd + (merge_stderr ? " 2>&1" : " 2>/dev/null")).c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 4096> buf{};
  std::size_t n = 0;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int st = ::pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

}  // namespace zinf::test
