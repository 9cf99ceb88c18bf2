// SPDX-License-Identifier: Apache-2.0
// End-to-end checks of the zinf tool as a user runs it: exit status, the one-line errors for
// bad arguments and hostile configs, and small verified `bench io` and `bench prefetch` runs
// with their JSON.
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/test_dir.h"
#include "support/tool_process.h"
#include "support/tool_run.h"

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

TEST(ZinfCli, NoArgumentsPrintsUsageAndExits2) {
  ToolRun r = run_zinf("");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.out.find("usage: zinf <command>"), std::string::npos) << r.out;
}

TEST(ZinfCli, UnknownCommandExits2) {
  ToolRun r = run_zinf("frobnicate");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.out.find("zinf: unknown command 'frobnicate'"), std::string::npos) << r.out;
}

TEST(ZinfCli, MistypedCommandsGetTheNearestOne) {
  const std::pair<const char*, const char*> table[] = {
      {"bnech io", "zinf: unknown command 'bnech' (did you mean 'bench'?)"},
      {"dmeo", "zinf: unknown command 'dmeo' (did you mean 'demo'?)"},
      {"tnue --dir x", "zinf: unknown command 'tnue' (did you mean 'tune'?)"},
      {"bench stpe", "zinf: unknown command 'bench stpe' (did you mean 'bench step'?)"},
      {"io", "zinf: unknown command 'io' (did you mean 'bench io'?)"},
      {"frobnicate", "zinf: unknown command 'frobnicate'\n"},
  };
  for (const auto& [args, line] : table) {
    ToolRun r = run_zinf(args);
    EXPECT_EQ(r.status, 2) << args;
    EXPECT_EQ(r.out.rfind(line, 0), 0u) << args << ": " << r.out;
  }
}

// `zinf help X` is `zinf X --help`, for every command, on stdout with status 0.
TEST(ZinfCli, HelpXIsXDashDashHelp) {
  for (const char* cmd : {"demo", "plan", "tune", "stress", "bench io", "bench adam", "bench step",
                          "bench prefetch", "bench"}) {
    ToolRun a = run_zinf(std::string("help ") + cmd, false);
    ToolRun b = run_zinf(std::string(cmd) + " --help", false);
    EXPECT_EQ(a.status, 0) << cmd;
    EXPECT_EQ(b.status, 0) << cmd;
    EXPECT_EQ(a.out, b.out) << cmd;
    EXPECT_EQ(a.out.rfind(std::string("usage: zinf ") + cmd, 0), 0u) << a.out;
  }
  ToolRun r = run_zinf("help", false);
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.out.rfind("usage: zinf <command>", 0), 0u) << r.out;
}

// `zinf bench` alone lists the benchmarks on stderr with status 2, as `zinf` alone does.
// bench h2d on the host simulation: one JSON document with every size and kind, marked as
// simulated with the note saying what the figures are; bad sizes are one-line usage errors.
TEST(ZinfCli, BenchH2dSaysWhatItMeasuredOnTheSimulation) {
  ToolRun r = run_zinf("bench h2d --device host --sizes 64K,1M --repeat 2 --json", false);
  ASSERT_EQ(r.status, 0) << r.out;
  for (const char* key : {"\"bench\":\"h2d\"", "\"device\":\"host\"", "\"simulated\":true",
                          "\"bytes\":65536", "\"bytes\":1048576", "\"h2d_pinned_gbps\":",
                          "\"d2h_pinned_gbps\":", "\"h2d_pageable_gbps\":",
                          "\"d2h_pageable_gbps\":", "not a PCIe link"}) {
    EXPECT_NE(r.out.find(key), std::string::npos) << key << " in " << r.out;
  }
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << "one JSON document";
  r = run_zinf("bench h2d --device host --sizes 64K,0");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.out.find("invalid --sizes: a size of 0 in '64K,0'"), std::string::npos) << r.out;
}

// `--gpu-mem 40` read as 40 bytes advised activation checkpointing; a memory limit without a
// unit is refused with the reading the user meant.
TEST(ZinfCli, PlanMemoryWithoutAUnitSuggestsGigabytes) {
  for (const char* flag : {"--gpu-mem", "--cpu-mem", "--nvme-free"}) {
    ToolRun r = run_zinf(std::string("plan --params 7B --gpus 8 ") + flag + " 40");
    EXPECT_EQ(r.status, 2) << flag;
    EXPECT_NE(r.out.find(std::string("invalid ") + flag +
                         " '40': a memory size needs a unit; did you mean 40G?"),
              std::string::npos)
        << r.out;
  }
  ToolRun ok = run_zinf("plan --params 7B --gpus 8 --gpu-mem 40G --cpu-mem 64G --nvme-free 2T");
  EXPECT_EQ(ok.status, 0) << ok.out;
  EXPECT_NE(ok.out.find("recommended:"), std::string::npos) << ok.out;
}

// --nodes N is N x --gpus-per-node GPUs; a --gpus that says otherwise is refused, naming both.
// With more than one rank the collectives per step are printed below the table.
TEST(ZinfCli, PlanNodesCountGpusAndShowTheCollectives) {
  ToolRun r = run_zinf("plan --params 13B --nodes 2 --gpus-per-node 8");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("16 GPUs (TP 1 x PP 1 x DP 16), 8 GPUs per node, 2 nodes"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("collectives per step, received per GPU (x8 per node): stage 0 48.75 GB; "
                       "stage 1 73.12 GB (24.38 GB of it parameter all-gathers); stage 2 48.75 GB "
                       "(24.38 GB of it parameter all-gathers); stage 3 73.12 GB (48.75 GB of it "
                       "parameter all-gathers)"),
            std::string::npos)
      << r.out;
  r = run_zinf("plan --params 13B --nodes 2 --gpus 8");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.out.find("--gpus 8 is not --nodes 2 x --gpus-per-node 8 = 16: give one of them"),
            std::string::npos)
      << r.out;
}

