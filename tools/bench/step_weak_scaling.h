// SPDX-License-Identifier: Apache-2.0
// `zinf bench step` under mpirun: weak scaling of the sharded optimizer.
#pragma once

#include <cstdint>

#include "zinf/dist/collectives.h"
#include "zinf/optim/optimizer.h"

namespace zinf::tools {

// Weak scaling under mpirun: one group of N x numel parameters, sharded over the N ranks (each
// updates numel of them in its own <dir>/rank<R>), against rank 0 stepping an optimizer of
// numel parameters alone. Rank 0 prints the report (--json: one object); returns the exit
// status (0). Collective: every rank of `comm` calls it.
int run_weak_scaling(const optim::OptimizerOptions& o, std::uint64_t numel, std::uint64_t steps,
                     bool json, dist::Collectives& comm);

}  // namespace zinf::tools
