// SPDX-License-Identifier: Apache-2.0
// FaultPlan::decide: the deterministic rule matcher the backends consult once per piece attempt
// (zinf/swap/fault_injection.h).
#include "zinf/swap/fault_injection.h"

namespace zinf::swap {
namespace {

// splitmix64: tiny, seedable and reproducible across platforms, which is all a fault plan needs.
std::uint64_t next_random(std::uint64_t& state) noexcept {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

bool matches(const FaultRule& rule, IoOp op, FileId file, std::uint64_t offset) noexcept {
  if (rule.op && *rule.op != op) return false;
  if (rule.file && *rule.file != file) return false;
  return offset >= rule.offset_begin && offset < rule.offset_end;
}

}  // namespace

FaultPlan::FaultPlan(std::vector<FaultRule> rules, std::uint64_t seed)
    : rules_(std::move(rules)),
      fired_(rules_.size(), 0),
      matches_(rules_.size(), 0),
      seed_(seed),
      rng_state_(seed) {}

FaultDecision FaultPlan::decide(IoOp op, FileId file, std::uint64_t offset) {
  std::lock_guard lock(mu_);
  FaultDecision d;
  for (std::size_t i = 0; i < rules_.size(); ++i) {
    const FaultRule& rule = rules_[i];
    if (!matches(rule, op, file, offset)) continue;
    const std::uint64_t n = matches_[i]++;  // every matching rule counts, fired or not
    if (d.fired) continue;
    bool fire = false;
    if (rule.probability > 0.0) {
      const double u = static_cast<double>(next_random(rng_state_) >> 11) * 0x1.0p-53;
      fire = u < rule.probability;
    } else {
      fire = n >= rule.first_match && n - rule.first_match < rule.times;
    }
    if (!fire) continue;
    d.fired = true;
    ++fired_[i];
    d.kind = rule.kind;
    d.err = rule.err;
    d.short_bytes = rule.short_bytes / 512 * 512;
    d.eagain_count = rule.count;
    d.delay = rule.delay;
  }
  if (d.fired) {
    injected_.fetch_add(1, std::memory_order_relaxed);
    if (d.kind == FaultKind::kError) injected_errors_.fetch_add(1, std::memory_order_relaxed);
  }
  return d;
}

std::uint64_t FaultPlan::fired(std::size_t index) const {
  std::lock_guard lock(mu_);
  return index < fired_.size() ? fired_[index] : 0;
}

}  // namespace zinf::swap
