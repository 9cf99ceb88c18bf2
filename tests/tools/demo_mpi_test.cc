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
// A save killed on one rank at a random point resumes one committed step (docs/reliability.md,
// cross-rank checkpoints); an N-rank run leaves nothing in --dir.
// ZeRO stages 2 and 3 (optimizer on cpu, a config file's) end with the same weights, bitwise,
// and every stage's collective byte counts are `zinf plan`'s figures for the model.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/wait.h>
#include <unistd.h>

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

// The mpirun command line that runs `zinf <args>` on `np` ranks.
std::string on_ranks(int np, const std::string& args) {
  return std::string(ZINF_MPI_ENV) + " " + ZINF_MPIRUN_COMMAND + " -np " + std::to_string(np) +
         " " + ZINF_TOOL_PATH + " " + args;
}

// The last line of `out` that is a JSON object (the --json summary), parsed.
nlohmann::json last_json(const std::string& out) {
  const std::size_t at = out.rfind("\n{");
  return nlohmann::json::parse(at == std::string::npos ? out : out.substr(at + 1));
}

// `mpirun -np N zinf demo --config C` at stages 1, 2 and 3 with the optimizer on cpu
// (ZeRO-Offload's setting) and the parameters resident: stages 2 and 3 reduce-scatter the
// same gradients and so end with the same weights, bitwise; stage 2 all-gathers the
// parameters once per step, half of stage 3's two fetches; and each stage's counts are `zinf
// plan`'s for the same model and world size (3 layers of 60 x 60 + 60 = 3660 parameters, which
// 2 and 3 divide: no padding; bf16 parameters, fp32 gradients: --bytes-per-param 2,4,12).
TEST(DemoMpi, EachStageMovesThePlansBytesAndStagesTwoAndThreeEndBitwiseAlike) {
  const int np = zinf::test::mpi_np();
  zinf::test::TestDir dir;
  const zinf::test::ToolRun plan = zinf::test::run_zinf(
      "plan --params 10980 --gpus " + std::to_string(np) + " --gpus-per-node " +
          std::to_string(np) + " --bytes-per-param 2,4,12 --json",
      false);
  ASSERT_EQ(plan.status, 0) << plan.out;
  const nlohmann::json setups = last_json(plan.out)["setups"];
  std::map<int, nlohmann::json> runs;
  for (const int stage : {1, 2, 3}) {
    const std::string config = dir.file("stage" + std::to_string(stage) + ".json");
    std::ofstream(config) << R"({"zero_optimization": {"stage": )" << stage
                          << R"(, "offload_optimizer": {"device": "cpu"}}})";
    const zinf::test::ToolRun job = zinf::test::run_shell(
        on_ranks(np,
                 "demo --config " + config + " --steps 4 --layers 3 --hidden 60 --batch 12 --json"),
        false);
    ASSERT_EQ(job.status, 0) << job.out;
    const nlohmann::json j = last_json(job.out);
    EXPECT_EQ(j["zero_stage"], stage);
    EXPECT_EQ(j["parameters"], 10980);
    const auto row = std::find_if(setups.begin(), setups.end(),
                                  [stage](const nlohmann::json& r) { return r["stage"] == stage; });
    ASSERT_NE(row, setups.end()) << "zinf plan has no stage " << stage << ": " << plan.out;
    const auto gathered = j["allgather_bytes_per_step"].get<std::uint64_t>();
    const auto reduced = j["reduce_scatter_bytes_per_step"].get<std::uint64_t>() +
                         j["all_reduce_bytes_per_step"].get<std::uint64_t>();
    std::printf(
        "%d ranks, stage %d: all-gather %llu, reduce-scatter %llu, all-reduce %llu bytes "
        "per step; plan %.0f and %.0f; weights_sha256 %s\n",
        np, stage, static_cast<unsigned long long>(gathered),
        j["reduce_scatter_bytes_per_step"].get<unsigned long long>(),
        j["all_reduce_bytes_per_step"].get<unsigned long long>(),
        (*row)["allgather_bytes_per_step_per_gpu"].get<double>(),
        (*row)["grad_reduce_bytes_per_step_per_gpu"].get<double>(),
        j["weights_sha256"].get<std::string>().c_str());
    EXPECT_DOUBLE_EQ(static_cast<double>(gathered),
                     (*row)["allgather_bytes_per_step_per_gpu"].get<double>());
    EXPECT_DOUBLE_EQ(static_cast<double>(reduced),
                     (*row)["grad_reduce_bytes_per_step_per_gpu"].get<double>());
    runs[stage] = j;
  }
  EXPECT_EQ(runs[2]["weights_sha256"], runs[3]["weights_sha256"]);
  EXPECT_EQ(2 * runs[2]["allgather_bytes_per_step"].get<std::uint64_t>(),
            runs[3]["allgather_bytes_per_step"].get<std::uint64_t>());
  EXPECT_EQ(runs[1]["all_reduce_bytes_per_step"].get<std::uint64_t>(),
            2 * runs[2]["reduce_scatter_bytes_per_step"].get<std::uint64_t>());
}

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The pid in the name of a state version a rank's save is writing in `folder`
// ("v<step>-<pid>-<random>.tmp"), or 0 while there is none.
pid_t saving_pid(const std::string& folder) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(folder, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.size() < 4 || name[0] != 'v' || !name.ends_with(".tmp")) continue;
    const std::size_t dash = name.find('-');
    if (dash == std::string::npos) continue;
    return static_cast<pid_t>(std::atoi(name.c_str() + dash + 1));
  }
  return 0;
}

