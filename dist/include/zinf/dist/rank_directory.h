// SPDX-License-Identifier: Apache-2.0
// The per-rank folder of a directory, DeepSpeed's layout: every rank of a job keeps its files
// in `<dir>/rank<R>` (the sharded engine and optimizer, `zinf bench io` under mpirun).
#pragma once

#include <string>

namespace zinf::dist {

/// Returns `dir`/rank<R>, created (0700) if missing. Never followed if it is a link: IoError
/// naming it, as for anything there that is not a directory; IoError too if `dir` cannot be
/// opened. Safe to call from several ranks at once (one creates it, the others open it).
std::string rank_directory(const std::string& dir, int rank);

}  // namespace zinf::dist