// The recommendation comes as the zero_optimization block a DeepSpeed user pastes; when nothing
// fits, the message names the limit that even the most offloaded setup exceeds.
TEST(ZinfCli, PlanPrintsTheConfigBlockAndNamesTheLimitWhenNothingFits) {
  ToolRun r = run_zinf("plan --params 7B --gpus 1 --gpu-mem 24G --cpu-mem 64G --nvme-free 2T");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("recommended: zero-3 optimizer=nvme params=none"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("{\n  \"zero_optimization\": {\n    \"stage\": 3,\n    "
                       "\"offload_optimizer\": {\n      \"device\": \"nvme\","),
            std::string::npos)
      << r.out;
  r = run_zinf("plan --params 7B --gpus 1 --gpu-mem 24G --cpu-mem 64G --nvme-free 2T --tbw 600TB "
               "--step-seconds 30");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("drive wear: 84.0 GB written per step per node, 241.9 TB per day at 30.00 "
                       "s/step; 600 TB of endurance lasts 2.5 days of training (1% every 0.6 "
                       "hours)"),
            std::string::npos)
      << r.out;
  // Endurance without a unit, and wear asked for without a step time: each says what to give.
  r = run_zinf("plan --params 7B --gpus 1 --tbw 600");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.out.find("invalid --tbw '600': a memory size needs a unit; did you mean 600TB?"),
            std::string::npos)
      << r.out;
  r = run_zinf("plan --params 7B --gpus 1 --gpu-mem 24G --cpu-mem 64G --nvme-free 2T --tbw 600TB");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("drive wear: give --step-seconds (or --tune for the I/O time) to estimate "
                       "drive wear"),
            std::string::npos)
      << r.out;
  r = run_zinf("plan --params 70B --gpus 1 --gpu-mem 1G");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("nothing fits: even zero-3 optimizer=nvme params=nvme does not (GPU needs "),
            std::string::npos)
      << r.out;
}

// --largest on the consumer box of docs/consumer.md (figures: PlanModel.LargestModelOnAConsumerBox),
// and the PCIe rate read from `zinf bench h2d --json` (its largest size) for the step bound and
// the prefetch advice.
TEST(ZinfCli, PlanLargestAndH2dReport) {
  ToolRun r = run_zinf(
      "plan --gpu-mem 24G --cpu-mem 64G --nvme-free 2T --host-reserve 8G --nvme-gbps 3 "
      "--h2d-gbps 25 --sub-group-size 100000000 --largest");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("nvme  nvme  3        27.16B      2.0       60.1      380.3   271.65     "
                       "4.35  --cpu-mem"),
            std::string::npos)
      << r.out;
  r = run_zinf(
      "plan --gpu-mem 24G --cpu-mem 64G --nvme-free 2T --host-reserve 8G --nvme-gbps 3 "
      "--h2d-gbps 25 --largest --json");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("\"largest\":["), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"limit\":\"host needs 60.1 GB per node pinned + 8.6 GB reserve > "
                       "--cpu-mem 68.7 GB\""),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("\"pcie_seconds_per_step\":0.89"), std::string::npos) << r.out;
  zinf::test::TestDir dir;
  const std::string rep = dir.file("h2d.json");
  std::ofstream(rep) << R"({"bench": "h2d", "device": "cuda", "simulated": false, "sizes": [
      {"bytes": 1048576, "h2d_pinned_gbps": 5.0, "d2h_pinned_gbps": 5.0},
      {"bytes": 268435456, "h2d_pinned_gbps": 24.0, "d2h_pinned_gbps": 20.0}]})";
  r = run_zinf(
      "plan --params 13B --gpu-mem 24G --cpu-mem 64G --nvme-free 2T --nvme-gbps 6 "
      "--sub-group-size 100000000 --offload-optimizer nvme --offload-params nvme "
      "--layer-params 300M --compute-time 60s --h2d " +
      rep);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("PCIe: 24.00 GB/s host->device, 20.00 GB/s device->host per GPU\n"),
            std::string::npos)
      << r.out;
  // 0.6 GB a layer: 0.1 s from the drive, 0.025 s over the link; 60 s / (3 x 43.3 layers) =
  // 0.4615 s of forward compute per layer hides the 0.125 s with one layer of read-ahead.
  EXPECT_NE(r.out.find("prefetch: a layer of 0.60 GB takes 0.100 s from NVMe + 0.025 s over "
                       "PCIe; behind 0.462 s of forward compute per layer, prefetch_depth 1 "
                       "hides it"),
            std::string::npos)
      << r.out;
  std::ofstream(rep) << R"({"sizes": []})";
  r = run_zinf("plan --params 13B --gpu-mem 24G --h2d " + rep);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.out.find("not a zinf bench h2d --json report"), std::string::npos) << r.out;
}

TEST(ZinfCli, BenchAloneListsTheBenchmarks) {
  ToolRun r = run_zinf("bench", false);
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.out, "");  // nothing on stdout
  r = run_zinf("bench");
  EXPECT_EQ(r.out.rfind("zinf bench: which benchmark?\n", 0), 0u) << r.out;
  for (const char* b :
       {"zinf bench io ", "zinf bench adam ", "zinf bench step ", "zinf bench prefetch ",
        "zinf bench h2d "}) {
    EXPECT_NE(r.out.find(b), std::string::npos) << b << " in " << r.out;
  }
}

