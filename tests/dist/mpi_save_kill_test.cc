// SPDX-License-Identifier: Apache-2.0
// A rank killed (SIGKILL) at a random moment inside a multi-rank save never loses the last
// complete checkpoint (issue #52): the test (a plain GoogleTest run by ctest, label mpi)
// launches this same binary under mpirun in "rank" mode, round after round. Each job's
// ShardedOptimizer takes step 1 and saves it, takes step 2 and saves again into the same
// directory, while one random rank kills itself a random time into that second save (uniform
// over as long as its first save took). The test then resumes the directory with the job's
// world size, as threads: it must load step 1 or step 2, and the next step's parameters must be
// bitwise the uninterrupted run's (sharded_checks.h's exact reference).
//
// Usage (tests/dist/CMakeLists.txt): mpi_save_kill_test --np N -- <mpirun> <its options...>
#include <signal.h>
#include <unistd.h>

#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "sharded_checks.h"
#include "support/test_dir.h"
#include "support/tool_process.h"
#include "thread_group.h"
#include "zinf/dist/mpi_collectives.h"
#include "zinf/dist/sharded_optimizer.h"

namespace zinf::dist {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kRounds = 20;
// One job: start-up, two steps, two saves. Past it the test kills mpirun.
constexpr auto kRunLimit = std::chrono::seconds(60);

int g_np = 0;
std::vector<std::string> g_launcher;

// Step `t` of the reference run on this rank.
void take_step(ShardedOptimizer& opt, const Collectives& c, std::uint64_t t) {
  std::vector<std::vector<float>> params;
  (void)test::reference_step(opt, c, t, params);
}

// Rank mode: one process of a job saving into `ckpt`. Rank `victim` kills itself `seed`'s
// random time into the second save; if that save ends first, it writes <ckpt>.saved and the
// kill lands after it. Every other rank ends when its save returns (mpirun ends the job
// when the victim dies, which may cut any rank short at any point too).
int rank_main(const std::string& ckpt, int victim, unsigned seed) {
  int provided = 0;
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  try {
    MpiCollectivesOptions options;
    options.timeout = std::chrono::seconds(30);
    auto c = make_mpi_collectives(options);
    const auto gs = test::groups();
    ShardedOptimizer opt(test::options_for(optim::StateTier::kCpu, ""), gs, *c);
    for (std::size_t g = 0; g < gs.size(); ++g) {
      opt.set_params(g, zinf::test::initial_params(g, gs[g].numel));
    }
    take_step(opt, *c, 1);
    const auto start = Clock::now();
    opt.save(ckpt);
    const auto took = Clock::now() - start;
    take_step(opt, *c, 2);
    if (rank == victim) {
      std::mt19937 random(seed);
      const auto delay = std::chrono::nanoseconds(std::uniform_int_distribution<std::int64_t>(
          0, std::chrono::duration_cast<std::chrono::nanoseconds>(took).count())(random));
      std::thread([delay] {
        std::this_thread::sleep_for(delay);
        ::kill(::getpid(), SIGKILL);
      }).detach();
    }
    opt.save(ckpt);
    if (rank == victim) {
      std::ofstream(ckpt + ".saved") << "saved\n";
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));  // the kill comes
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
  }
  // Not MPI_Finalize: it may wait for the killed rank.
  _exit(0);
}

// Runs one job of `np` ranks saving into `ckpt`; returns once mpirun has ended.
void run_job(const std::string& ckpt, int np, int victim, unsigned seed) {
  std::vector<std::string> args = g_launcher;
  args.insert(args.end(),
              {"-np", std::to_string(np), std::filesystem::read_symlink("/proc/self/exe").string(),
               "--kill-ckpt=" + ckpt, "--victim=" + std::to_string(victim),
               "--seed=" + std::to_string(seed)});
  const zinf::test::BoundedRun run =
      zinf::test::run_bounded(args, kRunLimit, std::chrono::milliseconds(5));
  ASSERT_TRUE(run.ended) << "mpirun still ran after " << kRunLimit.count() << " s";
}

// The step the commit record of `ckpt` names.
std::uint64_t committed_step(const std::string& ckpt) {
  std::ifstream in(ckpt + "/zinf-sharded");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("step ", 0) == 0) return std::stoull(line.substr(5));
  }
  return 0;
}

void kill_rounds(int np) {
  ASSERT_GE(np, 2) << "usage: mpi_save_kill_test --np N -- <mpirun> <options...>";
  ASSERT_FALSE(g_launcher.empty());
  const auto want = test::reference();
  zinf::test::TestDir dir;
  const unsigned base = std::random_device{}();
  std::printf("seed %u\n", base);
  int inside = 0, resumed[3] = {0, 0, 0};
  for (int round = 0; round < kRounds; ++round) {
    const unsigned seed = base + static_cast<unsigned>(round);
    const int victim = static_cast<int>(seed % static_cast<unsigned>(np));
    const std::string ckpt = dir.file("round" + std::to_string(round));
    SCOPED_TRACE("round " + std::to_string(round) + " (seed " + std::to_string(seed) + "), rank " +
                 std::to_string(victim) + " killed");
    run_job(ckpt, np, victim, seed);
    if (!std::filesystem::exists(ckpt + ".saved")) ++inside;
    const std::uint64_t step = committed_step(ckpt);
    ASSERT_TRUE(step == 1 || step == 2) << ckpt << " names step " << step;
    ++resumed[step];
    // Resumed by as many ranks, as threads: the loaded step's next step is the uninterrupted
    // run's, bitwise (parameters, moments and step count all enter it).
    test::ThreadGroup group(np);
    group.run(false, [&](Collectives& c) {
      try {
        test::run_sharded_steps(c, optim::StateTier::kCpu, "", want, step + 1, step + 1, ckpt, "");
      } catch (const std::exception& e) {
        ADD_FAILURE() << "rank " << c.rank() << " could not resume: " << e.what();
      }
    });
    if (::testing::Test::HasFailure()) return;
  }
  std::printf(
      "%d ranks: %d of %d kills inside the second save; resumed step 1 %d times, "
      "step 2 %d times\n",
      np, inside, kRounds, resumed[1], resumed[2]);
  // The draw spans the save: most kills land inside it (the point of the test).
  EXPECT_GE(inside, kRounds / 2);
}

TEST(MpiSaveKill, EveryRandomKillInsideASaveResumesACompleteStep) { kill_rounds(g_np); }

}  // namespace
}  // namespace zinf::dist

int main(int argc, char** argv) {
  std::string ckpt;
  int victim = -1;
  unsigned seed = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--kill-ckpt=", 0) == 0) ckpt = a.substr(12);
    if (a.rfind("--victim=", 0) == 0) victim = std::atoi(a.c_str() + 9);
    if (a.rfind("--seed=", 0) == 0) seed = static_cast<unsigned>(std::stoul(a.substr(7)));
  }
  if (!ckpt.empty()) return zinf::dist::rank_main(ckpt, victim, seed);
  ::testing::InitGoogleTest(&argc, argv);
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--np" && i + 1 < argc) zinf::dist::g_np = std::atoi(argv[++i]);
    if (a == "--") {
      for (int j = i + 1; j < argc; ++j) zinf::dist::g_launcher.emplace_back(argv[j]);
      break;
    }
  }
  return RUN_ALL_TESTS();
}
