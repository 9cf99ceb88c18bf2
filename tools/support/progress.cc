// SPDX-License-Identifier: Apache-2.0
#include "progress.h"

#include <unistd.h>

#include <algorithm>

namespace zinf::tools {

Progress::Progress(std::string what, double total, std::string unit, bool wanted)
    : Progress(std::move(what), total, std::move(unit),
               wanted && ::isatty(STDERR_FILENO) != 0, stderr) {}

Progress::Progress(std::string what, double total, std::string unit, bool wanted, std::FILE* out)
    : what_(std::move(what)), total_(total), unit_(std::move(unit)),
      out_(wanted ? out : nullptr), start_(std::chrono::steady_clock::now()) {}

Progress::~Progress() { finish(); }

std::string Progress::line(double done, double elapsed, const std::string& detail) const {
  char buf[256];
  const double pct = total_ > 0 ? 100.0 * std::min(done, total_) / total_ : 0;
  const std::string tail = detail.empty() ? "" : ", " + detail;
  if (unit_ == "s") {  // a run of fixed duration: its rate would be 1 s/s
    std::snprintf(buf, sizeof buf, "%s: %.*f/%.*f s (%.0f%%)%s", what_.c_str(), digits_, done,
                  digits_, total_, pct, tail.c_str());
    return buf;
  }
  // Below half a second the rate is noise (and infinite at 0).
  const double rate = elapsed >= 0.5 ? done / elapsed : 0;
  const int d = digits_, rd = std::max(digits_, 1);
  std::snprintf(buf, sizeof buf, "%s: %.*f/%.*f %s (%.0f%%), %.*f %s/s, %.0f s elapsed%s",
                what_.c_str(), d, done, d, total_, unit_.c_str(), pct, rd, rate, unit_.c_str(),
                elapsed, tail.c_str());
  return buf;
}

void Progress::update(double done, const std::string& detail) {
  if (out_ == nullptr) return;
  const auto now = std::chrono::steady_clock::now();
  if (done < total_ && now - last_ < std::chrono::milliseconds(500)) return;
  last_ = now;
  const std::string text =
      line(done, std::chrono::duration<double>(now - start_).count(), detail);
  std::fprintf(out_, "\r%-*s", static_cast<int>(width_), text.c_str());
  std::fflush(out_);
  width_ = std::max(width_, text.size());
}

void Progress::finish() {
  if (out_ == nullptr || width_ == 0) return;
  std::fprintf(out_, "\r%*s\r", static_cast<int>(width_), "");
  std::fflush(out_);
  width_ = 0;
}

}  // namespace zinf::tools
