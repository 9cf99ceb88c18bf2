// SPDX-License-Identifier: Apache-2.0
#include "launch.h"

#include <chrono>
#include <cstdlib>
#include <exception>
#include <thread>

#if ZINF_TOOLS_HAVE_MPI
#include <mpi.h>
#endif

#include "zinf/common/error.h"
#include "zinf/dist/mpi_collectives.h"

namespace zinf::tools {

#if ZINF_TOOLS_HAVE_MPI
namespace {
constexpr auto kAbortGrace = std::chrono::seconds(2);
}  // namespace
#endif

DistMode parse_dist_mode(const std::string& text) {
  if (text == "auto") return DistMode::kAuto;
  if (text == "none") return DistMode::kNone;
  if (text == "mpi") return DistMode::kMpi;
  throw UsageError("invalid --dist '" + text + "': expected auto, none or mpi");
}

int launcher_world_size() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}) {
    if (const char* v = std::getenv(name)) return std::atoi(v);
  }
  return 0;
}

DistJob::DistJob(DistMode mode, std::chrono::milliseconds timeout) {
  if (mode == DistMode::kAuto) mode = launcher_world_size() > 1 ? DistMode::kMpi : DistMode::kNone;
  if (mode == DistMode::kNone) {
    comm_ = dist::make_local_collectives();
    return;
  }
#if ZINF_TOOLS_HAVE_MPI
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
    mpi_ = true;
  }
  dist::MpiCollectivesOptions options;
  options.timeout = timeout;
  comm_ = dist::make_mpi_collectives(options);
#else
  (void)timeout;
  const int announced = launcher_world_size();
  throw UsageError("--dist mpi: this build of zinf has no MPI (" + dist::mpi_unavailable_reason() +
                   ")" +
                   (announced > 0 ? "; the launcher started " + std::to_string(announced) +
                                        " processes, each would train alone"
                                  : std::string()));
#endif
}

DistJob::~DistJob() {
  comm_.reset();
#if ZINF_TOOLS_HAVE_MPI
  if (!mpi_) return;
  if (std::uncaught_exceptions() > 0) {
    // The command failed on this rank: main prints its error, then the job ends at exit.
    // MPI_Abort ends every rank within milliseconds, and ranks that fail together (a lost
    // peer times out the same collective on every survivor, a refused load fails all) would
    // lose their own errors to the first one's abort: each waits kAbortGrace first, so that
    // every rank's error reaches the log. (The MPI adapter's liveness probe after a timeout
    // takes 2 s as well, so this covers survivors timing out up to that much apart.)
    std::atexit([] {
      std::this_thread::sleep_for(kAbortGrace);
      MPI_Abort(MPI_COMM_WORLD, 1);
    });
    return;
  }
  MPI_Finalize();
#endif
}

}  // namespace zinf::tools
