// SPDX-License-Identifier: Apache-2.0
// How a command learns the data-parallel job it is part of: `--dist auto|none|mpi`. Under
// mpirun (or another MPI launcher) each process is one rank; it initialises MPI, makes the MPI
// collectives adapter, and ends MPI when the command is done. Without a launcher the command
// is a world of one (LocalCollectives). docs/distributed.md has the launch commands.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "zinf/dist/collectives.h"

namespace zinf::tools {

enum class DistMode { kAuto, kNone, kMpi };

/// "auto", "none" or "mpi"; UsageError naming the option otherwise.
DistMode parse_dist_mode(const std::string& text);

/// The world size a launcher announced in the environment: OMPI_COMM_WORLD_SIZE (Open MPI's
/// mpirun), else PMI_SIZE (MPICH's Hydra, Slurm's srun with PMI); 0 if neither is set.
int launcher_world_size();

/// One command's membership in a job. kAuto is kMpi when launcher_world_size() > 1, else kNone.
/// kMpi: MPI_Init_thread (MPI_THREAD_SERIALIZED) and the MPI adapter with `timeout` per
/// collective; UsageError in a build without MPI (saying so, and naming the launcher's
/// variable when one is set). The destructor ends MPI (MPI_Finalize) after the adapter, unless
/// an exception is leaving the command: then the process ends the whole job with MPI_Abort
/// (exit status 1) once the command's error is printed (at exit) and 2 s more have passed for
/// ranks failing at the same time to print theirs, rather than leaving the other ranks in their
/// next collective until the timeout. One per process, on the main thread.
class DistJob {
 public:
  DistJob(DistMode mode, std::chrono::milliseconds timeout);
  ~DistJob();
  DistJob(const DistJob&) = delete;
  DistJob& operator=(const DistJob&) = delete;

  dist::Collectives& comm() noexcept { return *comm_; }
  int rank() const noexcept { return comm_->rank(); }
  int size() const noexcept { return comm_->size(); }

 private:
  bool mpi_ = false;
  std::unique_ptr<dist::Collectives> comm_;
};

}  // namespace zinf::tools
