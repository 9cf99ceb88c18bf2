// SPDX-License-Identifier: Apache-2.0
// Test hooks of the prefetch layer, kept out of PrefetcherOptions so that what a caller
// configures is only what a caller should: a way to make a LayerPrefetcher's host->device copy
// fail, which no real device can be asked to do on demand. For tests and fault drills.
// The namespace is test_hooks, not testing: inside zinf::prefetch a nested `testing` would hide
// GoogleTest's ::testing from the tests that use both.
#pragma once

#include <cstddef>
#include <functional>

#include "zinf/prefetch/layer_prefetcher.h"

namespace zinf::prefetch::test_hooks {

/// Installs `hook` (an empty function removes it) to run as host work on `prefetcher`'s copy
/// stream just before each layer's host->device copy, with the layer's index. If it throws, the
/// copy stream fails with its text, exactly as a failed device copy fails it: the layer's copy
/// event and every later one report the failure, and it surfaces as DeviceError at the next
/// call that meets it (see LayerPrefetcher: errors). Call before the prefetcher's first
/// acquire, release, end_iteration, suspend or resume (copies may be enqueued from then on, on
/// other threads). `hook` must not call into the Device (Device::enqueue_host_work).
void set_copy_hook(LayerPrefetcher& prefetcher, std::function<void(std::size_t layer)> hook);

}  // namespace zinf::prefetch::test_hooks
