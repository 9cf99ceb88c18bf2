// SPDX-License-Identifier: Apache-2.0
// `zinf tune` and `zinf plan` as a user runs them: a tiny-budget tune whose --out config
// parse_config accepts with the chosen values, its report read by `zinf plan --tune`, the
// memlock warning's exact line, and the one-line errors (exit 2) for bad arguments.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include "support/test_dir.h"
#include "support/tool_process.h"
#include "support/tool_run.h"
#include "zinf/offload/config.h"

namespace {

using zinf::test::dir_entries;
using zinf::test::make_victims;
using zinf::test::plant_links;
using zinf::test::run_shell;
using zinf::test::run_zinf;
using zinf::test::spawn_tool;
using zinf::test::ToolEnd;
using zinf::test::ToolProcess;
using zinf::test::ToolRun;
using zinf::test::Victims;
using zinf::test::victims_changed;
using zinf::test::wait_tool;

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST(TuneCli, TinyBudgetWritesAConfigTheReaderAcceptsWithTheChosenValues) {
  zinf::test::TestDir dir;
  std::string data = dir.subdir("data");
  std::string cfg = dir.file("zinf.json"), rep = dir.file("report.json");
  ToolRun r = run_zinf("tune --dir " + data +
                       " --time-budget 2 --block-sizes 256K,1M "
                       "--queue-depths 4,8 --out " +
                       cfg + " --report " + rep);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("chosen: backend="), std::string::npos) << r.out;
  // The config is printed too, exactly what --out wrote (DeepSpeed's tuner prints its block).
  EXPECT_NE(r.out.find(slurp(cfg)), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("wrote " + cfg), std::string::npos) << r.out;

  zinf::offload::EngineConfig c = zinf::offload::load_config(cfg);
  const nlohmann::json report = nlohmann::json::parse(slurp(rep));
  ASSERT_TRUE(report.contains("chosen"));
  const nlohmann::json& chosen = report["chosen"];
  EXPECT_EQ(c.aio.block_size, static_cast<std::uint32_t>(chosen["block_size"].get<double>()));
  EXPECT_EQ(c.aio.queue_depth, static_cast<std::uint32_t>(chosen["queue_depth"].get<double>()));
  const std::string backend = chosen["backend"].get<std::string>();
  EXPECT_EQ(zinf::swap::io_engine_kind_name(c.zinf.backend), backend);
  EXPECT_EQ(
      c.aio.intra_op_parallelism,
      backend == "threads" ? static_cast<std::uint32_t>(chosen["threads"].get<double>()) : 1u);
  EXPECT_FALSE(c.aio.single_submit);
  EXPECT_TRUE(c.aio.overlap_events);
  EXPECT_TRUE(c.notices.empty());
  EXPECT_GT(chosen["mixed_gbps"].get<double>(), 0);
  EXPECT_GT(chosen["read_gbps"].get<double>(), 0);
  EXPECT_GT(chosen["write_gbps"].get<double>(), 0);
  // Only the block sizes and depths asked for were swept, and zinf's default (1M, qd16), the
  // reference the choice rule keeps unless a setting beats it by more than the spread.
  int defaults = 0;
  for (const auto& p : report["sweep"]) {
    double b = p["block_size"].get<double>();
    double q = p["queue_depth"].get<double>();
    if (p["default"].get<bool>()) {
      ++defaults;
      EXPECT_EQ(b, 1048576);
      EXPECT_EQ(q, 16);
      EXPECT_GE(p["runs_gbps"].size(), 3u) << "the default is measured three times";
      continue;
    }
    EXPECT_TRUE(b == 262144 || b == 1048576) << b;
    EXPECT_TRUE(q == 4 || q == 8) << q;
  }
  EXPECT_EQ(defaults, 1);
  // The rule and its outcome, in the report and the text; the chosen setting is the default
  // unless it beat it by more than the noise.
  const nlohmann::json& choice = report["choice"];
  const bool beats = choice["beats_default"].get<bool>();
  EXPECT_EQ(beats, choice["margin_gbps"].get<double>() > choice["noise_gbps"].get<double>());
  EXPECT_EQ(chosen["default"].get<bool>(), !beats) << choice;
  EXPECT_NE(r.out.find("\nrule: a setting replaces zinf's default only if its median beats the "
                       "default's by more than the larger of the two spreads"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("\n" + choice["summary"].get<std::string>() + "\n"), std::string::npos)
      << r.out;
  // "top 3", or fewer where the budget cut the sweep short on a loaded machine.
  EXPECT_NE(r.out.find(" within ", r.out.find("\ntop ")), std::string::npos) << r.out;
  // The grid: one per backend swept, the chosen cell marked once.
  EXPECT_NE(r.out.find("mixed GB/s by block size x queue depth (* chosen"), std::string::npos)
      << r.out;
  // The default (qd16, the deepest) is measured first, whatever the budget cuts.
  EXPECT_NE(r.out.find("    qd16\n"), std::string::npos) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '*'), 2) << r.out;  // the legend and the cell
  // Not a terminal: no progress line, no carriage return or escape code anywhere.
  EXPECT_EQ(r.out.find('\r'), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find('\x1b'), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find(" passes/s"), std::string::npos) << r.out;
  // The test files are gone.
  EXPECT_FALSE(std::ifstream(data + "/zinf-tune.0.dat").good());

  // plan reads the report for the drive bandwidth and predicts I/O time.
  ToolRun p =
      run_zinf("plan --params 1B --gpus 1 --offload-optimizer nvme --tune " + rep + " --json");
  ASSERT_EQ(p.status, 0) << p.out;
  const nlohmann::json pj = nlohmann::json::parse(p.out);
  const nlohmann::json& row = pj["setups"].at(0);
  EXPECT_EQ(row["offload_optimizer"].get<std::string>(), "nvme");
  EXPECT_EQ(row["nvme_read_bytes_per_step_per_node"].get<double>(), 12e9);
  EXPECT_NEAR(row["io_seconds_per_step"].get<double>(),
              24e9 / (chosen["mixed_gbps"].get<double>() * 1e9), 1e-6 * 24);
}

