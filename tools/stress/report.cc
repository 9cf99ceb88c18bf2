// SPDX-License-Identifier: Apache-2.0
#include "report.h"

#include <chrono>
#include <cstdio>

#include "format.h"
#include "json_out.h"
#include "over_time.h"
#include "args.h"

namespace zinf::tools::stress {

void print_report(const StressOptions& cfg, const StressTotals& totals, const StressVerdict& v,
                  double seconds, const std::string& engine_name, const LogCounts& log) {
  const Tally& t = totals.tally;
  const bool overrun = v.broke(StressRule::kBudgetOverrun);
  const char* kind_names[kRuleCount] = {"eio", "enospc", "short", "eagain", "delay"};

  if (cfg.json) {
    Json j;
    j["command"] = "stress";
    j["result"] = v.pass() ? "pass" : "fail";
    j["seconds"] = seconds;
    j["workers"] = cfg.workers;
    j["fault_rate"] = cfg.fault_rate;
    j["seed"] = cfg.seed;
    j["checksums"] = cfg.checksums;
    j["engine"] = engine_name;
    j["dirs"] = cfg.dirs;
    j["operations"] = t.operations();
    j["swap_outs"] = t.swap_outs;
    j["swap_ins"] = t.swap_ins;
    j["optimizer_steps"] = t.opt_steps;
    j["optimizer_steps_undone"] = t.opt_undone;
    j["optimizer_rebuilds"] = t.opt_rebuilds;
    j["optimizer_state_transfers"] = t.opt_state_reads;
    j["prefetch_segments"] = t.prefetch_passes;
    j["prefetch_acquires"] = t.prefetch_acquires;
    j["prefetch_layer_writes"] = t.prefetch_layer_writes;
    j["prefetch_reads_dropped"] = t.prefetch_reads_dropped;
    j["bytes_verified"] = t.bytes_verified;
    j["bytes_written"] = t.bytes_written;
    j["faults_injected"] = t.injected.total();
    for (std::size_t i = 0; i < kRuleCount; ++i) {
      j[std::string("faults_") + kind_names[i]] = t.injected.by_rule[i];
    }
    j["hard_faults"] = t.injected.hard();
    j["hard_faults_surfaced"] = t.hard_surfaced;
    j["hard_faults_unsurfaced"] = t.hard_unsurfaced;
    j["failed_operations"] = t.failed_ops;
    j["unexpected_errors"] = t.unexpected_errors;
    j["corruption_errors"] = t.corruption_errors;
    j["errors_without_context"] = t.errors_without_context;
    j["mismatches"] = t.mismatches;
    j["pinned_budget_bytes"] = cfg.budget;
    j["pinned_reserved_bytes"] = totals.pinned.reserved;
    j["pinned_peak_bytes"] = totals.pinned.peak;
    j["budget_overrun"] = overrun;
    j["device"] = totals.device.name;
    j["device_memory_budget_bytes"] = totals.device.budget;
    j["device_memory_peak_bytes"] = totals.device.peak;
    j["device_overrun"] = v.broke(StressRule::kDeviceOverrun);
    j["interval_s"] = std::chrono::duration<double>(cfg.interval).count();
    add_over_time(j, totals.samples, totals.profile);
    j["library_errors_logged"] = log.errors;
    j["library_warnings_logged"] = log.warnings;
    j["planted"] = totals.planted;
    j["problems"] = v.problems;
    std::printf("%s\n", json_text(j).c_str());
  } else {
    std::printf(
        "zinf stress: %.1f s, %llu swap workers + optimizer + prefetch, engine=%s, device=%s, "
        "faults=%g, seed=%llu, checksums=%s\n",
        seconds, static_cast<unsigned long long>(cfg.workers), engine_name.c_str(),
        totals.device.name.c_str(), cfg.fault_rate, static_cast<unsigned long long>(cfg.seed),
        cfg.checksums ? "on" : "off");
    std::printf(
        "  operations        %llu (swap_out %llu, swap_in %llu, optimizer steps %llu, "
        "state transfers %llu, prefetch acquires %llu, layer writes %llu)\n",
        static_cast<unsigned long long>(t.operations()),
        static_cast<unsigned long long>(t.swap_outs), static_cast<unsigned long long>(t.swap_ins),
        static_cast<unsigned long long>(t.opt_steps),
        static_cast<unsigned long long>(t.opt_state_reads),
        static_cast<unsigned long long>(t.prefetch_acquires),
        static_cast<unsigned long long>(t.prefetch_layer_writes));
    std::printf("  bytes verified    %s (written %s)\n", mib(t.bytes_verified).c_str(),
                mib(t.bytes_written).c_str());
    std::printf(
        "  faults injected   %llu (EIO %llu, ENOSPC %llu, short %llu, EAGAIN %llu, delay %llu)\n",
        static_cast<unsigned long long>(t.injected.total()),
        static_cast<unsigned long long>(t.injected.by_rule[kRuleEio]),
        static_cast<unsigned long long>(t.injected.by_rule[kRuleEnospc]),
        static_cast<unsigned long long>(t.injected.by_rule[kRuleShort]),
        static_cast<unsigned long long>(t.injected.by_rule[kRuleEagain]),
        static_cast<unsigned long long>(t.injected.by_rule[kRuleDelay]));
    std::printf(
        "  hard faults       %llu: %llu surfaced as errors of %llu failed operations, "
        "%llu unsurfaced\n",
        static_cast<unsigned long long>(t.injected.hard()),
        static_cast<unsigned long long>(t.hard_surfaced),
        static_cast<unsigned long long>(t.failed_ops),
        static_cast<unsigned long long>(t.hard_unsurfaced));
    std::printf(
        "  prefetch          %llu failed reads of layers read ahead and never acquired "
        "(logged as warnings)\n",
        static_cast<unsigned long long>(t.prefetch_reads_dropped));
    std::printf(
        "  optimizer         %llu steps undone by failed reads, %llu rebuilds after failures\n",
        static_cast<unsigned long long>(t.opt_undone),
        static_cast<unsigned long long>(t.opt_rebuilds));
    std::printf("  mismatches        %llu\n", static_cast<unsigned long long>(t.mismatches));
    std::printf("  unexpected errors %llu (corruption found %llu, without context %llu)\n",
                static_cast<unsigned long long>(t.unexpected_errors + t.corruption_errors),
                static_cast<unsigned long long>(t.corruption_errors),
                static_cast<unsigned long long>(t.errors_without_context));
    std::printf("  pinned memory     peak %s, reserved %s, budget %s%s\n",
                mib(totals.pinned.peak).c_str(), mib(totals.pinned.reserved).c_str(),
                mib(cfg.budget).c_str(), overrun ? " (OVERRUN)" : "");
    std::printf("  device memory     %s: peak %s, budget %s%s\n", totals.device.name.c_str(),
                mib(totals.device.peak).c_str(), mib(totals.device.budget).c_str(),
                v.broke(StressRule::kDeviceOverrun) ? " (OVERRUN)" : "");
    // The rate of verified bytes over time: a GPU or drive that throttles in a long soak shows
    // here as a fall (the rule is throughput.h's).
    std::printf("%s", over_time_text("  verified", totals.samples, totals.profile,
                                     duration_text(cfg.interval))
                          .c_str());
    if (log.errors > log.shown) {
      std::printf("  library log       %llu error lines (the first %llu shown on stderr)\n",
                  static_cast<unsigned long long>(log.errors),
                  static_cast<unsigned long long>(log.shown));
    }
    if (!totals.planted.empty()) std::printf("  planted           %s\n", totals.planted.c_str());
    for (const auto& p : v.problems) std::printf("  problem: %s\n", p.c_str());
    std::printf("%s\n", v.pass() ? "PASS: every byte verified, every hard fault surfaced"
                                 : "FAIL: see the problems above");
  }
}

}  // namespace zinf::tools::stress
