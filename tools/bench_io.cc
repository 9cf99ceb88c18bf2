// SPDX-License-Identifier: Apache-2.0
// Placeholder until the branch that implements it lands.
#include "commands.h"
#include "zinf/common/error.h"
namespace zinf::tools {
int bench_io_main(const std::vector<std::string>&) { throw UsageError("not built yet"); }
}  // namespace zinf::tools