// --sustained: after a tiny sweep, a 2-second time-based write with the chosen setting over the
// size asked for, stated in the text and the report; its steady state, compared with the burst
// write figure, and said so where it is lower. plan --tune takes the steady rate.
TEST(TuneCli, SustainedWritesReportTheSteadyRateOnTheSizeGiven) {
  zinf::test::TestDir dir;
  std::string data = dir.subdir("data");
  std::string rep = dir.file("report.json");
  ToolRun r = run_zinf("tune --dir " + data +
                       " --time-budget 1 --block-sizes 256K --queue-depths 4 --sustained --size 8M "
                       "--sustained-time 2s --report " +
                       rep);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("zinf tune: sustained write of 8 MiB for 2s\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("sustained write: 8 MiB over 1 dir for 2 s with the chosen setting: "
                       "steady "),
            std::string::npos)
      << r.out;
  const nlohmann::json report = nlohmann::json::parse(slurp(rep));
  ASSERT_TRUE(report.contains("sustained")) << slurp(rep);
  const nlohmann::json& su = report["sustained"];
  EXPECT_EQ(su["size_bytes"], 8u << 20);
  EXPECT_EQ(su["duration_s"], 2.0);
  EXPECT_GE(su["seconds"].get<double>(), 2.0);
  EXPECT_GT(su["steady_write_gbps"].get<double>(), 0);
  EXPECT_EQ(su["burst_write_gbps"], report["chosen"]["write_gbps"]);
  EXPECT_GE(su["samples_gbps"].size(), 2u);
  EXPECT_TRUE(su["cliff"].is_null());  // two samples: not judged
  // Below the burst figure or not, the text and the report agree.
  const bool below = su["below_burst"].get<bool>();
  EXPECT_EQ(su.contains("note"), below) << su;
  EXPECT_EQ(r.out.find("note: the steady write rate ") != std::string::npos, below) << r.out;
  EXPECT_EQ(r.out.find("; sustained writes run at ") != std::string::npos, below) << r.out;

  ToolRun p = run_zinf("plan --params 1B --gpus 1 --offload-optimizer nvme --tune " + rep);
  ASSERT_EQ(p.status, 0) << p.out;
  EXPECT_NE(p.out.find("  sustained writes: "), std::string::npos) << p.out;

  r = run_zinf("tune --dir " + data + " --size 8M");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.out,
            "zinf tune: error: --size is the size --sustained writes over; give --sustained "
            "with it\n");
}

