// SPDX-License-Identifier: Apache-2.0
// How the commands' reports write bytes and per-run figures: one place for each format, so the
// same quantity reads the same in every command.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace zinf::tools {

/// "12.5 MiB": bytes in MiB with one decimal.
std::string mib(std::uint64_t bytes);
/// "1.5 GiB" at or above 1 GiB, else "8 MiB" (rounded), else "512 bytes".
std::string human_bytes(std::uint64_t bytes);
/// "1.23 GB" at or above 10^9 bytes, else "45.6 MB" (powers of 1000).
std::string decimal_bytes(double bytes);
/// "3.10 3.12 3.08 ": each figure with two decimals and a space after it (a table's last
/// column: the figure of every run behind a median).
std::string figures_text(const std::vector<double>& figures);

}  // namespace zinf::tools
