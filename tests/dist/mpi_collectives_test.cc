// SPDX-License-Identifier: Apache-2.0
// The MPI adapter across real processes: run under mpirun (-np 2 and -np 3, label mpi; see
// tests/dist/CMakeLists.txt), every rank runs the same tests in the same order against one
// adapter, checking every collective with exact values (collectives_checks.h). The timeout is
// short enough that a rank whose test went wrong fails the others rather than hanging them.
#include <mpi.h>

#include <chrono>
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "collectives_checks.h"
#include "mpi_test_main.h"
#include "zinf/common/error.h"
#include "zinf/dist/mpi_collectives.h"

namespace zinf::dist {
namespace {


int world_size() {
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

TEST(MpiCollectives, RankAndSizeAreTheCommunicators) {
  ASSERT_NE(test::mpi_collectives(), nullptr);
  EXPECT_EQ(test::mpi_collectives()->name(), "mpi");
  EXPECT_EQ(test::mpi_collectives()->memory(), MemoryKind::kHost);
  EXPECT_EQ(test::mpi_collectives()->size(), world_size());
  EXPECT_EQ(test::mpi_collectives()->rank(), world_rank());
  EXPECT_GE(test::mpi_collectives()->size(), 2) << "run under mpirun -np 2 or more";
}

TEST(MpiCollectives, AllGatherIsExactForOddSizesAndInPlace) {
  test::check_all_gather(*test::mpi_collectives());
}
TEST(MpiCollectives, ReduceScatterSumsAndAveragesExactly) {
  test::check_reduce_scatter(*test::mpi_collectives());
}
TEST(MpiCollectives, AllReduceSumMaxMinAndAverageAreExact) {
  test::check_all_reduce(*test::mpi_collectives());
}
TEST(MpiCollectives, BroadcastFromEveryRoot) { test::check_broadcast(*test::mpi_collectives()); }
TEST(MpiCollectives, MisuseIsRefusedLocallyAndLeavesItUsable) {
  test::check_misuse(*test::mpi_collectives());
}

TEST(MpiCollectives, BarriersInARow) {
  for (int i = 0; i < 50; ++i) test::mpi_collectives()->barrier();
}

TEST(MpiCollectives, ASecondAdapterOnAGivenCommunicatorIsIndependent) {
  // The caller's communicator given as its Fortran handle (what mpi4py's py2f() returns).
  MpiCollectivesOptions o;
  o.fortran_comm = static_cast<int>(MPI_Comm_c2f(MPI_COMM_WORLD));
  o.timeout = std::chrono::seconds(30);
  auto second = make_mpi_collectives(o);
  std::vector<std::int64_t> v{second->rank() + 1};
  all_reduce<std::int64_t>(*second, v, ReduceOp::kSum);
  const std::int64_t n = second->size();
  EXPECT_EQ(v[0], n * (n + 1) / 2);
  test::mpi_collectives()->barrier();
}

TEST(MpiCollectives, RefusesANonPositiveTimeout) {
  MpiCollectivesOptions o;
  o.timeout = std::chrono::milliseconds(0);
  EXPECT_THROW((void)make_mpi_collectives(o), UsageError);
}

}  // namespace
}  // namespace zinf::dist

int main(int argc, char** argv) {
  return zinf::dist::test::mpi_test_main(argc, argv, std::chrono::seconds(30));
}