// --plot: the grid as an SVG heat map, well-formed XML (python3's parser) with a cell per
// block size x queue depth of each backend, the chosen one marked; written with --json too.
TEST(TuneCli, PlotDrawsTheGridOfEachBackend) {
  zinf::test::TestDir dir;
  std::string data = dir.subdir("data");
  const std::string svg = dir.file("grid.svg");
  ToolRun r =
      run_zinf("tune --dir " + data +
                   " --time-budget 1 --block-sizes 256K --queue-depths 4,8 --backends threads "
                   "--json --plot " +
                   svg,
               false);
  ASSERT_EQ(r.status, 0) << r.out;
  // A loaded machine can cut the sweep short: the grid spans the settings measured.
  const nlohmann::json report = nlohmann::json::parse(r.out);
  std::vector<double> blocks, depths;
  for (const auto& p : report["sweep"]) {
    blocks.push_back(p["block_size"].get<double>());
    depths.push_back(p["queue_depth"].get<double>());
  }
  auto distinct = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return static_cast<std::size_t>(std::unique(v.begin(), v.end()) - v.begin());
  };
  const std::size_t cells = distinct(blocks) * distinct(depths);
  EXPECT_EQ(r.out.find('\r'), std::string::npos) << r.out;
  if (run_shell("test -x /usr/bin/python3").status != 0) {
    GTEST_SKIP() << "/usr/bin/python3 not installed: cannot parse the SVG";
  }
  ToolRun p = run_shell(
      "/usr/bin/python3 -c \"import sys, xml.etree.ElementTree as E; "
      "r = E.parse(sys.argv[1]).getroot(); ns = '{http://www.w3.org/2000/svg}'; "
      "c = [e.get('class', '').split() for e in r.iter(ns + 'rect')]; "
      "print(sum('cell' in x for x in c), sum('chosen' in x for x in c))\" " +
      svg);
  ASSERT_EQ(p.status, 0) << p.out;
  // threads only: 256K and the default's 1M x qd4, qd8 and the default's qd16, as measured.
  EXPECT_EQ(p.out, std::to_string(cells) + " 1\n") << slurp(svg);
}

// On a pseudo-terminal (util-linux's `script`) the sweep draws the shared progress line:
// passes done of those planned, the rate, the elapsed time and the last figure.
TEST(TuneCli, ProgressOnATerminal) {
  zinf::test::TestDir dir;
  if (run_shell("command -v script").status != 0) GTEST_SKIP() << "script (util-linux) missing";
  ToolRun r =
      run_shell("script -qec '" + std::string(ZINF_TOOL_PATH) + " tune --dir " + dir.path() +
                " --time-budget 1 --block-sizes 256K --queue-depths 4 --backends "
                "threads' /dev/null");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("\rzinf tune: 1/"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" passes (", r.out.find("\rzinf tune: 1/")), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" GB/s"), std::string::npos) << r.out;
}

TEST(TuneCli, WarnsWhenMemlockIsBelowThePinnedBudget) {
  zinf::test::TestDir dir;
  // Without CAP_IPC_LOCK (root has it) the limit applies; setpriv drops it for the child.
  if (run_shell("command -v setpriv").status != 0) GTEST_SKIP() << "setpriv not installed";
  ToolRun r = run_shell("ulimit -l 8192 && setpriv --inh-caps -ipc_lock --bounding-set -ipc_lock " +
                        std::string(ZINF_TOOL_PATH) + " tune --dir " + dir.path() +
                        " --time-budget 1 --block-sizes 1M --queue-depths 4 --backends threads");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("zinf tune: warning: memlock limit 8 MiB (RLIMIT_MEMLOCK) is below the "
                       "pinned budget 2.0 GiB: io_uring buffer registration will be refused and "
                       "I/O runs unregistered; raise it (ulimit -l, LimitMEMLOCK= in systemd, "
                       "--ulimit memlock=-1 in docker)\n"),
            std::string::npos)
      << r.out;
}