// Every --help lists every option in one format: `  --name VALUE  text [default]`, or a switch
// without a value and without a default. The options are the ones the command accepts.
TEST(ZinfCli, EveryHelpListsEveryOptionWithItsDefault) {
  for (const char* cmd : {"demo", "plan", "tune", "stress", "bench io", "bench adam", "bench step",
                          "bench prefetch", "bench h2d"}) {
    ToolRun r = run_zinf(std::string(cmd) + " --help", false);
    ASSERT_EQ(r.status, 0) << cmd;
    std::istringstream lines(r.out);
    int options = 0;
    std::string pending;  // an option line whose default is still to come
    for (std::string line; std::getline(lines, line);) {
      const bool option = line.rfind("  --", 0) == 0 || line.rfind("  -h, --help", 0) == 0;
      if (option) {
        EXPECT_TRUE(pending.empty()) << cmd << ": no [default] for " << pending;
        pending.clear();
        ++options;
        // "  --name VALUE": upper-case value name (or P,G,O / on|off) after the name.
        const std::string head = line.substr(2, line.find("  ", 2) - 2);
        const bool has_value = head.find(' ') != std::string::npos && head != "-h, --help";
        if (has_value) pending = line;
      }
      if (!pending.empty() && line.find('[') != std::string::npos && line.back() == ']') {
        pending.clear();
      }
    }
    EXPECT_TRUE(pending.empty()) << cmd << ": no [default] for " << pending;
    EXPECT_GT(options, 2) << cmd << ":\n" << r.out;
  }
}

TEST(ZinfCli, FioNamesMapOrNameTheZinfOption) {
  ToolRun r = run_zinf("bench io --rw randwirte");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.out,
            "zinf bench io: error: invalid --rw 'randwirte': expected read, write, randread, "
            "randwrite, rw or randrw (did you mean randwrite?)\n");
  r = run_zinf("bench io --numjobs 4");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.out.find("--queue-depth"), std::string::npos) << r.out;
  // A mapped name's value goes through the grammar under the zinf name.
  r = run_zinf("bench io --bs 4Q");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.out,
            "zinf bench io: error: invalid --block-size '4Q': expected a size such as 4096, 512K, "
            "1M, 2GiB or 1e8\n");
  r = run_zinf("bench io --iodepth 0x4");
  EXPECT_EQ(r.out,
            "zinf bench io: error: invalid --queue-depth '0x4': expected an integer in [0, "
            "18446744073709551615]\n");
  r = run_zinf("stress --runtime 10parsecs");
  EXPECT_EQ(r.out,
            "zinf stress: error: invalid --duration '10parsecs': expected a duration such as "
            "250ms, 10s, 5m or 1h\n");
  zinf::test::TestDir dir;
  r = run_zinf("tune --dir " + dir.path() + " --bs 4Q");
  EXPECT_EQ(r.out,
            "zinf tune: error: invalid --block-sizes '4Q': expected a size such as 4096, 512K, "
            "1M, 2GiB or 1e8\n");
  r = run_zinf("bench adam --iodepth 4");
  EXPECT_EQ(r.out,
            "zinf bench adam: error: --iodepth (fio's or ds_io's name) has no counterpart in "
            "'zinf bench adam'; its options are listed by 'zinf bench adam --help'\n");
}

// One grammar for every command: the counts and sizes the issue found refused in one command
// and accepted in another.
TEST(ZinfCli, OneGrammarAcrossCommands) {
  ToolRun r = run_zinf("bench adam --numel 20M --steps 0");
  EXPECT_EQ(r.out, "zinf bench adam: error: --steps must be at least 1\n");  // --numel taken
  r = run_zinf("bench adam --numel 1e8 --steps 1e0 --threads 1.5");
  EXPECT_EQ(r.out,
            "zinf bench adam: error: invalid --threads '1.5': expected an integer in [0, "
            "1024]\n");
  r = run_zinf("tune --dir /nonexistent/zinf-nowhere --time-budget 60s");
  EXPECT_EQ(r.out, "zinf tune: error: directory does not exist: /nonexistent/zinf-nowhere\n");
  r = run_zinf("stress --budget 64mb --duration 1.5.2s");
  EXPECT_EQ(r.out,
            "zinf stress: error: invalid --duration '1.5.2s': expected a duration such as "
            "250ms, 10s, 5m or 1h\n");
  r = run_zinf("bench io --size -1");
  EXPECT_EQ(r.out,
            "zinf bench io: error: invalid --size '-1': expected a size such as 4096, 512K, 1M, "
            "2GiB or 1e8\n");
}

// --json is one document, fio-like ({"jobs": [...], "host": {...}}), that a JSON parser reads
// whole; --json-lines streams one complete object per op. A timed write says it is an overwrite.
TEST(ZinfCli, BenchIoJsonIsOneDocumentAndJsonLinesStreams) {
  zinf::test::TestDir dir;
  const std::string base = "bench io --dir " + dir.path() + " --size 2M --block-size 64K --loops 1";
  ToolRun r = run_zinf(base + " --json", false);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  EXPECT_EQ(r.out.rfind("{\"jobs\":[{\"op\":\"write\",\"overwrite\":true,", 0), 0u) << r.out;
  EXPECT_NE(r.out.find("{\"op\":\"read\","), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("],\"host\":{\"files\":1,"), std::string::npos) << r.out;
  ToolRun check = run_shell("printf '%s' '" + r.out + "' | /usr/bin/python3 -m json.tool");
  EXPECT_EQ(check.status, 0) << check.out;
  r = run_zinf(base + " --json-lines", false);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 2) << r.out;
  EXPECT_EQ(r.out.rfind("{\"op\":\"write\"", 0), 0u) << r.out;
  EXPECT_NE(r.out.find("\"file_system\":"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"usr_s_per_gb\":"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"sys_s_per_gb\":"), std::string::npos) << r.out;
  r = run_zinf(base);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("write (overwrite)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("usr s/GB  sys s/GB"), std::string::npos) << r.out;
  // On tmpfs the figures are memory's: said once, on stderr.
  r = run_zinf("bench io --dir /dev/shm --size 1M --block-size 64K --loops 1 --json");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("zinf bench io: warning: /dev/shm is on tmpfs: the figures are those of "
                       "memory, a container layer or a network, not of a drive"),
            std::string::npos)
      << r.out;
}

