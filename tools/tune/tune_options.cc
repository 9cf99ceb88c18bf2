// SPDX-License-Identifier: Apache-2.0
// `zinf tune`'s command line (tune_options.h).
#include "tune_options.h"

#include <iterator>
#include <sstream>

#include "args.h"
#include "scratch.h"
#include "zinf/common/error.h"

namespace zinf::tools::tune {
namespace {

constexpr const char* kAbout = R"(
Checks the setup, then measures which I/O settings move the optimizer step's traffic fastest on
these directories (reads of sub-group i+1 interleaved with writes of sub-group i-1, equal bytes,
every byte verified), and writes them as a config zinf and DeepSpeed accept.)";

constexpr const char* kFooter = R"(
zinf's default setting (uring, else threads with 16 workers; 1M; queue depth 16) is always
measured. A setting replaces it only if its median beats the default's by more than the larger
of the two spreads (max - min of each one's passes): the output says which, with the three
best, and ends with the block-size x queue-depth grid of each backend (--plot draws it).

--sustained then writes over --size bytes (one file per DIR, striped) for --sustained-time with
the chosen setting, sampling the rate every second as `zinf bench io --runtime` does: the
steady state (median of the last third) and, if the rate fell by more than its noise, where.
The first lap writes freshly allocated space, later laps overwrite it (as the optimizer's
first step and the later ones do). Where the steady rate is below the burst write figure the
text and the report say so.

--out and --report are written whole to a temporary file that is then renamed over FILE: a
reader never sees half of one, and a symbolic link at FILE is replaced by the file, never
followed. The test files have no name (O_TMPFILE, or a random name unlinked at once): nothing
is left behind however zinf exits, and nothing planted in DIR is opened. SIGINT, SIGTERM and
SIGHUP stop the sweep without writing --out or --report (exit status 128 + the signal's
number).

fio's --bs, --iodepth and --runtime are read as --block-sizes, --queue-depths and
--time-budget. GB/s means 10^9 bytes per second; the mixed figure counts bytes read plus bytes
written.)";

// The sweep's default axes: block sizes around zinf's default 1 MiB (why 1 MiB:
// docs/benchmarks.md, "Figures behind the defaults") and queue depths around its default 16.
constexpr std::uint32_t kDefaultBlocks[] = {256u << 10, 1u << 20, 4u << 20};
constexpr std::uint32_t kDefaultDepths[] = {8, 16, 32};

// A comma-separated list of sizes (block sizes) or counts (queue depths), each read by the
// grammar of its kind.
std::vector<std::uint64_t> parse_list(const std::string& text, const char* what, bool sizes) {
  std::vector<std::uint64_t> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    std::uint64_t v = sizes ? parse_size(item, what) : parse_count(item, what);
    if (v == 0 || v > 0xffffffffull) {
      throw UsageError(std::string("invalid ") + what + " '" + item + "': out of range");
    }
    out.push_back(v);
  }
  if (out.empty()) throw UsageError(std::string("invalid ") + what + ": empty list");
  return out;
}

void declare_options(Cli& cli, TuneOptions& o) {
  cli.texts("--dir", o.dirs, "DIR",
            "directory to tune (repeatable: the state is striped over them)", "required");
  cli.duration("--time-budget", o.budget, "time for the whole sweep", "60s");
  cli.text("--out", o.out, "FILE",
           "write the chosen settings: DeepSpeed \"aio\" block + \"zinf\" "
           "section");
  cli.text("--report", o.report, "FILE",
           "write the figures (per-dir read/write GB/s, the sweep) as "
           "JSON, for `zinf plan --tune FILE`");
  cli.flag("--json", o.json, "print the report JSON on stdout instead of the table");
  cli.text("--plot", o.plot, "FILE.svg",
           "draw the block-size x queue-depth grid of each backend as an SVG heat map");
  cli.text("--backends", o.backends, "LIST", "uring,threads", "both where available");
  cli.text("--block-sizes", o.block_list, "LIST", "block sizes to try (SIZE,...)", "256K,1M,4M");
  cli.text("--queue-depths", o.depth_list, "LIST", "queue depths to try (N,...)", "8,16,32");
  cli.size("--pinned-budget", o.pinned_budget,
           "pinned memory the engine will hold, for the memlock check");
  cli.flag("--sustained", o.sustained_on,
           "then write with the chosen setting for --sustained-time and report the steady "
           "write rate (a consumer drive's cache hides it from short passes)");
  cli.size("--size", o.sustained_size,
           "bytes --sustained writes over, all dirs together; larger than the drive's write "
           "cache to see past it",
           "16G, at most half the free space");
  cli.duration("--sustained-time", o.sustained_time, "how long --sustained writes", "60s");
  cli.alias("--bs", "--block-sizes");
  cli.alias("--iodepth", "--queue-depths");
  cli.alias("--runtime", "--time-budget");
}

}  // namespace

std::optional<TuneOptions> parse_options(const std::vector<std::string>& tokens) {
  TuneOptions o;
  Cli cli("tune", kAbout, kFooter);
  declare_options(cli, o);
  if (!cli.parse(tokens)) return std::nullopt;
  if (o.dirs.empty())
    throw UsageError("--dir is required (a directory on the drive to tune; repeatable)");
  if (o.budget > std::chrono::hours(24)) throw UsageError("invalid --time-budget: at most 24h");
  if (o.sustained_size && !o.sustained_on) {
    throw UsageError("--size is the size --sustained writes over; give --sustained with it");
  }
  for (const auto& d : o.dirs) o.opened.push_back(check_dir(d));
  o.blocks.assign(std::begin(kDefaultBlocks), std::end(kDefaultBlocks));
  o.depths.assign(std::begin(kDefaultDepths), std::end(kDefaultDepths));
  if (!o.block_list.empty()) o.blocks = parse_list(o.block_list, "--block-sizes", true);
  if (!o.depth_list.empty()) o.depths = parse_list(o.depth_list, "--queue-depths", false);
  for (auto b : o.blocks) {
    if (b % 4096 != 0) {
      throw UsageError("invalid --block-sizes entry " + std::to_string(b) +
                       ": must be a multiple of 4096");
    }
  }
  if (!o.backends.empty()) {
    o.want_uring = o.want_threads = false;
    std::stringstream ss(o.backends);
    std::string b;
    while (std::getline(ss, b, ',')) {
      if (b == "uring") {
        o.want_uring = true;
      } else if (b == "threads") {
        o.want_threads = true;
      } else {
        throw UsageError("invalid --backends entry '" + b + "': expected uring or threads");
      }
    }
  }
  return o;
}

}  // namespace zinf::tools::tune
