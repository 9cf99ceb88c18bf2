// SPDX-License-Identifier: Apache-2.0
// `zinf bench io`'s command line (bench_io_options.h).
#include "bench_io_options.h"

#include "args.h"
#include "bench_common.h"
#include "scratch.h"
#include "zinf/common/error.h"

namespace zinf::tools::bench_io {
namespace {

constexpr const char* kAbout = R"(
Measures O_DIRECT read and write bandwidth through zinf's I/O engine, sequential or random, with
every byte read back verified (a mismatch is an error, exit status 1). With --duration it keeps
going over the files for that long and reports the throughput second by second: the steady
state, and where the rate fell if it fell by more than its noise (a drive's write cache
filling up).)";

constexpr const char* kFooter = R"(
Without --keep the data files have no name (O_TMPFILE, or a random name unlinked at once): they
vanish when zinf exits however it exits, a link planted in DIR is never followed, and runs in
one directory never share a file. SIGINT, SIGTERM and SIGHUP stop the run (exit status 128 +
the signal's number, e.g. 130 for SIGINT).

A cliff is a fall of the per-second rate that is (1) larger than 4 x the noise (the spread of
the rate from one second to the next) and than 10% of the rate before it, (2) abrupt: at least
half of it within 3 seconds either side, and (3) lasting: no later 3 seconds climb back above
halfway; it needs 6 samples. The steady state is the median of the last third of the samples.

fio's and ds_io's names are read as zinf's: --bs, --iodepth, --runtime, --directory/--folder,
--io_size, --read (ds_io). GB/s means 10^9 bytes per second.)";

const std::vector<std::string> kRwModes = {"read",      "write", "randread",
                                           "randwrite", "rw",    "randrw"};

Job job_of(const std::string& rw, double read_share) {
  Job j;
  j.rw = rw;
  j.random = rw.rfind("rand", 0) == 0;
  const std::string kind = j.random ? rw.substr(4) : rw;
  j.read_share = kind == "read" ? 1.0 : kind == "write" ? 0.0 : read_share;
  return j;
}

}  // namespace