// --repeat runs fresh benches one after another and reports each run's rate and the spread:
// the JSON job carries every run and its figures are the median run's; the table says so.
TEST(ZinfCli, BenchIoRepeatReportsEveryRunAndTheSpread) {
  zinf::test::TestDir dir;
  const std::string base =
      "bench io --dir " + dir.path() + " --size 2M --block-size 64K --loops 1 --op read --repeat 3";
  ToolRun r = run_zinf(base + " --json", false);
  ASSERT_EQ(r.status, 0) << r.out;
  const nlohmann::json doc = nlohmann::json::parse(r.out);
  ASSERT_EQ(doc["jobs"].size(), 1u) << r.out;
  const nlohmann::json& job = doc["jobs"][0];
  EXPECT_EQ(job["repeat"], 3) << r.out;
  std::vector<double> runs = job["gbps_runs"].get<std::vector<double>>();
  ASSERT_EQ(runs.size(), 3u) << r.out;
  std::sort(runs.begin(), runs.end());
  EXPECT_EQ(job["gbps_min"].get<double>(), runs[0]);
  EXPECT_EQ(job["gbps"].get<double>(), runs[1]);
  EXPECT_EQ(job["gbps_max"].get<double>(), runs[2]);
  r = run_zinf(base);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find(" repeat=3\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("over 3 runs (fresh engine, buffers and files each; the rows above are "
                       "the median run's):\n  read            min "),
            std::string::npos)
      << r.out;
  r = run_zinf("bench io --dir " + dir.path() + " --repeat 0");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("zinf bench io: error: invalid --repeat '0': expected an integer in [1, "
                       "1000]"),
            std::string::npos)
      << r.out;
}

// Integer options are range-checked against what they feed, never truncated: --threads
// 4294967297 used to become 1 thread.
TEST(ZinfCli, IntegerOptionsOutOfRangeExit2NamingTheRange) {
  zinf::test::TestDir dir;
  ToolRun r = run_zinf("bench io --dir " + dir.path() +
                       " --size 1M --block-size 64K --loops 1 --threads 4294967297");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.out,
            "zinf bench io: error: invalid --threads '4294967297': expected an integer in "
            "[0, 4294967295]\n");
  r = run_zinf("bench adam --numel 4096 --steps 1 --threads 18446744073709551617");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.out,
            "zinf bench adam: error: invalid --threads '18446744073709551617': expected "
            "an integer in [0, 1024]\n");
  for (const char* bad : {"-1", "0x10", "3abc", "1.5"}) {
    r = run_zinf(std::string("demo --layers ") + bad);
    EXPECT_EQ(r.status, 2) << bad;
    EXPECT_EQ(r.out, std::string("zinf demo: error: invalid --layers '") + bad +
                         "': expected an integer in [0, 18446744073709551615]\n");
  }
}

// An empty value (a script's unset variable: `--save "$CKPT"`) is a usage error, not "no value":
// the run would otherwise train without saving and exit 0.
TEST(ZinfCli, EmptyValuesExit2NamingTheOption) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"demo --steps 1 --layers 2 --hidden 64 --save ''", "--save"},
      {"demo --steps 1 --layers 2 --hidden 64 --resume ''", "--resume"},
      {"demo --steps 1 --layers 2 --hidden 64 --config ''", "--config"},
      {"demo --steps 1 --layers 2 --hidden 64 --weights-out ''", "--weights-out"},
      {"demo --steps 1 --layers 2 --hidden 64 --dir ''", "--dir"},
      {"demo --steps 1 --layers 2 --hidden 64 --offload ''", "--offload"},
      {"tune --out ''", "--out"},
      {"tune --plot ''", "--plot"},
      {"bench io --dir ''", "--dir"},
      {"bench step --dir '' --numel 1M --steps 1", "--dir"},
  };
  for (const auto& [args, option] : cases) {
    const ToolRun r = run_zinf(args);
    EXPECT_EQ(r.status, 2) << args << "\n" << r.out;
    EXPECT_NE(r.out.find("invalid " + option + " '': the value is empty"), std::string::npos)
        << args << "\n" << r.out;
  }
  const ToolRun r = run_zinf("demo --steps 1 --save=");  // the = form: a missing value
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_EQ(r.out, "zinf demo: error: option --save needs a value\n");
}

// Every config error is a usage error (exit 2) naming the file, never a crash, a hang or exit 1.
TEST(ZinfCli, HostileConfigsExit2NamingTheFile) {
  zinf::test::TestDir dir;
  const std::string deep = dir.file("deep.json");
  std::ofstream(deep) << std::string(100000, '[');
  ToolRun r = run_zinf("demo --config " + deep);
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_EQ(r.out, "zinf demo: error: " + deep +
                       ": line 1, column 65: nesting deeper than 64 "
                       "levels of objects and arrays (the limit of a config)\n");

  const std::string lr = dir.file("lr.json");
  std::ofstream(lr) << R"({"optimizer": {"params": {"lr": 1e309}}})";
  r = run_zinf("demo --config " + lr);
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_EQ(r.out, "zinf demo: error: " + lr +
                       ": line 1, column 33: optimizer.params.lr: number "
                       "out of range (1e309 is beyond a double's +-1.8e308)\n");

  const std::string eps = dir.file("eps.json");
  std::ofstream(eps) << R"({"optimizer": {"params": {"eps": 0}}})";
  r = run_zinf("demo --config " + eps);
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_EQ(r.out, "zinf demo: error: " + eps +
                       ": optimizer.params.eps: must be in [1e-45, "
                       "3.4028235e+38], got 0\n");

  // A FIFO: `timeout` ends the tool (status 124) if it blocks waiting for a writer.
  const std::string fifo = dir.file("config.fifo");
  ASSERT_EQ(run_shell("mkfifo " + fifo).status, 0);
  r = run_shell("timeout 20 " + std::string(ZINF_TOOL_PATH) + " demo --config " + fifo);
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_EQ(r.out, "zinf demo: error: " + fifo +
                       ": the config is a FIFO, not a regular file; give a JSON file\n");
  // A device is refused for what it is (config_test reads /dev/zero with bounded memory).
  r = run_zinf("demo --config /dev/null");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_EQ(r.out,
            "zinf demo: error: /dev/null: the config is a character device, not a "
            "regular file; give a JSON file\n");
}

