// SPDX-License-Identifier: Apache-2.0
// ZINF_CHECK: a broken internal invariant (a bug, never bad input) logs file:line and aborts,
// in every build type. Part of zinf::common.
#pragma once

namespace zinf::detail {
[[noreturn]] void check_failed(const char* expr, const char* msg, const char* file,
                               int line) noexcept;
}  // namespace zinf::detail

#define ZINF_CHECK(cond, msg)                                         \
  do {                                                                \
    if (!(cond)) [[unlikely]]                                         \
      ::zinf::detail::check_failed(#cond, (msg), __FILE__, __LINE__); \
  } while (0)
