// SPDX-License-Identifier: Apache-2.0
// Test hooks of zinf::dist, kept out of the public constructors: a ShardedEngine whose rank's
// OffloadEngine has fault plans installed (offload/testing.h), so that a test can fail one
// rank's I/O and prove what every rank then sees. For tests and fault drills only.
#pragma once

#include <memory>
#include <vector>

#include "zinf/dist/collectives.h"
#include "zinf/dist/sharded_engine.h"
#include "zinf/offload/testing.h"

namespace zinf::dist::test_hooks {

/// Builds a ShardedEngine exactly as its constructor does (same arguments, same errors), with
/// `faults` installed in this rank's OffloadEngine's I/O engines (the plans are shared: the
/// caller keeps its pointers to count what they injected).
std::unique_ptr<ShardedEngine> make_sharded_engine_with_faults(
    offload::EngineConfig config, std::vector<offload::LayerSpec> layers, cuda::Device& device,
    cuda::StreamRef compute_stream, Collectives& comm, offload::test_hooks::EngineFaults faults);

}  // namespace zinf::dist::test_hooks
