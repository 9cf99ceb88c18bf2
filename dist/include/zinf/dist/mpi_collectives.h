// SPDX-License-Identifier: Apache-2.0
// The MPI adapter: Collectives over an MPI communicator on host memory, each collective
// nonblocking (MPI_I*) and polled until a deadline, so that a dead peer fails the survivors in
// bounded time instead of hanging them. Built where CMake finds MPI's C bindings
// (ZINF_WITH_MPI); never includes mpi.h. Part of zinf::dist (docs/distributed.md).
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "zinf/dist/collectives.h"

namespace zinf::dist {

struct MpiCollectivesOptions {
  /// The communicator to work on, as MPI_Comm_c2f(comm) returns it (mpi4py: comm.py2f()), so
  /// that this header needs no mpi.h; empty means MPI_COMM_WORLD. zinf duplicates it and works
  /// on the duplicate: the caller's own communicator and its error handler are left alone.
  std::optional<int> fortran_comm;
  /// How long one collective (and the duplication at construction) may wait for the other
  /// ranks before it fails with kTimedOut. Generous by default because a rank may legitimately
  /// lag by a step's NVMe traffic; tests and jobs that want a dead peer noticed sooner set less.
  std::chrono::milliseconds timeout = std::chrono::minutes(10);
};

/// Returns "" if this build has the MPI adapter, else why not.
std::string mpi_unavailable_reason();

/// Makes the MPI adapter: host memory only (no CUDA-aware MPI is assumed), name "mpi".
///
/// Preconditions: MPI is initialized and not finalized (the caller owns MPI_Init/MPI_Finalize;
/// finalize only after destroying the adapter); a thread level of at least MPI_THREAD_SERIALIZED
/// if the collectives are issued from a thread other than the one that initialized MPI.
/// Collective: every rank of the communicator calls it (it duplicates the communicator twice,
/// bounded by the timeout).
///
/// Errors and timeouts: the duplicate's error handler is MPI_ERRORS_RETURN, so an MPI error
/// code comes back and is thrown as CollectiveError (code kIo) with MPI's error text. Each
/// collective is started nonblocking and polled with MPI_Test, sleeping at most 1 ms between
/// polls, until `timeout`; then it sends a liveness probe to every other rank, waits up to 2 s
/// for the answers (every rank polling one of this adapter's collectives answers) and throws
/// CollectiveError with code kTimedOut naming the operation, the rank, the timeout and the
/// ranks that did not answer (the lost peer: a node or process gone, or a rank busy outside
/// any collective). The probes travel on a second duplicate of the communicator. After either, the adapter is failed and the process
/// must end the job (MPI_Abort): MPI cannot cancel a started collective, so the buffers of the
/// timed-out call may still be written, and the communicator cannot be used again.
///
/// Throws UsageError if MPI is not initialized, the timeout is not positive or
/// this build has no MPI (quoting mpi_unavailable_reason()). A single message is limited to
/// INT_MAX elements (MPI's count type); more is a UsageError.
std::unique_ptr<Collectives> make_mpi_collectives(const MpiCollectivesOptions& options = {});

}  // namespace zinf::dist