// The planner's report files are user-named paths too: a FIFO once blocked `zinf plan --tune`
// in open for ever; it and a device are refused at once (exit 2), a missing file names errno.
TEST(ZinfCli, PlanReportFilesThatAreNotFilesExit2WithoutBlocking) {
  zinf::test::TestDir dir;
  const std::string fifo = dir.file("tune.fifo");
  ASSERT_EQ(run_shell("mkfifo " + fifo).status, 0);
  const std::string plan = std::string(ZINF_TOOL_PATH) + " plan --params 7B --gpus 1 ";
  ToolRun r = run_shell("timeout 20 " + plan + "--tune " + fifo);
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_EQ(r.out, "zinf plan: error: " + fifo + ": the --tune file is a FIFO, not a regular file\n");
  r = run_shell("timeout 20 " + plan + "--h2d /dev/zero");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_EQ(r.out,
            "zinf plan: error: /dev/zero: the --h2d file is a character device, not a regular "
            "file\n");
  r = run_shell(plan + "--tune " + dir.file("missing.json"));
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_NE(r.out.find(dir.file("missing.json")), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("ENOENT"), std::string::npos) << r.out;
}

TEST(BenchIoCli, MissingDirectoryExits2WithOneLine) {
  ToolRun r = run_zinf("bench io --dir /nonexistent/zinf-nowhere");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.out, "zinf bench io: error: directory does not exist: /nonexistent/zinf-nowhere\n");
}

TEST(BenchIoCli, DirectoryThatIsAFileExits2) {
  zinf::test::TestDir dir;
  std::string f = dir.file("plain");
  std::FILE* fp = std::fopen(f.c_str(), "w");
  ASSERT_NE(fp, nullptr);
  std::fclose(fp);
  ToolRun r = run_zinf("bench io --dir " + f);
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.out, "zinf bench io: error: not a directory: " + f + "\n");
}

TEST(BenchIoCli, UnparseableSizeExits2) {
  zinf::test::TestDir dir;
  ToolRun r = run_zinf("bench io --dir " + dir.path() + " --size 12Q");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.out,
            "zinf bench io: error: invalid --size '12Q': expected a size such as 4096, 512K, 1M, "
            "2GiB or 1e8\n");
}

TEST(BenchIoCli, SizeBelowOneBlockPerFileExits2AndLeavesNoFile) {
  zinf::test::TestDir dir;
  ToolRun r = run_zinf("bench io --dir " + dir.path() + " --dir " + dir.path() + " --size 1M");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.out,
            "zinf bench io: error: --size 1048576 is smaller than one block per file "
            "(2097152 bytes)\n");
  EXPECT_FALSE(std::ifstream(dir.path() + "/zinf-bench-io.0.dat").good());
}

TEST(BenchIoCli, UnalignedBlockSizeExits2) {
  zinf::test::TestDir dir;
  ToolRun r = run_zinf("bench io --dir " + dir.path() + " --block-size 1000");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.out,
            "zinf bench io: error: invalid --block-size 1000: must be a multiple of 4096 (the "
            "direct-I/O alignment zinf uses)\n");
}

TEST(BenchIoCli, BufferBytesBelowTheQueueOrUnalignedExits2) {
  zinf::test::TestDir dir;
  for (const char* bad : {"8M", "16781312"}) {
    ToolRun r =
        run_zinf("bench io --dir " + dir.path() + " --queue-depth 16 --buffer-bytes " + bad);
    EXPECT_EQ(r.status, 2);
    EXPECT_EQ(r.out, std::string("zinf bench io: error: invalid --buffer-bytes ") +
                         (bad[0] == '8' ? "8388608" : "16781312") +
                         ": must be a multiple of --block-size and at least queue depth x block "
                         "size (16777216)\n");
  }
}

TEST(BenchIoCli, UnknownOptionSuggests) {
  ToolRun r = run_zinf("bench io --queue-dept 4");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.out,
            "zinf bench io: error: unknown option '--queue-dept' for 'bench io' (did you mean "
            "--queue-depth?)\n");
}

TEST(BenchIoCli, BadEngineExits2) {
  zinf::test::TestDir dir;
  ToolRun r = run_zinf("bench io --dir " + dir.path() + " --engine spdk");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.out.find("spdk"), std::string::npos) << r.out;
}

TEST(BenchIoCli, SmallVerifiedRunOverTwoDirsPrintsJson) {
  zinf::test::TestDir dir;
  std::string a = dir.subdir("a"), b = dir.subdir("b");
  for (const char* engine : {"threads", "auto"}) {
    ToolRun r = run_zinf("bench io --dir " + a + " --dir " + b + " --size 16M --block-size 256K " +
                         "--queue-depth 4 --loops 2 --json --engine " + engine);
    ASSERT_EQ(r.status, 0) << r.out;
    for (const char* key :
         {"\"op\":\"write\"", "\"op\":\"read\"", "\"engine\":", "\"bytes\":16777216",
          "\"seconds\":", "\"gbps\":", "\"iops\":", "\"lat_p50_us\":", "\"lat_p99_us\":",
          "\"block_size\":262144", "\"queue_depth\":4",
          "\"direct\":", "\"huge_pages\":", "\"verified\":true", "\"files\":2"}) {
      EXPECT_NE(r.out.find(key), std::string::npos) << key << " missing in " << r.out;
    }
  }
  // Without --keep the data files are gone.
  EXPECT_FALSE(std::ifstream(a + "/zinf-bench-io.0.dat").good());
}

