// SPDX-License-Identifier: Apache-2.0
// The main of the MPI test programs: MPI_Init, one MPI adapter for the process (with a timeout,
// so that a rank whose test failed early does not hang the others for the default ten
// minutes), the tests, MPI_Finalize.
#pragma once

#include <mpi.h>

#include <chrono>
#include <memory>

#include <gtest/gtest.h>

#include "zinf/dist/mpi_collectives.h"

namespace zinf::dist::test {

/// The process's MPI adapter while mpi_test_main runs the tests; null otherwise.
inline Collectives*& mpi_collectives() {
  static Collectives* collectives = nullptr;
  return collectives;
}

inline int mpi_test_main(int argc, char** argv, std::chrono::seconds timeout) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  ::testing::InitGoogleTest(&argc, argv);
  int rc = 1;
  {
    MpiCollectivesOptions options;
    options.timeout = timeout;
    std::unique_ptr<Collectives> collectives = make_mpi_collectives(options);
    mpi_collectives() = collectives.get();
    rc = RUN_ALL_TESTS();
    mpi_collectives() = nullptr;
  }
  MPI_Finalize();
  return rc;
}

}  // namespace zinf::dist::test
