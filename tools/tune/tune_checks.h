// SPDX-License-Identifier: Apache-2.0
// The warning lines of `zinf tune`'s setup checks, as pure functions of what was found, so
// their exact text is tested without the machine having each problem.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace zinf::tools {

/// The warning for a directory where open(O_DIRECT) failed with `err` on file system `fs`.
std::string direct_io_warning(const std::string& dir, const std::string& fs, int err);
/// The warning when the memlock limit is below the pinned budget, or "" if it is not.
std::string memlock_warning(std::uint64_t limit, std::uint64_t pinned_budget);
/// The warning for /sys/kernel/mm/transparent_hugepage/enabled reading `line`, or "".
std::string thp_warning(std::string_view line);
/// The warning when io_uring cannot start, for `reason`.
std::string uring_warning(std::string_view reason);

}  // namespace zinf::tools
