// SPDX-License-Identifier: Apache-2.0
// `zinf tune`'s setup checks against this machine (tune_setup.h).
#include "tune_setup.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/statvfs.h>

#include <cstdlib>
#include <exception>
#include <fstream>

#include "bench_common.h"
#include "scratch.h"
#include "tune_checks.h"
#include "zinf/swap/io_engine.h"

namespace zinf::tools::tune {
namespace {

bool has_cap_ipc_lock() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("CapEff:", 0) == 0) {
      unsigned long long caps = std::strtoull(line.c_str() + 7, nullptr, 16);
      return (caps >> 14) & 1u;  // CAP_IPC_LOCK = 14
    }
  }
  return false;
}

}  // namespace

std::vector<std::string> check_setup(const std::vector<swap::Dir>& dirs,
                                     std::uint64_t pinned_budget, bool* uring_ok,
                                     bool* memlock_ok) {
  std::vector<std::string> w;
  for (const auto& d : dirs) {
    // A quiet probe (File::create_unnamed would log its own fallback notice), without a name:
    // nothing planted in the directory is opened, and nothing is left if zinf is killed.
    int err = 0;
    if (!open_unnamed_probe(d, O_DIRECT, err).valid()) {
      w.push_back(direct_io_warning(d.path(), fs_type_name(d.path()), err));
    }
  }
  struct rlimit rl {};
  *memlock_ok = true;
  if (::getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
      !has_cap_ipc_lock()) {
    std::string m = memlock_warning(rl.rlim_cur, pinned_budget);
    if (!m.empty()) {
      *memlock_ok = false;
      w.push_back(m);
    }
  }
  *uring_ok = true;
  try {
    swap::IoOptions o;
    o.kind = swap::IoEngineKind::kUring;
    o.queue_depth = 4;
    (void)swap::make_io_engine(o);
  } catch (const std::exception& e) {
    *uring_ok = false;
    std::string why = swap::io_uring_unavailable_reason();
    w.push_back(uring_warning(why.empty() ? std::string(e.what()) : why));
  }
  std::ifstream thp("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string mode;
  std::getline(thp, mode);
  std::string t = thp_warning(mode);
  if (!t.empty()) w.push_back(t);
  return w;
}

std::uint64_t free_bytes(const std::string& dir) {
  struct statvfs s {};
  if (::statvfs(dir.c_str(), &s) != 0) return 0;
  return static_cast<std::uint64_t>(s.f_bavail) * s.f_frsize;
}

}  // namespace zinf::tools::tune