// --runtime (fio's name for --duration): a time-based run for that long over a small file,
// with the throughput per second inside its job of the one JSON document, the steady state and
// the cliff (none judged on two samples), and the sparkline in the text.
TEST(BenchIoCli, RuntimeKeepsGoingAndSamplesEachSecond) {
  zinf::test::TestDir dir;
  const std::string base = "bench io --dir " + dir.path() + " --size 8M --block-size 64K --runtime 2s";
  ToolRun r = run_zinf(base + " --op write --json", false);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  const nlohmann::json doc = nlohmann::json::parse(r.out);
  ASSERT_EQ(doc["jobs"].size(), 1u) << r.out;
  ASSERT_TRUE(doc["host"].is_object()) << r.out;
  const nlohmann::json& job = doc["jobs"][0];
  EXPECT_EQ(job["op"], "write");
  EXPECT_EQ(job["duration_s"], 2.0);
  EXPECT_EQ(job["loops"], 1);
  EXPECT_GE(job["seconds"].get<double>(), 2.0);  // no request goes out after 2 s, none before
  // Laps over the 8 MiB file: more bytes than the file whenever the disk is not stalled.
  EXPECT_GT(job["bytes"].get<std::uint64_t>(), 0u);
  EXPECT_EQ(job["bytes"].get<std::uint64_t>() % 65536, 0u);
  const nlohmann::json& samples = job["samples"];
  ASSERT_TRUE(samples.is_array()) << r.out;
  ASSERT_GE(samples.size(), 2u) << r.out;  // two whole seconds; a long drain may add a third
  ASSERT_LE(samples.size(), 3u) << r.out;
  std::uint64_t sampled = 0;
  for (const auto& x : samples) {
    for (const char* key : {"t_s", "seconds", "bytes", "gbps"}) {
      EXPECT_TRUE(x.contains(key)) << key << " missing in " << x;
    }
    sampled += x["bytes"].get<std::uint64_t>();
  }
  EXPECT_DOUBLE_EQ(samples[0]["t_s"].get<double>(), 1.0);
  EXPECT_LE(sampled, job["bytes"].get<std::uint64_t>());
  EXPECT_TRUE(job["steady_gbps"].is_number()) << r.out;
  EXPECT_TRUE(job["noise_gbps"].is_number()) << r.out;
  EXPECT_TRUE(job.contains("cliff") && job["cliff"].is_null()) << r.out;
  EXPECT_EQ(job["cliff_note"].get<std::string>().rfind("too few samples to judge a fall", 0), 0u)
      << r.out;
  r = run_zinf(base + " --rw read");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find(" duration=2s"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("read over time ("), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("steady state "), std::string::npos) << r.out;
  // --loops does not apply: a time-based run is one run.
  r = run_zinf(base + " --loops 2");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.out,
            "zinf bench io: error: --loops and --duration (fio's --runtime): a time-based run is "
            "one run per op; give one of them\n");
}

// Each of fio's --rw modes runs, verified, and reports its op(s): a mixed mode reports its
// reads and its writes as two jobs of the one run, with the share and seed it ran with.
// The progress line (elapsed, done/total, rate) is drawn only on a terminal: under ctest the
// output is a pipe, so neither the text nor the carriage returns that redraw it appear. On a
// pseudo-terminal (util-linux's `script`) a time-based run draws it, and --json silences it.
TEST(BenchIoCli, ProgressOnlyOnATerminalAndNeverWithJson) {
  zinf::test::TestDir dir;
  const std::string args = "bench io --dir " + dir.path() +
                           " --size 4M --block-size 256K --queue-depth 4 --op write --duration 1s";
  ToolRun r = run_zinf(args);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(r.out.find('\r'), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find('\x1b'), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("zinf bench io write:"), std::string::npos) << r.out;
  if (run_shell("command -v script").status != 0) GTEST_SKIP() << "script (util-linux) missing";
  const std::string tty =
      "script -qec '" + std::string(ZINF_TOOL_PATH) + " " + args + "' /dev/null";
  r = run_shell(tty);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("\rzinf bench io write: 0."), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("/1.0 s ("), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" GB/s"), std::string::npos) << r.out;
  r = run_shell("script -qec '" + std::string(ZINF_TOOL_PATH) + " " + args + " --json' /dev/null");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(r.out.find('\r'), r.out.find("\r\n")) << "only the terminal's line ends: " << r.out;
  EXPECT_EQ(r.out.find("zinf bench io write:"), std::string::npos) << r.out;
}

