// SPDX-License-Identifier: Apache-2.0
#include "worker.h"

#include <cerrno>
#include <utility>

namespace zinf::tools::stress {

FaultCounts counts_of(const swap::FaultPlan* plan) {
  FaultCounts c;
  if (plan == nullptr) return c;
  for (std::size_t i = 0; i < kRuleCount; ++i) c.by_rule[i] = plan->fired(i);
  return c;
}

// The mix of faults at `rate` per piece attempt. Hard: EIO (reads and writes), ENOSPC (writes).
// Recoverable: a short transfer of one 4096-byte block (a whole alignment unit, so that the
// resubmission from the aligned point below always progresses), two EAGAINs (far below the
// engine's bound of 64 retries), a 300 us delay. Null for rate 0: no plan, no "+faults".
std::shared_ptr<swap::FaultPlan> make_plan(double rate, std::uint64_t seed) {
  if (rate <= 0) return nullptr;
  using swap::FaultKind;
  using swap::FaultRule;
  std::vector<FaultRule> rules(kRuleCount);
  for (auto& r : rules) r.probability = rate;
  rules[kRuleEio].kind = FaultKind::kError;
  rules[kRuleEio].probability *= 0.3;
  rules[kRuleEio].err = EIO;
  rules[kRuleEnospc].kind = FaultKind::kError;
  rules[kRuleEnospc].op = swap::IoOp::kWrite;
  rules[kRuleEnospc].probability *= 0.2;
  rules[kRuleEnospc].err = ENOSPC;
  rules[kRuleShort].kind = FaultKind::kShort;
  rules[kRuleShort].probability *= 0.2;
  rules[kRuleShort].short_bytes = 4096;
  rules[kRuleEagain].kind = FaultKind::kEagain;
  rules[kRuleEagain].probability *= 0.15;
  rules[kRuleEagain].count = 2;
  rules[kRuleDelay].kind = FaultKind::kDelay;
  rules[kRuleDelay].probability *= 0.15;
  rules[kRuleDelay].delay = std::chrono::microseconds(300);
  return std::make_shared<swap::FaultPlan>(std::move(rules), seed);
}
OpError error_of(const Status& st) {
  if (st.ok()) return {};
  return {true, st.code(), IoError(st).what()};
}

OpError error_of(const std::exception& e) {
  // The library's one mapping of an exception to a code; the text is the exception's own, as
  // the user saw it. A component refusing work after an earlier failure is judged by what
  // failed first (a corruption stays a corruption), not as kFailedState.
  if (const auto* ef = dynamic_cast<const EngineFailed*>(&e)) {
    return {true, ef->cause().code(), e.what()};
  }
  return {true, status_from_current_exception().code(), e.what()};
}

// Judges one operation by the hard faults injected while it ran. Every component has its own
// engine and fault plan and runs one operation at a time, so the faults a plan decided between
// an operation's start and its completion are exactly that operation's (per-request
// attribution). A hard fault fails its request, so: faults and no error = unsurfaced; an error
// without any hard fault = unexpected (a checksum mismatch counts as a corruption found).
void judge_operation(Tally& t, const std::string& what, const FaultCounts& delta,
                     const OpError& err) {
  const std::uint64_t hard = delta.hard();
  if (err.failed && hard > 0) {
    ++t.failed_ops;
    t.hard_surfaced += hard;
    // The error a user sees must say where: file, offset and length (docs/style.md section 3).
    if (err.text.find("offset=") == std::string::npos ||
        err.text.find("length=") == std::string::npos) {
      ++t.errors_without_context;
      t.problem(what + ": error without offset/length: " + err.text);
    }
  } else if (err.failed && err.code == ErrorCode::kCorrupt) {
    ++t.corruption_errors;
    t.problem(what + ": corruption surfaced: " + err.text);
  } else if (err.failed) {
    ++t.unexpected_errors;
    t.problem(what + ": error with no hard fault injected: " + err.text);
  } else if (hard > 0) {
    t.hard_unsurfaced += hard;
    t.problem(what + ": succeeded although " + std::to_string(hard) +
              " hard fault(s) were injected into it");
  }
}
swap::IoOptions io_options(const StressOptions& cfg, std::shared_ptr<swap::FaultPlan> plan) {
  swap::IoOptions io;
  io.kind = cfg.engine;
  // Small pieces so that a tensor is several pieces and faults hit the middle of requests.
  io.block_size = 64u << 10;
  io.queue_depth = 8;
  io.threads = 2;
  io.faults = std::move(plan);
  return io;
}

std::unique_ptr<swap::SwapStore> make_store(const Shared& sh, swap::IoEngine& engine,
                                            std::uint64_t capacity) {
  swap::SwapStoreOptions so;
  so.directories = sh.store_dirs;
  so.capacity_bytes = capacity;
  so.stripe_bytes = kStripe;
  so.checksums = sh.cfg->checksums;
  so.verify_threads = 0;  // verify on the engine's thread: fewer threads on a small machine
  return std::make_unique<swap::SwapStore>(so, engine);
}

}  // namespace zinf::tools::stress
