// SPDX-License-Identifier: Apache-2.0
// OffloadEngine's drive notices: the plan's notices at construction, the drive-slowdown notice
// (zinf.rate_notice_*) at each step's optimizer rates, and the drive-wear notice (zinf.tbw_tb)
// at the measured step rate, once.
#include <chrono>
#include <cstdint>
#include <string>

#include "engine_impl.h"
#include "zinf/common/log.h"

namespace zinf::offload {
namespace {

using Clock = detail::EngineClock;

// Steps measured for the wear notice, after the first (which also warms the files and
// threads): enough to average a step's ups and downs, few enough to say it early in a run.
constexpr std::uint64_t kWearSteps = 3;

}  // namespace

void OffloadEngine::Impl::start_notices(const detail::EnginePlan& plan) {
  // Notice level, shown by default: a notice says the config means something other than what
  // it reads as (an old key name, a rounded size); the drive wear, before the first step (the
  // measured figure follows after the first steps).
  for (const auto& notice : plan.notices) log(LogLevel::kNotice, notice);
  if (plan.wear && plan.wear->bytes_per_step > 0) wear = plan.wear;  // else nothing to tell
  if (const auto& w = plan.write_notice) {
    write_watch.emplace(w->what, w->share, w->steps, w->reference_gbps);
  }
  if (const auto& r = plan.read_notice) {
    read_watch.emplace(r->what, r->share, r->steps, r->reference_gbps);
  }
}

void OffloadEngine::Impl::note_rates(const StepStats& st) {
  // This step's rates against the reference: one notice when the drive stays slow (its write
  // cache full, or hot), not one per step. Steps that moved nothing say nothing of the drive.
  if (write_watch && st.bytes_written > 0 && st.write_seconds > 0) {
    if (auto line =
            write_watch->observe(static_cast<double>(st.bytes_written) / st.write_seconds / 1e9)) {
      log(LogLevel::kNotice, "OffloadEngine: " + *line);
    }
  }
  if (read_watch && st.bytes_read > 0 && st.read_seconds > 0) {
    if (auto line =
            read_watch->observe(static_cast<double>(st.bytes_read) / st.read_seconds / 1e9)) {
      log(LogLevel::kNotice, "OffloadEngine: " + *line);
    }
  }
}

void OffloadEngine::Impl::note_wear() {
  if (!wear) return;
  const std::uint64_t written = opt_written + params->stats().bytes_written;
  if (steps == 1) {
    wear_since = Clock::now();
    wear_bytes_since = written;
    return;
  }
  if (!wear_since || steps < 1 + kWearSteps) return;
  const double secs =
      std::chrono::duration<double>(Clock::now() - *wear_since).count() / kWearSteps;
  const double per_step = static_cast<double>(written - wear_bytes_since) / kWearSteps;
  if (secs > 0 && per_step > 0) {
    log(LogLevel::kNotice,
        detail::measured_wear_notice(*wear, config.zinf.tbw_tb, per_step, secs, 1 + kWearSteps));
  }
  wear.reset();  // told once
}

}  // namespace zinf::offload