// A 2- or 3-rank `demo --resume CK --save CK` whose rank V is SIGKILLed inside its save (a
// random 0-20 ms after its new state version appears; V and the delay drawn from a seeded
// generator, ZINF_TEST_SEED replays a run) leaves CK resuming, on the job's ranks and on one,
// exactly one committed step (the weights one step later are bitwise those of a resume of
// that step's intact checkpoint), in every round: the previous checkpoint is kept until the
// new one is committed by every rank (issue #52), so nothing is ever refused as torn.
TEST(DemoMpi, ASaveKilledOnOneRankResumesOneCommittedStep) {
  const int np = zinf::test::mpi_np();
  zinf::test::TestDir dir;
  const std::string cut = "demo --offload nvme --layers 2 --hidden 32 --batch 12 --json";
  const std::string base = dir.file("base"), full = dir.file("full");
  const std::string swap = dir.subdir("swap");
  zinf::test::ToolRun r = zinf::test::run_shell(
      on_ranks(np, cut + " --steps 2 --dir " + swap + " --save " + base), true);
  ASSERT_EQ(r.status, 0) << r.out;
  std::filesystem::copy(base, full, std::filesystem::copy_options::recursive);
  r = zinf::test::run_shell(
      on_ranks(np, cut + " --steps 2 --dir " + swap + " --resume " + full + " --save " + full),
      true);
  ASSERT_EQ(r.status, 0) << r.out;
  // One step on from each intact checkpoint, on the job's ranks and on one: the only weights a
  // resume of a killed save may end with.
  auto one_more = [&](const std::string& ck, int ranks, const std::string& out) {
    const std::string args =
        cut + " --steps 1 --dir " + swap + " --resume " + ck + " --weights-out " + out;
    return zinf::test::run_shell(ranks > 1 ? on_ranks(ranks, args)
                                           : std::string(ZINF_TOOL_PATH) + " " + args,
                                 true);
  };
  std::map<int, std::vector<std::string>> allowed;
  for (const int ranks : {np, 1}) {
    for (const std::string& ck : {base, full}) {
      const std::string out = dir.file("ref-" + std::to_string(ranks));
      r = one_more(ck, ranks, out);
      ASSERT_EQ(r.status, 0) << r.out;
      allowed[ranks].push_back(file_bytes(out));
    }
    ASSERT_NE(allowed[ranks][0], allowed[ranks][1]);
  }

  const char* seed_env = std::getenv("ZINF_TEST_SEED");
  const unsigned seed = seed_env ? static_cast<unsigned>(std::strtoul(seed_env, nullptr, 10))
                                 : std::random_device{}();
  std::printf("ZINF_TEST_SEED=%u\n", seed);
  std::mt19937 rng(seed);
  // Six rounds keep the test near 20 s; ZINF_TEST_ROUNDS asks for more (the issue's 20).
  const char* rounds_env = std::getenv("ZINF_TEST_ROUNDS");
  const int kRounds = rounds_env ? std::max(1, std::atoi(rounds_env)) : 6;
  int killed = 0, resumed = 0, failed = 0;
  for (int round = 0; round < kRounds; ++round) {
    const int victim = static_cast<int>(rng() % static_cast<unsigned>(np));
    const int delay_us = static_cast<int>(rng() % 20000);
    SCOPED_TRACE("round " + std::to_string(round) + ": rank " + std::to_string(victim) +
                 " killed " + std::to_string(delay_us) + " us into its save");
    const std::string ck = dir.file("ck" + std::to_string(round));
    std::filesystem::copy(base, ck, std::filesystem::copy_options::recursive);
    const std::string log = dir.file("job" + std::to_string(round) + ".log");
    const std::string job = on_ranks(np, cut + " --steps 2 --dir " + swap + " --resume " + ck +
                                             " --save " + ck);
    const pid_t sh = ::fork();
    ASSERT_GE(sh, 0);
    if (sh == 0) {
      ::setpgid(0, 0);
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      ::execl("/bin/sh", "sh", "-c", job.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    bool shot = false;
    int status = 0;
    while (::waitpid(sh, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(-sh, SIGKILL);
        (void)::waitpid(sh, &status, 0);
        FAIL() << "the job did not end within 60 s: " << file_bytes(log);
      }
      const pid_t pid = shot ? 0 : saving_pid(ck + "/rank" + std::to_string(victim));
      if (pid > 0) {
        std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
        shot = ::kill(pid, SIGKILL) == 0;
        killed += shot ? 1 : 0;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    // The job's ranks first, then one (a resharding load of the same folders).
    for (const int ranks : {np, 1}) {
      const std::string out = dir.file("w" + std::to_string(round) + "-" + std::to_string(ranks));
      r = one_more(ck, ranks, out);
      if (r.status != 0) {
        ++failed;
        ADD_FAILURE() << "the resume on " << ranks << " ranks failed: " << r.out;
        continue;
      }
      ++resumed;
      const std::string got = file_bytes(out);
      EXPECT_TRUE(got == allowed[ranks][0] || got == allowed[ranks][1])
          << "resumed on " << ranks << " ranks with weights of neither committed step";
    }
  }
  std::printf("%d rounds, %d kills landed in a save; resumes: %d whole, %d failed\n", kRounds,
              killed, resumed, failed);
  EXPECT_GT(killed, 0);
}

}  // namespace

int main(int argc, char** argv) { return zinf::test::np_test_main(argc, argv); }
