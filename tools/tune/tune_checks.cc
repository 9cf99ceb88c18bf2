// SPDX-License-Identifier: Apache-2.0
// Text of `zinf tune`'s setup warnings; tune_setup.cc gathers the facts.
#include "tune_checks.h"

#include <cstdio>
#include <cstring>

#include "format.h"

namespace zinf::tools {

std::string direct_io_warning(const std::string& dir, const std::string& fs, int err) {
  return "O_DIRECT refused on " + dir + " (" + fs + ": " + std::strerror(err) +
         "): zinf falls back to buffered I/O there, so these figures measure the page cache, "
         "not the drive";
}

std::string memlock_warning(std::uint64_t limit, std::uint64_t pinned_budget) {
  if (limit >= pinned_budget) return {};
  return "memlock limit " + human_bytes(limit) + " (RLIMIT_MEMLOCK) is below the pinned budget " +
         human_bytes(pinned_budget) +
         ": io_uring buffer registration will be refused and I/O runs unregistered; raise it "
         "(ulimit -l, LimitMEMLOCK= in systemd, --ulimit memlock=-1 in docker)";
}

std::string thp_warning(std::string_view line) {
  if (line.find("[never]") == std::string_view::npos) return {};
  return "transparent huge pages are off ([never] in /sys/kernel/mm/transparent_hugepage/"
         "enabled): buffers use 4 KiB pages and 1 MiB transfers are split in two (reads "
         "1.3-2.6x slower on the reference machine)";
}

std::string uring_warning(std::string_view reason) {
  return "io_uring unavailable (" + std::string(reason) + "): only the threads backend is measured";
}

}  // namespace zinf::tools
