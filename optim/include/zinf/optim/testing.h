// SPDX-License-Identifier: Apache-2.0
// Test hooks of the optim layer, kept out of OptimizerOptions so that what a trainer configures
// is only what a trainer should: a progress hook inside OffloadedOptimizer's checkpoint save,
// for tests and fault drills. The namespace is test_hooks, not testing: inside zinf::optim a
// nested `testing` would hide GoogleTest's ::testing from the tests that use both.
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>

#include "zinf/optim/optimizer.h"

namespace zinf::optim::test_hooks {

/// Called on the saving thread as an OffloadedOptimizer checkpoint progresses, with the phase
/// ("created" once the new version's directory exists, empty; "data" after each record is
/// written, with the data bytes written so far; "synced", "committed", "latest", "done"), so
/// that a test can kill the process, or plant files, at a chosen point.
using CheckpointHook = std::function<void(std::string_view phase, std::uint64_t bytes)>;

/// Installs `hook` on `optimizer` for its later saves (replacing any; an empty function
/// removes it). Not while a save of it is running (the optimizer's one controlling thread).
void set_checkpoint_hook(OffloadedOptimizer& optimizer, CheckpointHook hook);

}  // namespace zinf::optim::test_hooks
