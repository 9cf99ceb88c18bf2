// SPDX-License-Identifier: Apache-2.0
// `zinf bench step --reference N`: the drive's rates and the Adam kernel alone (step_reference.h).
#include "step_reference.h"

#include <algorithm>
#include <chrono>
#include <cstddef>

namespace zinf::tools {

StepReference::StepReference(const std::vector<std::string>& dirs, std::uint64_t state_bytes,
                             const swap::IoOptions& io, std::size_t numel,
                             const adam::CpuAdamOptions& adam, const adam::GradView& grads,
                             const adam::CopyOut& out, adam::StatePrecision precision)
    : n_(numel),
      grads_(grads),
      out_(out),
      adam_(adam),
      precision_(precision),
      mem_(numel * 4 + adam::moment_bytes(precision, numel), "bench step --reference") {
  if (!dirs.empty()) {
    IoBenchOptions bo;
    bo.dirs = dirs;
    // At least one request per file; the state's bytes rounded up to whole requests.
    const std::uint64_t per_file = (state_bytes / dirs.size() + io.block_size - 1) / io.block_size;
    bo.size = std::max<std::uint64_t>(per_file, 1) * io.block_size * dirs.size();
    bo.io = io;
    bo.file_stem = "zinf-bench-step-ref";
    io_.emplace(bo);
    io_->write();  // lays the files out: the timed writes are overwrites, as the step's are
  }
  auto p = mem_.as<float>(n_);
  for (std::size_t i = 0; i < n_; ++i) p[i] = bench_param(i);
  auto moments = mem_.as<std::byte>(n_ * 4 + adam::moment_bytes(precision_, n_)).subspan(n_ * 4);
  std::fill(moments.begin(), moments.end(), std::byte{0});  // zero moments in every precision
}

StepReference::Figures StepReference::measure(adam::AdamParams hp) {
  Figures f;
  if (io_) {
    f.write_gbps = io_->write().gbps();
    f.read_gbps = io_->read().gbps();
  }
  ++step_;
  hp.step = step_;
  const adam::CompactMoments moments = adam::compact_moments_at(
      precision_, n_,
      mem_.as<std::byte>(n_ * 4 + adam::moment_bytes(precision_, n_)).data() + n_ * 4);
  const auto t0 = std::chrono::steady_clock::now();
  adam_.step(hp, mem_.as<float>(n_), moments, grads_, out_);
  f.adam_seconds = seconds_since(t0);
  return f;
}

}  // namespace zinf::tools
