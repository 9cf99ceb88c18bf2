// SPDX-License-Identifier: Apache-2.0
// A dead peer fails the MPI adapter's survivors within the timeout, never hangs them, both on
// the adapter alone and inside a ShardedEngine's step. The test
// (a plain GoogleTest run by ctest, label mpi) launches this same binary under mpirun in "rank"
// mode: after a first collective, rank 1 ends abruptly (_exit, no MPI_Finalize), and every other
// rank writes what its next collective did to a report file. The test then reads the reports:
// each survivor got a CollectiveError naming the operation and its rank, within the bound.
//
// Usage (tests/dist/CMakeLists.txt): mpi_fault_test --np N -- <mpirun> <its options...>
#include <stdlib.h>
#include <unistd.h>

#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "sharded_engine_checks.h"
#include "support/tool_process.h"
#include "zinf/common/error.h"
#include "zinf/dist/callback_collectives.h"
#include "zinf/dist/mpi_collectives.h"
#include "zinf/dist/sharded_engine.h"

namespace {

using Clock = std::chrono::steady_clock;

// The adapter's timeout in the rank processes, and how much later than it a survivor may report
// (scheduling on a loaded CI machine with ranks oversubscribed on few cores).
constexpr auto kTimeout = std::chrono::milliseconds(2000);
constexpr auto kSlack = std::chrono::milliseconds(8000);
// The whole mpirun run: start-up, the timeout, reports. Past it the test kills mpirun.
constexpr auto kRunLimit = std::chrono::seconds(90);
constexpr int kDyingRank = 1;

int g_np = 0;
std::vector<std::string> g_launcher;

// The engine scenario's layers and config: cpu tiers, one small layer per dtype.
std::unique_ptr<zinf::dist::ShardedEngine> make_engine(zinf::dist::Collectives& c,
                                                       zinf::dist::test::RankDevice& d) {
  const zinf::dist::test::ShardedCase cpu{};
  return std::make_unique<zinf::dist::ShardedEngine>(zinf::dist::test::sharded_config(cpu, ""),
                                                     zinf::dist::test::sharded_layers(), *d.device,
                                                     d.compute.ref(), c);
}

// Rank mode: one process of the job. Reports go to <dir>/rank<R>. Scenario "collectives": the
// next all_reduce after the death; "engine": a ShardedEngine whose step the rank leaves after
// its forward fetch, the survivors' next call being set_gradients (its reduce-scatter).
int rank_main(const std::string& dir, const std::string& scenario) {
  int provided = 0;
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::ostringstream report;  // written out at the end, so the dying rank leaves no file
  try {
    zinf::dist::MpiCollectivesOptions options;
    options.timeout = kTimeout;
    auto c = zinf::dist::make_mpi_collectives(options);
    // Everyone is up and the communicator works before anyone dies.
    std::vector<double> x{1.0};
    zinf::dist::all_reduce<double>(*c, x, zinf::dist::ReduceOp::kSum);
    zinf::dist::test::RankDevice device;
    std::unique_ptr<zinf::dist::ShardedEngine> engine;
    std::vector<float> grads;
    // The engine's collectives: a patient MPI adapter for its set-up and first step (a rank
    // that a loaded machine slows down must not trip the short timeout there), switched to the
    // 2 s one, on every rank at the same point, before the death.
    std::unique_ptr<zinf::dist::Collectives> patient, switching;
    zinf::dist::Collectives* now = nullptr;
    if (scenario == "engine") {
      zinf::dist::MpiCollectivesOptions slow;
      slow.timeout = std::chrono::seconds(60);
      patient = zinf::dist::make_mpi_collectives(slow);
      now = patient.get();
      zinf::dist::CollectiveCallbacks cb;
      cb.rank = rank;
      cb.size = c->size();
      cb.name = "switch";
      cb.all_gather = [&now](auto send, auto recv) { now->all_gather(send, recv); };
      cb.all_reduce = [&now](auto data, auto type, auto op) { now->all_reduce(data, type, op); };
      cb.broadcast = [&now](auto data, int root) { now->broadcast(data, root); };
      cb.barrier = [&now] { now->barrier(); };
      cb.reduce_scatter = [&now](auto send, auto recv, auto type, auto op) {
        now->reduce_scatter(send, recv, type, op);
      };
      switching = zinf::dist::make_callback_collectives(std::move(cb));
      // One whole step first, then the forward fetch of the next.
      engine = make_engine(*switching, device);
      zinf::dist::test::init_masters(*engine);
      zinf::dist::test::Trace trace;
      zinf::dist::test::run_steps(*engine, device, zinf::dist::test::ShardedCase{}, rank, c->size(),
                                  1, 1, trace);
      (void)zinf::dist::test::fetch_bytes(*engine, device, 0, engine->layer(0));
      grads.assign(engine->layer(0).numel, 1.0f / 64);
      now = c.get();
    }
    if (rank == kDyingRank) _exit(1);  // abruptly: no finalize, no goodbye to the peers
    const auto start = Clock::now();
    std::string outcome = "completed";
    try {
      if (engine) {
        engine->set_gradients(0, zinf::adam::GradView::f32(grads));
      } else {
        zinf::dist::all_reduce<double>(*c, x, zinf::dist::ReduceOp::kSum);
      }
    } catch (const zinf::dist::CollectiveError& e) {
      outcome = std::string("CollectiveError code=") +
                std::string(zinf::error_code_name(e.code())) + " what=" + e.what();
    }
    const auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
    std::string after = "usable";
    try {
      if (engine) {
        (void)engine->step();
      } else {
        c->barrier();
      }
    } catch (const zinf::EngineFailed&) {
      after = "EngineFailed";
    }
    report << "elapsed_ms=" << ms << "\nafter=" << after << "\noutcome=" << outcome << "\n";
  } catch (const std::exception& e) {
    report << "unexpected=" << e.what() << "\n";
  }
  std::ofstream(dir + "/rank" + std::to_string(rank)) << report.str();
  // Not MPI_Finalize (it may wait for the dead rank) nor MPI_Abort (what a real job does, but
  // here it could kill a survivor before it wrote its report): each survivor just ends.
  _exit(0);
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Runs the job of `scenario` and checks every survivor's report: a CollectiveError of `op`
// naming its rank, within the bound, and its object failed afterwards.
void run_job(const std::string& scenario, const std::string& op) {
  ASSERT_GE(g_np, 2) << "usage: mpi_fault_test --np N -- <mpirun> <options...>";
  ASSERT_FALSE(g_launcher.empty());
  char dir_template[] = "/tmp/zinf-mpi-fault-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr) << std::strerror(errno);
  const std::string dir = dir_template;

  std::vector<std::string> args = g_launcher;
  args.insert(args.end(), {"-np", std::to_string(g_np),
                           std::filesystem::read_symlink("/proc/self/exe").string()});
  args.push_back("--fault-rank-dir=" + dir);
  args.push_back("--scenario=" + scenario);
  std::string command;
  for (const auto& a : args) command += a + " ";
  std::printf("running: %s\n", command.c_str());
  const zinf::test::BoundedRun run =
      zinf::test::run_bounded(args, kRunLimit, std::chrono::milliseconds(20));
  EXPECT_TRUE(run.ended) << "mpirun still ran after " << kRunLimit.count() << " s: a rank hung";
  // mpirun's own status is not the verdict: it reports the rank that died on purpose.
  std::printf("mpirun ended with wait status %d after %lld ms\n", run.status,
              static_cast<long long>(run.took.count()));

  for (int r = 0; r < g_np; ++r) {
    const auto path = std::filesystem::path(dir) / ("rank" + std::to_string(r));
    if (r == kDyingRank) {
      EXPECT_FALSE(std::filesystem::exists(path));
      continue;
    }
    ASSERT_TRUE(std::filesystem::exists(path)) << "rank " << r << " wrote no report";
    const std::string report = read_file(path);
    std::printf("rank %d report:\n%s", r, report.c_str());
    SCOPED_TRACE("rank " + std::to_string(r) + " report:\n" + report);
    EXPECT_EQ(report.find("unexpected="), std::string::npos);
    long long ms = -1;
    ASSERT_EQ(std::sscanf(report.c_str(), "elapsed_ms=%lld", &ms), 1);
    EXPECT_LE(ms, (kTimeout + kSlack).count()) << "the survivor took too long to fail";
    EXPECT_NE(report.find("outcome=CollectiveError"), std::string::npos);
    EXPECT_NE(report.find(op + " failed"), std::string::npos);
    EXPECT_NE(report.find("rank " + std::to_string(r) + " of " + std::to_string(g_np)),
              std::string::npos);
    EXPECT_NE(report.find("engine=mpi"), std::string::npos);
    EXPECT_NE(report.find("after=EngineFailed"), std::string::npos);
    // Open MPI's shared-memory transport does not notice a dead peer, so here it is the
    // timeout that fires; another transport may report the loss first (code io), also fine.
    if (report.find("code=timed_out") != std::string::npos) {
      EXPECT_NE(report.find("timed out after 2000 ms"), std::string::npos);
      EXPECT_GE(ms, kTimeout.count() - 50);
      // The liveness probe names the rank that is gone (every survivor answers the others').
      EXPECT_NE(report.find("; rank " + std::to_string(kDyingRank) +
                            " did not answer a liveness probe within 2000 ms (lost"),
                std::string::npos);
    }
  }
  std::filesystem::remove_all(dir);
}

TEST(MpiFault, ADeadPeerFailsTheOthersWithinTheTimeout) { run_job("collectives", "all_reduce"); }

// A rank that dies in the middle of a sharded engine's step (after its forward fetch): the
// others' next collective, set_gradients' reduce-scatter, fails within the bound, and their
// engine's step then refuses (the group is failed).
TEST(MpiFault, ARankDyingMidStepFailsTheOtherRanksEngines) { run_job("engine", "reduce_scatter"); }

}  // namespace

int main(int argc, char** argv) {
  std::string rank_dir, scenario = "collectives";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--fault-rank-dir=", 0) == 0) rank_dir = a.substr(17);
    if (a.rfind("--scenario=", 0) == 0) scenario = a.substr(11);
  }
  if (!rank_dir.empty()) return rank_main(rank_dir, scenario);
  ::testing::InitGoogleTest(&argc, argv);
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--np" && i + 1 < argc) g_np = std::atoi(argv[++i]);
    if (a == "--") {
      for (int j = i + 1; j < argc; ++j) g_launcher.emplace_back(argv[j]);
      break;
    }
  }
  return RUN_ALL_TESTS();
}