TEST(BenchIoCli, EveryRwModeRunsAndReportsItsOps) {
  zinf::test::TestDir dir;
  const std::uint64_t size = 4u << 20;
  const std::string base =
      "bench io --dir " + dir.path() + " --size 4M --block-size 64K --loops 1 --json --rw ";
  struct Mode {
    const char* rw;
    std::vector<std::string> ops;
    bool random;
  };
  for (const Mode& m : {Mode{"read", {"read"}, false}, Mode{"write", {"write"}, false},
                        Mode{"randread", {"read"}, true}, Mode{"randwrite", {"write"}, true},
                        Mode{"rw", {"write", "read"}, false},
                        Mode{"randrw --rwmixread 25 --seed 7", {"write", "read"}, true}}) {
    ToolRun r = run_zinf(base + m.rw, false);
    ASSERT_EQ(r.status, 0) << m.rw << ": " << r.out;
    const nlohmann::json doc = nlohmann::json::parse(r.out);
    const nlohmann::json& jobs = doc["jobs"];
    ASSERT_EQ(jobs.size(), m.ops.size()) << m.rw << ": " << r.out;
    std::uint64_t bytes = 0;
    for (std::size_t i = 0; i < m.ops.size(); ++i) {
      const nlohmann::json& j = jobs[i];
      EXPECT_EQ(j["op"], m.ops[i]) << m.rw;
      EXPECT_EQ(j["rw"], std::string(m.rw).substr(0, std::string(m.rw).find(' '))) << m.rw;
      EXPECT_EQ(j["random"], m.random) << m.rw;
      EXPECT_EQ(j["verified"], m.ops[i] == "read") << m.rw;
      bytes += j["bytes"].get<std::uint64_t>();
      if (m.ops.size() == 2) {
        EXPECT_EQ(j["rwmixread"], m.random ? 25 : 50) << m.rw;
        EXPECT_GT(j["bytes"].get<std::uint64_t>(), 0u) << m.rw << ": " << r.out;
      }
      if (m.random || m.ops.size() == 2) {
        EXPECT_EQ(j["seed"], std::string(m.rw).find("--seed 7") != std::string::npos ? 7 : 1)
            << m.rw;
      }
    }
    EXPECT_EQ(bytes, size) << m.rw << ": one lap, every block once";
  }
  ToolRun r = run_zinf("bench io --dir " + dir.path() + " --size 4M --block-size 64K --loops 1 --rw randrw");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find(" rw=randrw seed=1 rwmixread=50\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\nread (randrw) "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\nwrite (randrw) "), std::string::npos) << r.out;
}

TEST(BenchIoCli, BadModesExit2WithTheGrammarsError) {
  const std::pair<const char*, const char*> cases[] = {
      {"--rw randwirte",
       "invalid --rw 'randwirte': expected read, write, randread, randwrite, rw or randrw (did "
       "you mean randwrite?)"},
      {"--rw RandRead",
       "invalid --rw 'RandRead': expected read, write, randread, randwrite, rw or randrw (did "
       "you mean randread?)"},
      {"--op bth", "invalid --op 'bth': expected read, write or both (did you mean both?)"},
      {"--rw rw --rwmixread 101", "invalid --rwmixread '101': expected an integer in [0, 100]"},
      {"--rw randread --rwmixread 20",
       "--rwmixread applies to --rw rw or randrw (reads and writes mixed)"},
      {"--op read --rw randread",
       "--op read and --rw randread: give one of them (--rw takes all of fio's modes, --op the "
       "sequential ones)"},
  };
  for (const auto& [args, error] : cases) {
    ToolRun r = run_zinf(std::string("bench io ") + args);
    EXPECT_EQ(r.status, 2) << args;
    EXPECT_EQ(r.out, std::string("zinf bench io: error: ") + error + "\n");
  }
}

// The requests rotate over a footprint larger than the queue: still every byte verified.
TEST(BenchIoCli, LargerBufferFootprintIsVerifiedAndReported) {
  zinf::test::TestDir dir;
  ToolRun r = run_zinf("bench io --dir " + dir.path() +
                       " --size 8M --block-size 256K --queue-depth 2 "
                       "--buffer-bytes 3M --loops 1 --json --engine threads");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("\"buffer_bytes\":3145728"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"verified\":true"), std::string::npos) << r.out;
}

TEST(BenchPrefetchCli, SmallHostRunPrintsJsonWithTheKeys) {
  zinf::test::TestDir dir;
  ToolRun r = run_zinf("bench prefetch --dir " + dir.path() +
                       " --layers 4 --layer-bytes 256K --compute-ms 1 --depth 2 --passes 2 "
                       "--device host --json");
  ASSERT_EQ(r.status, 0) << r.out;
  for (const char* key :
       {"\"wall_seconds\":", "\"compute_seconds\":", "\"io_seconds\":", "\"stall_seconds\":",
        "\"depth\":2", "\"layers\":4", "\"layer_bytes\":262144", "\"wall_over_max\":", "\"hits\":",
        "\"late_layers\":", "\"device\":\"host\"", "\"verified\":true"}) {
    EXPECT_NE(r.out.find(key), std::string::npos) << key << " missing in " << r.out;
  }
  EXPECT_EQ(r.out.find('\n'), r.out.size() - 1) << "one JSON object, one line: " << r.out;
}

TEST(BenchPrefetchCli, DepthZeroRunsOnDemand) {
  zinf::test::TestDir dir;
  ToolRun r =
      run_zinf("bench prefetch --dir " + dir.path() +
               " --layers 3 --layer-bytes 64K --compute-ms 0.5 --depth 0 --passes 1 --json");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("\"depth\":0"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"hits\":0"), std::string::npos) << r.out;
}

TEST(BenchPrefetchCli, BadArgumentsExit2WithOneLine) {
  zinf::test::TestDir dir;
  ToolRun r = run_zinf("bench prefetch --dir " + dir.path() + " --layer-bytes 1000");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.out,
            "zinf bench prefetch: error: invalid --layer-bytes 1000: must be a positive "
            "multiple of 4096\n");
  r = run_zinf("bench prefetch --dir " + dir.path() + " --device tpu");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.out,
            "zinf bench prefetch: error: unknown device kind 'tpu' (expected auto, cuda or "
            "host)\n");
  r = run_zinf("bench prefetch --dir /nonexistent/zinf-nowhere");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.out,
            "zinf bench prefetch: error: directory does not exist: /nonexistent/zinf-nowhere\n");
  r = run_zinf("bench prefetch --dept 2");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.out,
            "zinf bench prefetch: error: unknown option '--dept' for 'bench prefetch' (did "
            "you mean --depth?)\n");
  r = run_zinf("bench prefetch --dir " + dir.path() + " --layers 0");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.out,
            "zinf bench prefetch: error: invalid --layers 0: must be between 1 and 100000\n");
}

TEST(BenchPrefetchCli, HelpExits0) {
  ToolRun r = run_zinf("bench prefetch --help");
  EXPECT_EQ(r.status, 0);
  EXPECT_NE(r.out.find("usage: zinf bench prefetch"), std::string::npos) << r.out;
}

}  // namespace

namespace {

TEST(BenchAdamCli, SmallRunPrintsJsonWithTheIssueKeys) {
  ToolRun r = run_zinf(
      "bench adam --numel 100003 --steps 2 --threads 2 --grad-dtype bf16 "
      "--copy-out fp16 --reference --json");
  ASSERT_EQ(r.status, 0) << r.out;
  for (const char* key : {"\"isa\":", "\"threads\":2", "\"numel\":100003", "\"seconds_per_step\":",
                          "\"elements_per_s\":", "\"gbps\":", "\"grad_dtype\":\"bf16\"",
                          "\"copy_out\":\"fp16\"", "\"bytes_per_element\":28"}) {
    EXPECT_NE(r.out.find(key), std::string::npos) << key << " missing in " << r.out;
  }
}

TEST(BenchAdamCli, ForcedScalarPathRuns) {
  ToolRun r = run_zinf("bench adam --numel 4097 --steps 1 --isa scalar --json");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("\"isa\":\"scalar\""), std::string::npos) << r.out;
  // The portable path has no software prefetch, whatever is asked.
  EXPECT_NE(r.out.find("\"prefetch_elements\":0,\"prefetch_source\":\"none\""), std::string::npos)
      << r.out;
}

