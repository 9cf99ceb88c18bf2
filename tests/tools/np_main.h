// SPDX-License-Identifier: Apache-2.0
// The main of the tests that launch `mpirun -np N zinf ...` themselves: GoogleTest's, plus the
// rank count from `--np N` (ctest registers one entry per N).
#pragma once

#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

namespace zinf::test {

/// The N of `--np N` (2 until main has read it).
inline int& mpi_np() {
  static int np = 2;
  return np;
}

inline int np_test_main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--np") mpi_np() = std::atoi(argv[i + 1]);
  }
  return RUN_ALL_TESTS();
}

}  // namespace zinf::test
