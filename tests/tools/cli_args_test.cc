// SPDX-License-Identifier: Apache-2.0
// The argument grammar (sizes, counts, durations) as tables of accepted and refused texts, and
// Cli: values, repeats, unknown options with "did you mean", fio/ds_io names, the help format.
#include "args.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "zinf/common/error.h"

namespace zinf::tools {
namespace {

using std::chrono::milliseconds;

// The text of the UsageError `fn` throws, or "no error".
template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "no error";
}

TEST(ParseSize, AcceptsEveryUnitInAnyCase) {
  constexpr std::uint64_t K = 1024, M = K * K, G = M * K;
  const std::pair<const char*, std::uint64_t> table[] = {
      {"4096", 4096},
      {"0", 0},
      {"4K", 4 * K},
      {"4k", 4 * K},
      {"4KiB", 4 * K},
      {"4kib", 4 * K},
      {"1M", M},
      {"1m", M},
      {"1.5G", 3 * G / 2},
      {"1.5g", 3 * G / 2},
      {"4GiB", 4 * G},
      {"4gib", 4 * G},
      {"2T", 2 * G * K},
      {"512B", 512},
      {"512b", 512},
      {"1e8", 100000000},
      {"1E8", 100000000},
      {"64mb", 64000000},
      {"64MB", 64000000},
      {"1GB", 1000000000},
      {"1gb", 1000000000},
      {"3kB", 3000},
      {"2tb", 2000000000000},
      {"1.5M", 1572864},
      {"0.5K", 512},
      {"2e3K", 2000 * K},
  };
  for (const auto& [text, bytes] : table) EXPECT_EQ(parse_size(text, "--size"), bytes) << text;
}

TEST(ParseSize, RefusesWithOneText) {
  for (const char* text : {"", "-1", "-1M", "+1", " 1", "1 ", "1.5.2G", "12Q", "0x10", "0.3", "1.5",
                           "K", "1KK", "1 K", "inf", "nan", "1e", "1iB", "4Kb/s"}) {
    EXPECT_EQ(error_of([&] { (void)parse_size(text, "--size"); }),
              std::string("invalid --size '") + text +
                  "': expected a size such as 4096, 512K, 1M, 2GiB or 1e8")
        << text;
  }
}

TEST(ParseSize, WholeNumbersAreExactAndOverflowIsRefused) {
  EXPECT_EQ(parse_size("18446744073709551615", "x"), 18446744073709551615u);
  EXPECT_EQ(parse_size("9007199254740993", "x"), 9007199254740993u);  // a double would round
  EXPECT_EQ(parse_size("16777215T", "x"), 16777215ull << 40);
  for (const char* over : {"16777216T", "18446744073709551616", "99999999999999999999", "1e20",
                           "16E", "17179869184G"}) {
    EXPECT_THROW(parse_size(over, "x"), UsageError) << over;
  }
}

TEST(ParseCount, AcceptsIntegersMultipliersAndScientific) {
  const std::pair<const char*, std::uint64_t> table[] = {
      {"0", 0},
      {"16", 16},
      {"20M", 20u << 20},
      {"20m", 20u << 20},
      {"64K", 65536},
      {"1G", 1u << 30},
      {"1e8", 100000000},
      {"2.5e6", 2500000},
      {"1.5K", 1536},
      {"18446744073709551615", 18446744073709551615u},
      {"9007199254740993", 9007199254740993u},
  };
  for (const auto& [text, n] : table) EXPECT_EQ(parse_count(text, "--numel"), n) << text;
}

TEST(ParseCount, RefusesNamingTheRange) {
  for (const char* text :
       {"18446744073709551616", "99999999999999999999", "-1", "-0", "+1", " 1", "1 ", "12abc",
        "0x10", "1.5", "1e20", "1e", "inf", "nan", "", "1.5.2", "16777216T", "20MB", "1KiB"}) {
    EXPECT_EQ(error_of([&] { (void)parse_count(text, "--seed"); }),
              std::string("invalid --seed '") + text +
                  "': expected an integer in [0, 18446744073709551615]")
        << text;
  }
  EXPECT_EQ(error_of([] { (void)parse_count("4294967297", "--threads", 0, UINT32_MAX); }),
            "invalid --threads '4294967297': expected an integer in [0, 4294967295]");
  EXPECT_EQ(error_of([] { (void)parse_count("2", "--depth", 3, 64); }),
            "invalid --depth '2': expected an integer in [3, 64]");
  EXPECT_EQ(parse_count("4294967295", "--threads", 0, UINT32_MAX), 4294967295u);
}

TEST(ParseDuration, AcceptsUnitsInAnyCase) {
  const std::pair<const char*, milliseconds> table[] = {
      {"10s", milliseconds(10000)}, {"10", milliseconds(10000)},       {"10S", milliseconds(10000)},
      {"5m", milliseconds(300000)}, {"5min", milliseconds(300000)},    {"250ms", milliseconds(250)},
      {"250MS", milliseconds(250)}, {"1h", milliseconds(3600000)},     {"1.5s", milliseconds(1500)},
      {"0.5", milliseconds(500)},   {"168h", milliseconds(604800000)},
  };
  for (const auto& [text, d] : table) EXPECT_EQ(parse_duration(text, "--duration"), d) << text;
}

TEST(ParseDuration, RefusesWithOneText) {
  for (const char* text : {"", "-1s", "0", "0s", "0.5ms", "10parsecs", "1.5.2s", "s", "1d", "169h",
                           "1e3s", " 1s", "1 s", "inf", "10ss"}) {
    EXPECT_EQ(error_of([&] { (void)parse_duration(text, "--duration"); }),
              std::string("invalid --duration '") + text +
                  "': expected a duration such as 250ms, 10s, 5m or 1h")
        << text;
  }
}

TEST(ParseChoice, TakesAChoiceAndSuggestsTheNearest) {
  const std::vector<std::string> modes = {"read", "write", "randread", "randwrite", "rw", "randrw"};
  EXPECT_EQ(parse_choice("randread", "--rw", modes), "randread");
  EXPECT_EQ(parse_choice("rw", "--rw", modes), "rw");
  const std::string expected = "expected read, write, randread, randwrite, rw or randrw";
  const std::pair<const char*, const char*> refused[] = {
      {"randwirte", " (did you mean randwrite?)"},
      {"Read", " (did you mean read?)"},
      {"randreed", " (did you mean randread?)"},
      {"randrd", " (did you mean randrw?)"},
      {"sequential", ""},  // nothing near: the list alone
      {"", ""},            // nothing typed: nothing to correct
  };
  for (const auto& [text, hint] : refused) {
    EXPECT_EQ(error_of([&] { parse_choice(text, "--rw", modes); }),
              std::string("invalid --rw '") + text + "': " + expected + hint)
        << text;
  }
  EXPECT_EQ(error_of([] {
              parse_choice("x", "--op", {"read", "write"});
            }),
            "invalid --op 'x': expected read or write");
}

TEST(FormatValues, SizeAndDurationTextReadBackExactly) {
  for (std::uint64_t b : {0ull, 1ull, 4096ull, 1ull << 20, 3ull << 29, 4097ull, 1ull << 40}) {
    EXPECT_EQ(parse_size(size_text(b), "x"), b) << size_text(b);
  }
  EXPECT_EQ(size_text(1ull << 30), "1G");
  EXPECT_EQ(size_text(256ull << 10), "256K");
  EXPECT_EQ(duration_text(milliseconds(10000)), "10s");
  EXPECT_EQ(duration_text(milliseconds(300000)), "5m");
  EXPECT_EQ(duration_text(milliseconds(250)), "250ms");
  EXPECT_EQ(duration_text(milliseconds(3600000)), "1h");
}

// A command's options as most commands declare them.
struct Options {
  std::vector<std::string> dirs;
  std::uint64_t size = 1ull << 30;
  std::uint64_t block = 1u << 20;
  std::uint64_t depth = 16;
  std::uint64_t loops = 3;
  std::string op = "both";
  std::chrono::milliseconds duration{10000};
  double rate = 0;
  bool json = false;
  bool keep = false;

