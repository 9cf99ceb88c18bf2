// SPDX-License-Identifier: Apache-2.0
#include "format.h"

#include <cstdio>

namespace zinf::tools {

std::string mib(std::uint64_t bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return b;
}

std::string human_bytes(std::uint64_t bytes) {
  char b[32];
  if (bytes >= (std::uint64_t{1} << 30)) {
    std::snprintf(b, sizeof b, "%.1f GiB", static_cast<double>(bytes) / (1u << 30));
  } else if (bytes >= (std::uint64_t{1} << 20)) {
    std::snprintf(b, sizeof b, "%.0f MiB", static_cast<double>(bytes) / (1u << 20));
  } else {
    std::snprintf(b, sizeof b, "%llu bytes", static_cast<unsigned long long>(bytes));
  }
  return b;
}

std::string decimal_bytes(double bytes) {
  char b[32];
  if (bytes >= 1e9) {
    std::snprintf(b, sizeof b, "%.2f GB", bytes / 1e9);
  } else {
    std::snprintf(b, sizeof b, "%.1f MB", bytes / 1e6);
  }
  return b;
}

std::string figures_text(const std::vector<double>& figures) {
  std::string text;
  for (double f : figures) {
    char b[16];
    std::snprintf(b, sizeof b, "%.2f ", f);
    text += b;
  }
  return text;
}

}  // namespace zinf::tools
