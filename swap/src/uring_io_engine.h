// SPDX-License-Identifier: Apache-2.0
// UringIoEngine: the io_uring IoEngine backend (liburing). Private to zinf::swap; made by
// make_io_engine. Only this header's .cc includes liburing.h.
#pragma once

#include <memory>
#include <string>

#include "engine_core.h"
#include "zinf/swap/io_engine.h"

namespace zinf::swap {

class UringIoEngine;

/// Returns "" if an io_uring can be set up here, else why not ("io_uring_setup: EPERM").
std::string uring_probe();

}  // namespace zinf::swap
