// SPDX-License-Identifier: Apache-2.0
// The zinf tool's subcommands. Each takes the tokens after its name and returns the exit
// status; a UsageError escaping it becomes "zinf <cmd>: error: ..." and status 2.
#pragma once

#include <string>
#include <vector>

namespace zinf::tools {

int bench_io_main(const std::vector<std::string>& args);
int bench_adam_main(const std::vector<std::string>& args);
int bench_prefetch_main(const std::vector<std::string>& args);
int bench_step_main(const std::vector<std::string>& args);
int bench_h2d_main(const std::vector<std::string>& args);
int demo_main(const std::vector<std::string>& args);
int stress_main(const std::vector<std::string>& args);
int plan_main(const std::vector<std::string>& args);
int tune_main(const std::vector<std::string>& args);

}  // namespace zinf::tools
