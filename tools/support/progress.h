// SPDX-License-Identifier: Apache-2.0
// Progress of a long command on a terminal: one line on stderr, redrawn in place, with the
// elapsed time, done/total and the rate, so that a ten-minute stress run, a large benchmark or a
// sweep is never silent. Off when stderr is not a terminal (logs, pipes, tests) or with --json, so that
// nothing but the results reaches a file.
#pragma once

#include <chrono>
#include <cstdio>
#include <string>

namespace zinf::tools {

class Progress {
 public:
  /// `what` names the work ("bench step"), `total` its size in `unit`s ("steps", "s").
  /// Enabled when `wanted` and stderr is a terminal.
  Progress(std::string what, double total, std::string unit, bool wanted);
  /// For tests: writes to `out` whenever `wanted`, terminal or not.
  Progress(std::string what, double total, std::string unit, bool wanted, std::FILE* out);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  bool enabled() const noexcept { return out_ != nullptr; }
  /// Redraws the line with `done` units finished, at most twice a second (and always at the
  /// end: done >= total). `detail`, if not empty, follows the line after a comma (what the
  /// last unit measured, a rate in other units).
  void update(double done, const std::string& detail = {});
  /// Changes the total, when the work turns out larger or smaller than planned.
  void set_total(double total) noexcept { total_ = total; }
  /// Shows done/total and the rate with `digits` decimals (default 0): for fractional units
  /// such as GB, or seconds of a short run.
  void set_digits(int digits) noexcept { digits_ = digits; }
  /// Clears the line; idempotent. The destructor calls it.
  void finish();
  /// The line as update(done, detail) would draw it after `elapsed` seconds (no carriage
  /// return).
  std::string line(double done, double elapsed, const std::string& detail = {}) const;

 private:
  std::string what_;
  double total_;
  std::string unit_;
  int digits_ = 0;
  std::FILE* out_;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_{};
  std::size_t width_ = 0;  // of the last line drawn, to blank it
};

}  // namespace zinf::tools