Config parse(const std::vector<std::string>& tokens, bool* help) {
  Config c;
  // 0 for loops and UINT64_MAX for rwmixread mean "not given", for the checks below.
  std::uint64_t block_size = 1u << 20, queue_depth = 16, threads = 0, loops = 0;
  std::uint64_t rwmixread = UINT64_MAX;
  std::string engine = "auto", op, rw;
  bool no_verify = false, no_precondition = false, no_huge_pages = false;
  Cli cli("bench io", kAbout, kFooter);
  cli.texts("--dir", c.dirs, "DIR",
            "directory to test (repeatable: blocks are striped over the files)",
            "./zinf-scratch, created if missing");
  c.size = 1ull << 30;
  cli.size("--size", c.size, "total bytes over all files");
  cli.size("--block-size", block_size,
           "bytes per request; a multiple of the direct-I/O alignment (4096)");
  cli.count("--queue-depth", queue_depth, "requests kept in flight");
  cli.count("--threads", threads, "worker threads for --engine threads (0 = queue depth)", 0,
            UINT32_MAX);
  cli.text("--engine", engine, "KIND", "auto | uring | threads");
  cli.choice("--op", op, {"read", "write", "both"}, "OP",
             "sequential reads, writes, or both (writes first)", "both");
  cli.choice("--rw", rw, kRwModes, "MODE",
             "fio's modes: read | write | randread | randwrite (block-aligned offsets in a "
             "seeded random order, each block once per lap) | rw | randrw (reads and writes "
             "mixed, --rwmixread percent reads); instead of --op",
             "--op");
  cli.count("--rwmixread", rwmixread, "percent of requests that are reads, for --rw rw|randrw", 0,
            100, "50");
  cli.count("--seed", c.seed, "seeds the random order and the read/write mix");
  cli.duration("--duration", c.duration,
               "time-based: keep going over the files for this long (fio's --runtime), one "
               "sample per second; instead of --loops",
               "none: --loops passes");
  cli.count("--loops", loops, "timed passes per op; the median is reported", 1, UINT32_MAX, "3");
  std::uint64_t repeat = 1;
  cli.count("--repeat", repeat,
            "runs with a fresh engine, buffers and files each (precondition included), one after "
            "another: each run's rate and the min, median and max over runs",
            1, 1000);
  cli.flag("--no-verify", no_verify, "do not check the data (faster, not recommended)");
  cli.flag("--no-precondition", no_precondition,
           "time writes into fresh (fallocated) space instead of overwrites");
  cli.flag("--no-huge-pages", no_huge_pages, "do not ask for 2 MiB pages for the buffers");
  cli.size("--buffer-bytes", c.buffer_bytes,
           "pinned memory the requests rotate over; set it to a pipeline's buffer ring "
           "(e.g. bench step's pinned_bytes_peak) to measure the drive with that footprint",
           "queue depth x block size, as fio");
  cli.flag("--keep", c.keep,
           "keep the data files afterwards, under fresh names printed on stderr "
           "(zinf-bench-io-<pid>-<random>.dat); an interrupted run removes them");
  cli.flag("--json", c.json,
           "one JSON document on stdout instead of the table: {\"jobs\": [one per op], "
           "\"host\": {...}}, as fio's --output-format=json");
  cli.flag("--json-lines", c.json_lines,
           "one JSON object per op, one per line, each with the host fields (streaming)");
  cli.text("--dist", c.dist, "M",
           "auto | none | mpi: under mpirun each rank tests its own <dir>/rank<R> (auto: when "
           "a launcher set OMPI_COMM_WORLD_SIZE or PMI_SIZE > 1) and rank 0 reports per-rank "
           "and aggregate GB/s and the scaling efficiency",
           "auto");
  cli.alias_switch("--read", {"--op=read"});  // ds_io's read switch
  cli.refuse("--numjobs",
             "--numjobs: zinf bench io runs one job; set --queue-depth (requests in flight) and, "
             "for --engine threads, --threads (worker threads)");
  *help = !cli.parse(tokens);
  if (*help) return c;
  c.block_size = to_u32(block_size, "--block-size");
  c.queue_depth = to_u32(queue_depth, "--queue-depth");
  c.threads = static_cast<std::uint32_t>(threads);
  c.engine = swap::parse_io_engine_kind(engine);
  if (!op.empty() && !rw.empty()) {
    throw UsageError(
        "--op " + op + " and --rw " + rw +
        ": give one of them (--rw takes all of fio's modes, --op the sequential ones)");
  }
  const bool mixed = rw == "rw" || rw == "randrw";
  if (rwmixread != UINT64_MAX && !mixed) {
    throw UsageError("--rwmixread applies to --rw rw or randrw (reads and writes mixed)");
  }
  c.rwmixread = rwmixread == UINT64_MAX ? 50 : rwmixread;
  if (!rw.empty()) {
    c.jobs.push_back(job_of(rw, static_cast<double>(c.rwmixread) / 100));
  } else if (op == "read" || op == "write") {
    c.jobs.push_back(job_of(op, 0));
  } else {
    c.jobs = {job_of("write", 0), job_of("read", 0)};
  }
  if (loops != 0 && c.duration.count() > 0) {
    throw UsageError(
        "--loops and --duration (fio's --runtime): a time-based run is one run per op; "
        "give one of them");
  }
  c.loops = loops == 0 ? (c.duration.count() > 0 ? 1 : 3) : to_u32(loops, "--loops");
  c.repeat = static_cast<std::uint32_t>(repeat);
  c.verify = !no_verify;
  c.precondition = !no_precondition;
  c.huge_pages = !no_huge_pages;
  check_scratch_dirs(c.dirs);
  if (c.block_size % 4096 != 0) {
    throw UsageError("invalid --block-size " + std::to_string(c.block_size) +
                     ": must be a multiple of 4096 (the direct-I/O alignment zinf uses)");
  }
  const std::uint64_t window = std::uint64_t{c.queue_depth} * c.block_size;
  if (c.buffer_bytes == 0) c.buffer_bytes = window;
  if (c.buffer_bytes < window || c.buffer_bytes % c.block_size != 0) {
    throw UsageError(
        "invalid --buffer-bytes " + std::to_string(c.buffer_bytes) +
        ": must be a multiple of --block-size and at least queue depth x block size (" +
        std::to_string(window) + ")");
  }
  return c;  // IoBench checks the size against one block per file
}

}  // namespace zinf::tools::bench_io
