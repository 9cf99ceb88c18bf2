// SPDX-License-Identifier: Apache-2.0
// `zinf tune`'s setup checks against this machine (O_DIRECT, memlock, io_uring, huge pages) and
// the free space it sizes its test files by. The warning texts are tune_checks.h's.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "zinf/swap/dir.h"

namespace zinf::tools::tune {

/// The checks run before measuring; each problem is one warning line (also in the report).
/// Sets *uring_ok (io_uring starts here) and *memlock_ok (the memlock limit allows
/// `pinned_budget`, or pinning is not limited).
std::vector<std::string> check_setup(const std::vector<swap::Dir>& dirs,
                                     std::uint64_t pinned_budget, bool* uring_ok, bool* memlock_ok);

/// Bytes free to an unprivileged user in the file system of `dir`; 0 if statvfs fails.
std::uint64_t free_bytes(const std::string& dir);

}  // namespace zinf::tools::tune
