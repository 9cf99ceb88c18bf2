// SPDX-License-Identifier: Apache-2.0
// OffloadEngine's statistics: the counters each completed step adds to, and stats().
#include <cstdint>

#include "engine_impl.h"

namespace zinf::offload {

void OffloadEngine::Impl::count_step(const StepStats& st) {
  ++steps;
  opt_read += st.bytes_read;
  opt_written += st.bytes_written;
  opt_read_seconds += st.read_seconds;
  opt_write_seconds += st.write_seconds;
}

EngineStats OffloadEngine::stats() const {
  const Impl& m = *impl_;
  EngineStats s;
  s.steps = m.steps;
  s.skipped_steps = m.skipped;
  if (m.stage) {
    s.staged_grad_bytes_written = m.stage->bytes_written();
    s.staged_grad_bytes_read = m.stage->bytes_read();
  }
  const detail::ParamTierStats p = m.params->stats();
  s.param_bytes_read = p.bytes_read;
  s.param_bytes_written = p.bytes_written;
  s.param_bytes_to_device = p.bytes_to_device;
  s.stall_seconds = p.stall_seconds;
  s.prefetch_hits = p.prefetch_hits;
  s.prefetch_on_demand = p.prefetch_on_demand;
  s.param_read_gbps = p.read_gbps;
  s.optimizer_bytes_read = m.opt_read;
  s.optimizer_bytes_written = m.opt_written;
  s.step_seconds = m.step_seconds;
  if (m.opt_read_seconds > 0)
    s.nvme_read_gbps = static_cast<double>(m.opt_read) / m.opt_read_seconds / 1e9;
  if (m.opt_write_seconds > 0) {
    s.nvme_write_gbps = static_cast<double>(m.opt_written) / m.opt_write_seconds / 1e9;
  }
  const std::uint64_t grad_pinned = m.grad_pool ? m.grad_pool->budget_bytes() : 0;
  const std::uint64_t stage_pinned = m.stage ? m.stage->pinned_bytes() : 0;
  const std::uint64_t own = m.params->pinned_bytes() + grad_pinned + stage_pinned;
  s.pinned_bytes = m.optimizer->pinned_bytes() + own;
  s.pinned_bytes_peak = m.optimizer->pinned_bytes_peak() + own;
  s.grad_bytes_to_host = m.grad_to_host;
  s.grad_staging_wait_seconds = m.grad_wait_seconds;
  s.last_step = m.last_step;
  return s;
}

}  // namespace zinf::offload