TEST(TuneCli, BadArgumentsExit2WithOneLine) {
  ToolRun r = run_zinf("tune");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.out,
            "zinf tune: error: --dir is required (a directory on the drive to tune; repeatable)\n");
  r = run_zinf("tune --dir /nonexistent/zinf-nowhere");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.out, "zinf tune: error: directory does not exist: /nonexistent/zinf-nowhere\n");
  r = run_zinf("tune --dir /tmp --backends spdk");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.out,
            "zinf tune: error: invalid --backends entry 'spdk': expected uring or threads\n");
}

TEST(PlanCli, BadArgumentsExit2WithOneLine) {
  ToolRun r = run_zinf("plan --params 13B --gpus 12 --tp 8");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.out,
            "zinf plan: error: --gpus 12 is not divisible by --tp 8 x --pp 1 = 8: the "
            "data-parallel degree GPUs / (TP x PP) must be a whole number\n");
  r = run_zinf("plan");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.out, "zinf plan: error: --params is required (e.g. --params 13B)\n");
  r = run_zinf("plan --params 13B --offload-optimizer disk");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.out,
            "zinf plan: error: invalid --offload-optimizer 'disk': expected none, cpu or nvme\n");
  r = run_zinf("plan --params 13B --seq-len 2048");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.out,
            "zinf plan: error: activation memory needs all of --seq-len, --hidden, --layers, "
            "--micro-batch and --heads (each at least 1)\n");
}

TEST(PlanCli, RecommendsAndPrintsTheTable) {
  ToolRun r = run_zinf("plan --params 7.5B --gpus 64 --gpu-mem 20GB");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("recommended: zero-2 optimizer=none params=none (GPU 16.6 GB of 20.0"),
            std::string::npos)
      << r.out;
}

// The default table fits 100 columns and explains its columns; --wide is the full one.
TEST(PlanCli, NarrowTableFitsOneHundredColumnsAndWideHasEveryColumn) {
  const std::string args =
      "plan --params 13B --gpus 8 --gpu-mem 40GB --cpu-mem 256GB --nvme-free 2TB --seq-len 2048 "
      "--hidden 5120 --layers 40 --heads 40 --micro-batch 1 --activation-checkpointing";
  ToolRun r = run_zinf(args);
  ASSERT_EQ(r.status, 0) << r.out;
  const std::size_t from = r.out.find(
      "\nstage opt   par        GPU  host/node  NVMe/node   "
      "r+w/step    I/O s  fits\n");
  const std::string legend_end = "--wide shows every column.\n";
  const std::size_t to = r.out.find(legend_end);
  ASSERT_NE(from, std::string::npos) << r.out;
  ASSERT_NE(to, std::string::npos) << r.out;
  std::istringstream table(r.out.substr(from + 1, to + legend_end.size() - from - 1));
  int lines = 0;
  for (std::string line; std::getline(table, line); ++lines) {
    EXPECT_LE(line.size(), 100u) << line;
  }
  EXPECT_EQ(lines, 1 + 10 + 5);  // header, the ten candidate setups, the legend
  EXPECT_NE(r.out.find("\n3     nvme  none       7.3      410.0      156.0      312.0      n/a  "
                       "no: host > 256.0\n"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("params    grads"), std::string::npos) << r.out;

  ToolRun w = run_zinf(args + " --wide");
  ASSERT_EQ(w.status, 0) << w.out;
  EXPECT_NE(w.out.find("stage opt-> par->   params    grads    optim   states    live   activ GPU "
                       "total  host/node  NVMe/node  NVMe r+w/st  I/O s/st  fits\n"),
            std::string::npos)
      << w.out;
  EXPECT_NE(w.out.find("no: host needs 410.0 GB per node > --cpu-mem 256.0 GB\n"),
            std::string::npos)
      << w.out;
  EXPECT_EQ(w.out.find(legend_end), std::string::npos) << w.out;
  // The rest of the output is the same either way.
  EXPECT_NE(w.out.find("recommended: zero-3 optimizer=none params=none"), std::string::npos);
}

// A warning line when a setup's NVMe time per step is more than 3x the compute time: the
// recommended setup's, or every setup's without a recommendation; none at or under 3x.
TEST(PlanCli, WarnsWhenTheNvmeTimeIsMoreThanThreeTimesTheCompute) {
  zinf::test::TestDir dir;
  const std::string rep = dir.file("tune.json");
  std::ofstream(rep) << R"({"chosen": {"read_gbps": 2, "write_gbps": 2, "mixed_gbps": 1}})";
  // 7B, optimizer on NVMe: 84 GB read + 84 GB written per step at 1 GB/s mixed = 168 s.
  const std::string args =
      "plan --params 7B --gpus 1 --gpu-mem 24G --cpu-mem 64G --nvme-free 2T "
      "--tune " +
      rep;
  ToolRun r = run_zinf(args + " --compute-time 10s");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("\nwarning: zero-3 optimizer=nvme params=none: NVMe I/O of 168.00 s per "
                       "step is 16.8x the 10.00 s of compute (more than 3x): the GPU waits on the "
                       "drive\n"),
            std::string::npos)
      << r.out;
  // One line: the recommended setup's only.
  EXPECT_EQ(r.out.find("warning:", r.out.find("warning:") + 1), std::string::npos) << r.out;
  r = run_zinf(args + " --compute-time 56s");  // exactly 3x: no warning
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(r.out.find("warning:"), std::string::npos) << r.out;
  r = run_zinf(args + " --compute-time 10s --json");
  ASSERT_EQ(r.status, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["compute_seconds_per_step"], 10.0);
  ASSERT_EQ(j["warnings"].size(), 1u) << r.out;
  // Without a recommendation (no --gpu-mem), every NVMe setup over 3x has its line.
  r = run_zinf("plan --params 7B --gpus 1 --tune " + rep + " --compute-time 10s");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("warning: zero-3 optimizer=nvme params=none: "), std::string::npos);
  EXPECT_NE(r.out.find("warning: zero-3 optimizer=nvme params=nvme: "), std::string::npos);
}

