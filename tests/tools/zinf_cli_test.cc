// SPDX-License-Identifier: Apache-2.0
// End-to-end checks of the zinf tool as a user runs it: exit status, the one-line errors for
// bad arguments and hostile configs, and small verified `bench io` and `bench prefetch` runs
// with their JSON.
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

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
}

TEST(BenchAdamCli, BadIsaExits2) {
  ToolRun r = run_zinf("bench adam --isa avx9");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.out,
            "zinf bench adam: error: invalid --isa 'avx9': expected auto, avx512bf16, avx512, avx2 "
            "or scalar\n");
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
