// SPDX-License-Identifier: Apache-2.0
// The zinf command-line tool: dispatches `zinf <command> [<subcommand>] [options]`.
#include <cstdio>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include "commands.h"
#include "interrupt.h"
#include "zinf/common/error.h"
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
               "usage: zinf <command> [options]   (zinf <command> --help for its options)\n\n");
  for (const auto& c : kCommands) {
    std::fprintf(out, "  zinf %-12.*s %.*s\n", static_cast<int>(c.name.size()), c.name.data(),
                 static_cast<int>(c.summary.size()), c.summary.data());
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    print_usage(args.empty() ? stderr : stdout);
    return args.empty() ? 2 : 0;
  }
  if (args[0] == "--version") {
    std::printf("zinf %s\n", ZINF_VERSION);
    return 0;
  }
  for (const auto& c : kCommands) {
    // Match "bench io" against the first one or two tokens.
    std::string_view name = c.name;
    std::size_t words = 1;
    std::string joined = args[0];
    if (name.find(' ') != std::string_view::npos) {
      if (args.size() < 2) continue;
      joined += " " + args[1];
      words = 2;
    }
    if (joined != name) continue;
    std::vector<std::string> rest(args.begin() + static_cast<std::ptrdiff_t>(words), args.end());
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
  std::string what = args[0] + (args.size() > 1 && args[0] == "bench" ? " " + args[1] : "");
  std::fprintf(stderr, "zinf: unknown command '%s'\n\n", what.c_str());
  print_usage(stderr);
  return 2;
}