// A distance given on the command line is what the x86 vector paths run and report.
TEST(BenchAdamCli, GivenPrefetchIsReported) {
  ToolRun r = run_zinf("bench adam --numel 4097 --steps 1 --prefetch 512 --json");
  ASSERT_EQ(r.status, 0) << r.out;
  const bool x86_vector = r.out.find("\"isa\":\"avx") != std::string::npos;
  EXPECT_NE(r.out.find(x86_vector ? "\"prefetch_elements\":512,\"prefetch_source\":\"option\""
                                  : "\"prefetch_elements\":0,\"prefetch_source\":\"none\""),
            std::string::npos)
      << r.out;
}

TEST(BenchAdamCli, BadPrefetchExits2) {
  ToolRun r = run_zinf("bench adam --numel 1M --prefetch far");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.out,
            "zinf bench adam: error: --prefetch: expected auto, off or a number of elements in "
            "[1, 65536], got 'far'\n");
}

TEST(BenchAdamCli, BadIsaExits2) {
  ToolRun r = run_zinf("bench adam --isa avx9");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(
      r.out,
      "zinf bench adam: error: invalid --isa 'avx9': expected auto, avx512bf16, avx512, avx2, "
      "sve, neon or scalar\n");
}

// ---- Files of its own only, none left behind -----------------------------------------------

// Links planted at every name bench io used to give its files (the fixed data file name, and
// the write probe named after the pid, planted once the pid is known but before zinf runs):
// zinf follows none of them, and leaves the links as they were.
TEST(BenchIoCli, FollowsNoLinkPlantedAtTheNamesItUsedToUse) {
  zinf::test::TestDir dir;
  const std::string work = dir.subdir("work");
  const Victims v = make_victims(dir.subdir("victims"));
  std::vector<std::string> planted;
  ToolProcess p =
      spawn_tool(ZINF_TOOL_PATH,
                 {"bench", "io", "--dir", work, "--size", "8M", "--block-size", "256K", "--loops",
                  "1", "--json"},
                 [&](pid_t pid) {
                   planted = {"zinf-bench-io.0.dat", ".zinf-write-probe-" + std::to_string(pid)};
                   plant_links(work, planted, v);
                 });
  const ToolEnd e = wait_tool(p);
  EXPECT_EQ(e.status, 0) << e.out;
  EXPECT_EQ(victims_changed(v), "");
  std::sort(planted.begin(), planted.end());
  EXPECT_EQ(dir_entries(work), planted);
}

TEST(BenchIoCli, SignalsStopTheRunAndLeaveNothingBehind) {
  zinf::test::TestDir dir;
  zinf::test::expect_signals_stop_cleanly(
      ZINF_TOOL_PATH, "bench io", {"--size", "64M", "--block-size", "256K", "--loops", "100000"},
      dir.path(), 100, 600);
}

// Two runs in one directory have a file each: both verify every byte. (Sharing one file, the
// shorter run reads back while the longer one still writes newer generations over it.)
TEST(BenchIoCli, TwoRunsInOneDirectoryBothVerify) {
  zinf::test::TestDir dir;
  std::vector<std::string> args = {"bench",    "io",           "--dir",  dir.path(),      "--size",
                                   "64M",      "--block-size", "256K",   "--queue-depth", "4",
                                   "--engine", "threads",      "--json", "--loops"};
  ToolProcess a = spawn_tool(ZINF_TOOL_PATH, [&] {
    auto v = args;
    v.push_back("2");
    return v;
  }());
  ToolProcess b = spawn_tool(ZINF_TOOL_PATH, [&] {
    auto v = args;
    v.push_back("8");
    return v;
  }());
  const ToolEnd ea = wait_tool(a);
  const ToolEnd eb = wait_tool(b);
  for (const ToolEnd* e : {&ea, &eb}) {
    EXPECT_EQ(e->status, 0) << e->out;
    EXPECT_NE(e->out.find("\"verified\":true"), std::string::npos) << e->out;
  }
  EXPECT_TRUE(dir_entries(dir.path()).empty());
}

// --keep leaves the files under fresh names it prints; a second run never reuses them.
TEST(BenchIoCli, KeepLeavesFreshlyNamedFiles) {
  zinf::test::TestDir dir;
  for (int run = 1; run <= 2; ++run) {
    ToolRun r = run_zinf("bench io --dir " + dir.path() +
                         " --size 4M --block-size 256K --loops 1 "
                         "--keep --json");
    ASSERT_EQ(r.status, 0) << r.out;
    EXPECT_NE(r.out.find("zinf bench io: kept " + dir.path() + "/zinf-bench-io-"),
              std::string::npos)
        << r.out;
    EXPECT_EQ(dir_entries(dir.path()).size(), static_cast<std::size_t>(run));
  }
}

TEST(BenchPrefetchCli, FollowsNoLinkPlantedAtTheNamesItUsedToUse) {
  zinf::test::TestDir dir;
  zinf::test::expect_follows_no_probe_link(
      ZINF_TOOL_PATH,
      {"bench", "prefetch", "--layers", "3", "--layer-bytes", "64K", "--passes", "1", "--json"},
      dir.path());
}

TEST(BenchPrefetchCli, SignalsStopTheRunAndLeaveNothingBehind) {
  zinf::test::TestDir dir;
  zinf::test::expect_signals_stop_cleanly(
      ZINF_TOOL_PATH, "bench prefetch",
      {"--layers", "4", "--layer-bytes", "1M", "--passes", "1000", "--compute-ms", "1"}, dir.path(),
      100, 600);
}

}  // namespace