  void declare(Cli& c) {
    c.texts("--dir", dirs, "DIR", "directory (repeatable)", "./zinf-scratch");
    c.size("--size", size, "total bytes");
    c.size("--block-size", block, "bytes per request");
    c.count("--queue-depth", depth, "requests in flight", 1, 4096);
    c.count("--loops", loops, "passes");
    c.text("--op", op, "OP", "read | write | both");
    c.duration("--duration", duration, "how long");
    c.number("--faults", rate, "fault rate");
    c.flag("--json", json, "JSON output");
    c.flag("--keep", keep, "keep files");
  }
};

// Parses `tokens` as a command like `bench io` into `o`: the error text, or "" on success.
std::string parse(const std::vector<std::string>& tokens, Options& o) {
  Cli c("bench io", "about");
  o.declare(c);
  const std::string e = error_of([&] { EXPECT_TRUE(c.parse(tokens)); });
  return e == "no error" ? "" : e;
}

TEST(Cli, TakesValuesFlagsAndRepeats) {
  Options o;
  EXPECT_EQ(parse({"--dir", "a", "--json", "--dir=b", "--size", "1G", "--loops", "3", "--size=4K",
                   "--duration", "5m", "--faults", "0.25"},
                  o),
            "");
  EXPECT_EQ(o.dirs, (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(o.json);
  EXPECT_FALSE(o.keep);
  EXPECT_EQ(o.size, 4096u);  // the last one wins
  EXPECT_EQ(o.loops, 3u);
  EXPECT_EQ(o.depth, 16u);  // not given: the default stays
  EXPECT_EQ(o.duration, milliseconds(300000));
  EXPECT_EQ(o.rate, 0.25);
}

TEST(Cli, NegativeNumbersAreValuesSoTheGrammarNamesThem) {
  Options o;
  EXPECT_EQ(parse({"--loops", "-1"}, o),
            "invalid --loops '-1': expected an integer in [0, "
            "18446744073709551615]");
  EXPECT_EQ(parse({"--faults", "-0.5"}, o), "");
  EXPECT_EQ(o.rate, -0.5);
}

TEST(Cli, UnknownOptionSuggestsClosest) {
  Options o;
  EXPECT_EQ(parse({"--queue-dpth", "8"}, o),
            "unknown option '--queue-dpth' for 'bench io' (did you mean --queue-depth?)");
  EXPECT_EQ(parse({"--jsno"}, o), "unknown option '--jsno' for 'bench io' (did you mean --json?)");
  EXPECT_EQ(parse({"--frobnicate=3"}, o), "unknown option '--frobnicate' for 'bench io'");
  EXPECT_EQ(parse({"stray"}, o), "unknown option 'stray' for 'bench io'");
  // One value per --dir: a second word is not a second directory.
  EXPECT_EQ(parse({"--dir", "a", "b"}, o), "unknown option 'b' for 'bench io'");
  // A near miss of fio's name suggests the zinf option it maps to.
  EXPECT_EQ(parse({"--iodepht", "8"}, o),
            "unknown option '--iodepht' for 'bench io' (did you mean --queue-depth?)");
}

TEST(Cli, MissingValueIsAnError) {
  Options o;
  EXPECT_EQ(parse({"--size"}, o), "option --size needs a value");
  // As with every option that takes a value, the next word is its value whatever it looks
  // like, so the grammar names it.
  EXPECT_EQ(parse({"--size", "--json"}, o),
            "invalid --size '--json': expected a size such as 4096, 512K, 1M, 2GiB or 1e8");
}

TEST(Cli, FioAndDsIoNamesMapToZincsOptions) {
  Options o;
  EXPECT_EQ(parse({"--bs", "4K", "--iodepth=32", "--runtime", "1m", "--directory", "d"}, o), "");
  EXPECT_EQ(o.block, 4096u);
  EXPECT_EQ(o.depth, 32u);
  EXPECT_EQ(o.duration, milliseconds(60000));
  EXPECT_EQ(o.dirs, (std::vector<std::string>{"d"}));
  // ds_io: snake_case names and its --folder and --io_size.
  Options d;
  EXPECT_EQ(parse({"--block_size", "8K", "--queue_depth", "4", "--folder", "f", "--io_size=2M"}, d),
            "");
  EXPECT_EQ(d.block, 8192u);
  EXPECT_EQ(d.depth, 4u);
  EXPECT_EQ(d.dirs, (std::vector<std::string>{"f"}));
  EXPECT_EQ(d.size, 2u << 20);
  // A mapped name's value goes through the same grammar and names the zinf option.
  EXPECT_EQ(parse({"--bs", "4Q"}, o),
            "invalid --block-size '4Q': expected a size such as 4096, 512K, 1M, 2GiB or 1e8");
}

TEST(Cli, ForeignNamesWithoutCounterpartAreRefusedNamingTheHelp) {
  Options o;
  EXPECT_EQ(parse({"--numjobs", "4"}, o),
            "--numjobs (fio's or ds_io's name) has no counterpart in 'zinf bench io'; its options "
            "are listed by 'zinf bench io --help'");
}

TEST(Cli, CommandSpecificAliasesValueMapsAndRefusals) {
  std::string op = "both";
  std::uint64_t threads = 0;
  Cli c("bench io", "about");
  c.text("--op", op, "OP", "read | write | both");
  c.count("--threads", threads, "threads");
  c.alias_value("--rw", [](const std::string& v) -> std::vector<std::string> {
    if (v == "read" || v == "write") return {"--op=" + v};
    throw UsageError("--rw " + v + ": no random mode; use --op read|write|both");
  });
  c.refuse("--numjobs", "use --threads");
  c.alias("--jobs", "--threads");
  EXPECT_TRUE(c.parse({"--rw", "write", "--jobs", "3"}));
  EXPECT_EQ(op, "write");
  EXPECT_EQ(threads, 3u);
  EXPECT_EQ(error_of([&] { (void)c.parse({"--rw=randread"}); }),
            "--rw randread: no random mode; use --op read|write|both");
  EXPECT_EQ(error_of([&] { (void)c.parse({"--numjobs", "2"}); }), "use --threads");
}

TEST(Cli, HelpListsEveryOptionWithItsDefaultAndWinsOverMistakes) {
  Options o;
  Cli c("bench io", "Measures things.", "Footer text.");
  o.declare(c);
  const std::string h = c.help();
  EXPECT_EQ(h.rfind("usage: zinf bench io [options]\n\nMeasures things.\n", 0), 0u) << h;
  for (const char* line :
       {"  --dir DIR               directory (repeatable) [./zinf-scratch]\n",
        "  --size SIZE             total bytes [1G]\n",
        "  --queue-depth N         requests in flight [16]\n",
        "  --op OP                 read | write | both [both]\n",
        "  --duration TIME         how long [10s]\n", "  --faults X              fault rate [0]\n",
        "  --json                  JSON output\n",
        "  -h, --help              print this help and exit\n", "\nFooter text.\n"}) {
    EXPECT_NE(h.find(line), std::string::npos) << line << "\nin:\n" << h;
  }
  // --help beside a mistake prints the help rather than the mistake.
  Options p;
  Cli d("bench io", "about");
  p.declare(d);
  testing::internal::CaptureStdout();
  EXPECT_FALSE(d.parse({"--frobnicate", "--help"}));
  EXPECT_NE(testing::internal::GetCapturedStdout().find("usage: zinf bench io"), std::string::npos);
}

TEST(Cli, GroupsTitleTheirOptions) {
  std::uint64_t gpus = 1;
  std::string params;
  Cli c("plan", "about");
  c.group("model").text("--params", params, "N", "parameters");
  c.group("parallelism").count("--gpus", gpus, "GPUs");
  const std::string h = c.help();
  EXPECT_NE(h.find("\nmodel:\n  --params N              parameters [none]\n"), std::string::npos)
      << h;
  EXPECT_NE(h.find("\nparallelism:\n  --gpus N                GPUs [1]\n"), std::string::npos) << h;
}

}  // namespace
}  // namespace zinf::tools
