// SPDX-License-Identifier: Apache-2.0
// The zinf command-line tool: dispatches `zinf <command> [<subcommand>] [options]`, with "did
// you mean" for a mistyped command, `zinf help X` as `zinf X --help`, and `zinf bench` alone
// listing the benchmarks. Each command parses its own options (args.h).
#include <algorithm>
#include <cstdio>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include "commands.h"
#include "interrupt.h"
#include "zinf/common/error.h"
#include "zinf/common/suggest.h"
#include "zinf/config.h"

namespace {

struct Command {
  std::string_view name;
  std::string_view summary;
  int (*run)(const std::vector<std::string>&);
};

constexpr Command kCommands[] = {
    {"bench io", "measure read/write bandwidth of the swap path on your drives",
     zinf::tools::bench_io_main},
    {"bench adam", "measure the CPU Adam kernel against memory bandwidth",
     zinf::tools::bench_adam_main},
    {"bench prefetch", "measure how much NVMe read time the layer prefetcher hides behind compute",
     zinf::tools::bench_prefetch_main},
    {"bench step", "time optimizer steps with the state on NVMe or in pinned memory",
     zinf::tools::bench_step_main},
    {"bench h2d", "measure host <-> device copy rates, pinned and pageable, over a sweep of sizes",
     zinf::tools::bench_h2d_main},
    {"demo", "train a small network with parameters and optimizer state offloaded (none|cpu|nvme)",
     zinf::tools::demo_main},
    {"plan", "what fits where: ZeRO stage, offload and memory per GPU and node",
     zinf::tools::plan_main},
    {"tune", "check the setup and find the fastest I/O settings for the optimizer's pattern",
     zinf::tools::tune_main},
    {"stress", "soak swap, optimizer and prefetch under injected faults, verifying every byte",
     zinf::tools::stress_main},
};

void print_usage(std::FILE* out) {
  std::fprintf(out,
               "usage: zinf <command> [options]   (zinf <command> --help, or zinf help "
               "<command>, for its options)\n\n");
  for (const auto& c : kCommands) {
    std::fprintf(out, "  zinf %-14.*s %.*s\n", static_cast<int>(c.name.size()), c.name.data(),
                 static_cast<int>(c.summary.size()), c.summary.data());
  }
}

void print_bench_list(std::FILE* out) {
  std::fprintf(out,
               "usage: zinf bench <benchmark> [options]   (zinf bench <benchmark> --help for "
               "its options)\n\n");
  for (const auto& c : kCommands) {
    if (c.name.rfind("bench ", 0) != 0) continue;
    std::fprintf(out, "  zinf %-14.*s %.*s\n", static_cast<int>(c.name.size()), c.name.data(),
                 static_cast<int>(c.summary.size()), c.summary.data());
  }
}

const Command* find_command(std::string_view name) {
  for (const auto& c : kCommands) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

// The words a command can start with ("bench", "demo", ...), or the second words after
// "bench" ("io", "adam", ...), for "did you mean".
std::vector<std::string> command_words(bool bench) {
  std::vector<std::string> out;
  for (const auto& c : kCommands) {
    const std::string_view n = c.name;
    const bool is_bench = n.rfind("bench ", 0) == 0;
    if (bench && is_bench) out.emplace_back(n.substr(6));
    if (!bench) out.emplace_back(n.substr(0, n.find(' ')));
  }
  if (!bench) out.emplace_back("help");
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// "zinf: unknown command 'bnech' (did you mean 'bench'?)", then the list to choose from.
int unknown_command(const std::vector<std::string>& args) {
  const bool bench = args[0] == "bench";
  const std::string word = bench ? args[1] : args[0];
  std::string msg = "zinf: unknown command '" + (bench ? "bench " + word : word) + "'";
  const std::vector<std::string> words = command_words(bench);
  std::string_view s = zinf::closest_match(word, words, zinf::typo_distance(word, 3));
  if (!s.empty()) {
    msg += " (did you mean '" + std::string(bench ? "bench " : "") + std::string(s) + "'?)";
  } else if (!bench && find_command("bench " + word) != nullptr) {
    msg += " (did you mean 'bench " + word + "'?)";  // `zinf io`: the benchmark's own name
  }
  std::fprintf(stderr, "%s\n\n", msg.c_str());
  bench ? print_bench_list(stderr) : print_usage(stderr);
  return 2;
}

int run(const Command& c, const std::vector<std::string>& rest) {
  const std::string_view name = c.name;
  zinf::tools::install_interrupt_handlers(name);
  // A signal wins over whatever the command did after it: its figures are partial, and an
  // error it raised may be the interruption's doing (a drained request, a stopped worker).
  auto interrupted = [&](int sig) {
    std::fprintf(stderr, "zinf %.*s: interrupted by %s\n", static_cast<int>(name.size()),
                 name.data(), zinf::tools::signal_name(sig).c_str());
    return 128 + sig;
  };
  try {
    const int status = c.run(rest);
    if (const int sig = zinf::tools::interrupt_signal(); sig != 0) return interrupted(sig);
    return status;
  } catch (const zinf::tools::Interrupted& e) {
    return interrupted(e.signal);
  } catch (const zinf::UsageError& e) {
    if (const int sig = zinf::tools::interrupt_signal(); sig != 0) return interrupted(sig);
    std::fprintf(stderr, "zinf %.*s: error: %s\n", static_cast<int>(name.size()), name.data(),
                 e.what());
    return 2;
  } catch (const std::exception& e) {
    if (const int sig = zinf::tools::interrupt_signal(); sig != 0) return interrupted(sig);
    std::fprintf(stderr, "zinf %.*s: error: %s\n", static_cast<int>(name.size()), name.data(),
                 e.what());
    return 1;
  }
}

bool is_help(const std::string& s) { return s == "--help" || s == "-h"; }

// `args` starts with a command's first word.
int dispatch(const std::vector<std::string>& args) {
  if (args[0] == "bench") {
    // `zinf bench` alone is an incomplete command, as `zinf` alone is: the list on stderr and
    // status 2; asked for (--help, `zinf help bench`), the list on stdout and status 0.
    if (args.size() == 1) {
      std::fprintf(stderr, "zinf bench: which benchmark?\n\n");
      print_bench_list(stderr);
      return 2;
    }
    if (is_help(args[1])) {
      print_bench_list(stdout);
      return 0;
    }
    if (const Command* c = find_command("bench " + args[1])) {
      return run(*c, std::vector<std::string>(args.begin() + 2, args.end()));
    }
    return unknown_command(args);
  }
  if (const Command* c = find_command(args[0])) {
    return run(*c, std::vector<std::string>(args.begin() + 1, args.end()));
  }
  return unknown_command(args);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || is_help(args[0]) || (args[0] == "help" && args.size() == 1)) {
    print_usage(args.empty() ? stderr : stdout);
    return args.empty() ? 2 : 0;
  }
  if (args[0] == "--version") {
    std::printf("zinf %s\n", ZINF_VERSION);
    return 0;
  }
  if (args[0] == "help") {
    // `zinf help X [Y]` is `zinf X [Y] --help`.
    std::vector<std::string> asked(args.begin() + 1, args.end());
    asked.emplace_back("--help");
    return dispatch(asked);
  }
  return dispatch(args);
}
