// SPDX-License-Identifier: Apache-2.0
// What the stress workers count: the faults injected, by kind, and each worker's tally of
// operations, verified bytes, surfaced and unsurfaced faults, errors and mismatches.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace zinf::tools::stress {

// One FaultPlan rule per kind, in this order, so that FaultPlan::fired(i) counts kind i.
enum : std::size_t { kRuleEio, kRuleEnospc, kRuleShort, kRuleEagain, kRuleDelay, kRuleCount };

struct FaultCounts {
  std::uint64_t by_rule[kRuleCount] = {};
  std::uint64_t hard() const { return by_rule[kRuleEio] + by_rule[kRuleEnospc]; }
  std::uint64_t total() const {
    std::uint64_t t = 0;
    for (auto n : by_rule) t += n;
    return t;
  }
  FaultCounts operator-(const FaultCounts& o) const {
    FaultCounts d;
    for (std::size_t i = 0; i < kRuleCount; ++i) d.by_rule[i] = by_rule[i] - o.by_rule[i];
    return d;
  }
  FaultCounts& operator+=(const FaultCounts& o) {
    for (std::size_t i = 0; i < kRuleCount; ++i) by_rule[i] += o.by_rule[i];
    return *this;
  }
};

constexpr std::size_t kMaxProblems = 8;

// What one worker saw. Each worker owns its tally; they are summed after the threads join.
struct Tally {
  std::uint64_t swap_outs = 0, swap_ins = 0;
  std::uint64_t opt_steps = 0, opt_undone = 0, opt_rebuilds = 0, opt_state_reads = 0;
  std::uint64_t prefetch_passes = 0, prefetch_acquires = 0, prefetch_layer_writes = 0;
  std::uint64_t prefetch_reads_dropped = 0;  // failed reads issued ahead, never acquired
  std::uint64_t bytes_verified = 0, bytes_written = 0;
  FaultCounts injected;
  std::uint64_t failed_ops = 0;
  std::uint64_t hard_surfaced = 0, hard_unsurfaced = 0;
  std::uint64_t unexpected_errors = 0, corruption_errors = 0, errors_without_context = 0;
  std::uint64_t mismatches = 0;
  std::vector<std::string> problems;  // the first few, for the report

  void problem(std::string text) {
    if (problems.size() < kMaxProblems) problems.push_back(std::move(text));
  }
  std::uint64_t operations() const {
    return swap_outs + swap_ins + opt_steps + opt_state_reads + prefetch_acquires +
           prefetch_layer_writes;
  }
  void add(const Tally& o) {
    swap_outs += o.swap_outs;
    swap_ins += o.swap_ins;
    opt_steps += o.opt_steps;
    opt_undone += o.opt_undone;
    opt_rebuilds += o.opt_rebuilds;
    opt_state_reads += o.opt_state_reads;
    prefetch_passes += o.prefetch_passes;
    prefetch_acquires += o.prefetch_acquires;
    prefetch_layer_writes += o.prefetch_layer_writes;
    prefetch_reads_dropped += o.prefetch_reads_dropped;
    bytes_verified += o.bytes_verified;
    bytes_written += o.bytes_written;
    injected += o.injected;
    failed_ops += o.failed_ops;
    hard_surfaced += o.hard_surfaced;
    hard_unsurfaced += o.hard_unsurfaced;
    unexpected_errors += o.unexpected_errors;
    corruption_errors += o.corruption_errors;
    errors_without_context += o.errors_without_context;
    mismatches += o.mismatches;
    for (const auto& p : o.problems) problem(p);
  }
};

}  // namespace zinf::tools::stress
