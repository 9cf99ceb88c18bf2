// SPDX-License-Identifier: Apache-2.0
// Placeholder until the uring backend lands on this branch.
#include "uring_io_engine.h"

namespace zinf::swap {
std::string uring_probe() { return "uring backend not built yet"; }
}  // namespace zinf::swap