// Links planted at every name tune used to give its files (the fixed test file name, the
// O_DIRECT and write probes named after its pid) are not followed; a link at the --out name
// is replaced by the config, never written through.
TEST(TuneCli, FollowsNoLinkPlantedAtItsNamesAndReplacesALinkAtOut) {
  zinf::test::TestDir dir;
  const std::string work = dir.subdir("work");
  const std::string out_dir = dir.subdir("out");
  const Victims v = make_victims(dir.subdir("victims"));
  const Victims out_victim = make_victims(dir.subdir("out-victim"));
  ASSERT_EQ(::symlink(out_victim.existing.c_str(), (out_dir + "/zinf.json").c_str()), 0);
  std::vector<std::string> planted;
  ToolProcess p = spawn_tool(
      ZINF_TOOL_PATH,
      {"tune", "--dir", work, "--time-budget", "2", "--block-sizes", "256K", "--queue-depths", "8",
       "--backends", "threads", "--out", out_dir + "/zinf.json", "--json"},
      [&](pid_t pid) {
        planted = {"zinf-tune.0.dat", ".zinf-tune-direct-" + std::to_string(pid),
                   ".zinf-write-probe-" + std::to_string(pid)};
        plant_links(work, planted, v);
      });
  const ToolEnd e = wait_tool(p);
  EXPECT_EQ(e.status, 0) << e.out;
  EXPECT_EQ(victims_changed(v), "");
  EXPECT_EQ(victims_changed(out_victim), "");
  std::sort(planted.begin(), planted.end());
  EXPECT_EQ(dir_entries(work), planted);
  struct stat st {};
  ASSERT_EQ(::lstat((out_dir + "/zinf.json").c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode)) << "the link at --out should have been replaced by a file";
  EXPECT_NE(slurp(out_dir + "/zinf.json").find("\"aio\""), std::string::npos);
  EXPECT_EQ(dir_entries(out_dir), std::vector<std::string>{"zinf.json"});  // no temporary left
}

TEST(TuneCli, SignalsStopTheSweepAndLeaveNothingBehind) {
  zinf::test::TestDir dir;
  zinf::test::expect_signals_stop_cleanly(
      ZINF_TOOL_PATH, "tune",
      // Many settings: the sweep outlasts the delay whatever the drive's speed.
      {"--time-budget", "60", "--block-sizes", "256K,512K,1M", "--queue-depths", "4,8,16",
       "--backends", "threads"},
      dir.path(), 100, 600);
}

}  // namespace
