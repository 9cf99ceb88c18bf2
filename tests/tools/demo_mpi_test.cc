// SPDX-License-Identifier: Apache-2.0
// `mpirun -np N zinf demo --offload nvme` trains data-parallel: the global batch split across
// the ranks, each rank keeping 1/N of every layer in its own rank<R> folder. It must end with
// the 1-rank run's fp32 master weights within kWeightTolerance and the same loss curve within
// kLossTolerance (relative). Not bitwise: each rank's backward sums its own samples and the
// reduce-scatter then averages the ranks' sums (and divides by 3, which rounds), a different
// fp32 summation order than one sum over the whole batch. Adam divides each gradient by its
// own running magnitude, so where a gradient is near zero a rounding difference can move that
// element by up to about lr in a step: the tolerance is a hundredth of lr (the default 1e-3),
// ten times the largest difference measured here (1.1e-6 for 2 and 3 ranks, 10 steps). A
// larger lr or more steps let the two runs drift further apart (lr 0.01: 4.7e-5 with 3 ranks),
// as any change of summation order does. The N comes from the command line (--np N).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "support/test_dir.h"
#include "np_main.h"
#include "support/tool_run.h"

namespace {

constexpr double kWeightTolerance = 1e-5;
constexpr double kLossTolerance = 1e-5;

// Small: three 64-wide layers, a batch of 12 (a multiple of 2 and 3), ten steps, lr 1e-3.
const std::string kModel =
    "demo --offload nvme --steps 10 --layers 3 --hidden 64 --batch 12 --json";

std::vector<float> read_floats(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<float> out(bytes.size() / sizeof(float));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(float));
  return out;
}

// The largest elementwise difference of two runs' weights.
double largest_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::abs(static_cast<double>(a[i]) - b[i]));
  }
  return worst;
}

// A number field of the one-line JSON summary (NaN if absent).
double number(const std::string& json, const std::string& key) {
  const std::size_t at = json.find("\"" + key + "\":");
  if (at == std::string::npos) return std::nan("");
  return std::strtod(json.c_str() + at + key.size() + 3, nullptr);
}

TEST(DemoMpi, DataParallelRanksEndWithTheOneRankWeights) {
  const int np = zinf::test::mpi_np();
  zinf::test::TestDir dir;
  const std::string one = dir.subdir("one"), many = dir.subdir("many");
  const zinf::test::ToolRun alone =
      zinf::test::run_zinf(kModel + " --dir " + one + " --weights-out " + one + "/weights", false);
  ASSERT_EQ(alone.status, 0) << alone.out;
  const zinf::test::ToolRun job = zinf::test::run_shell(
      std::string(ZINF_MPI_ENV) + " " + ZINF_MPIRUN_COMMAND + " -np " + std::to_string(np) + " " +
          ZINF_TOOL_PATH + " " + kModel + " --dir " + many + " --weights-out " + many + "/weights",
      false);
  ASSERT_EQ(job.status, 0) << job.out;
  EXPECT_EQ(number(job.out, "ranks"), np) << job.out;
  EXPECT_EQ(number(alone.out, "ranks"), 1) << alone.out;
  // The rank<R> swap folders went with the ranks' engines: only --weights-out is left in --dir.
  std::vector<std::string> left;
  for (const auto& entry : std::filesystem::directory_iterator(many)) {
    left.push_back(entry.path().filename().string());
  }
  EXPECT_EQ(left, std::vector<std::string>{"weights"});
  const double loss_one = number(alone.out, "final_loss");
  const double loss_many = number(job.out, "final_loss");
  EXPECT_LT(loss_one, number(alone.out, "initial_loss"));
  EXPECT_NEAR(loss_many, loss_one, kLossTolerance * loss_one);
  const std::vector<float> w1 = read_floats(one + "/weights");
  const std::vector<float> wn = read_floats(many + "/weights");
  ASSERT_EQ(w1.size(), std::size_t{3} * (64 * 64 + 64));
  ASSERT_EQ(wn.size(), w1.size());
  const double worst = largest_difference(w1, wn);
  std::printf("largest weight difference over %d ranks: %g\n", np, worst);
  EXPECT_LE(worst, kWeightTolerance);
}

// A checkpoint of the N-rank job resumes in one process (resharded) and ends, after the
// remaining steps, with the 1-rank run's weights within the same tolerance.
TEST(DemoMpi, ACheckpointOfTheRanksResumesInOneProcess) {
  const int np = zinf::test::mpi_np();
  zinf::test::TestDir dir;
  const std::string one = dir.subdir("one"), many = dir.subdir("many"), ckpt = dir.file("ckpt");
  const zinf::test::ToolRun alone =
      zinf::test::run_zinf(kModel + " --dir " + one + " --weights-out " + one + "/weights", false);
  ASSERT_EQ(alone.status, 0) << alone.out;
  const std::string cut = "demo --offload nvme --layers 3 --hidden 64 --batch 12 --json";
  const zinf::test::ToolRun job = zinf::test::run_shell(
      std::string(ZINF_MPI_ENV) + " " + ZINF_MPIRUN_COMMAND + " -np " + std::to_string(np) + " " +
          ZINF_TOOL_PATH + " " + cut + " --steps 6 --dir " + many + " --save " + ckpt,
      false);
  ASSERT_EQ(job.status, 0) << job.out;
  for (int r = 0; r < np; ++r) {
    EXPECT_TRUE(std::filesystem::exists(ckpt + "/rank" + std::to_string(r) + "/zinf-sharded"));
  }
  const zinf::test::ToolRun resumed = zinf::test::run_zinf(
      cut + " --steps 4 --dir " + one + " --resume " + ckpt + " --weights-out " + one + "/resumed",
      false);
  ASSERT_EQ(resumed.status, 0) << resumed.out;
  EXPECT_NEAR(number(resumed.out, "final_loss"), number(alone.out, "final_loss"),
              kLossTolerance * number(alone.out, "final_loss"));
  const std::vector<float> w1 = read_floats(one + "/weights");
  const std::vector<float> wr = read_floats(one + "/resumed");
  ASSERT_EQ(wr.size(), w1.size());
  const double worst = largest_difference(w1, wr);
  std::printf("largest weight difference, %d ranks resumed in one: %g\n", np, worst);
  EXPECT_LE(worst, kWeightTolerance);
}

}  // namespace

int main(int argc, char** argv) { return zinf::test::np_test_main(argc, argv); }
