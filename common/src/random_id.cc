// SPDX-License-Identifier: Apache-2.0
#include "zinf/common/random_id.h"

#include <sys/random.h>

#include <cerrno>
#include <cinttypes>
#include <cstdint>
#include <cstdio>

#include "zinf/common/error.h"
#include "zinf/common/status.h"

namespace zinf {

std::string random_id(std::string_view what) {
  std::uint64_t bits[2] = {0, 0};
  std::size_t got = 0;
  while (got < sizeof bits) {
    const ssize_t n = ::getrandom(reinterpret_cast<char*>(bits) + got, sizeof bits - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw IoError(Status::from_errno(errno, "getrandom", std::string(what)));
    }
    got += static_cast<std::size_t>(n);
  }
  char text[33];
  std::snprintf(text, sizeof text, "%016" PRIx64 "%016" PRIx64, bits[0], bits[1]);
  return text;
}

}  // namespace zinf
