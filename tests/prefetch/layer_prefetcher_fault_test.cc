// SPDX-License-Identifier: Apache-2.0
// LayerPrefetcher under faults injected inside the IoEngine (FaultPlan), on every backend: a
// failed read surfaces at the acquire of that layer, not earlier and not at another layer, as
// the swap layer's IoError with the same text (file, offset, length, errno); the layer is read
// again on the next acquire and the prefetcher stays usable; short reads and delays leave the
// data exact.
#include "zinf/prefetch/layer_prefetcher.h"

#include <cerrno>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "prefetch_test_util.h"
#include "support/log_capture.h"
#include "zinf/common/error.h"

namespace zinf::prefetch {
namespace {

using swap::FaultKind;
using swap::FaultRule;
using swap::IoEngineKind;
using swap::IoOp;
using test::forward;
using test::Rig;
using test::RigOptions;
using test::run_order;

// One MiB layers: the store's stripe, so layer i is at offset i MiB of the single swap file,
// and the engine's block size, so each read is one piece (its error text then never depends
// on how far other pieces got).
constexpr std::uint64_t kLayer = 1u << 20;

class LayerPrefetcherFault : public ::testing::TestWithParam<IoEngineKind> {
 protected:
  void SetUp() override {
    if (GetParam() == IoEngineKind::kUring) {
      if (std::string why = swap::io_uring_unavailable_reason(); !why.empty()) {
        GTEST_SKIP() << "io_uring unavailable: " << why;
      }
    }
  }

  RigOptions options(std::size_t layers, std::vector<FaultRule> rules) const {
    RigOptions o;
    o.layer_bytes.assign(layers, kLayer);
    o.engine = GetParam();
    o.faults = std::move(rules);
    o.io_block_size = kLayer;
    return o;
  }
};

FaultRule read_eio_in_layer(std::size_t layer, std::uint64_t times) {
  FaultRule r;
  r.kind = FaultKind::kError;
  r.op = IoOp::kRead;
  r.offset_begin = layer * kLayer;
  r.offset_end = (layer + 1) * kLayer;
  r.times = times;
  r.err = EIO;
  return r;
}

// Layer 2's read fails while it is being prefetched (during layer 0's and 1's compute). The
// error waits for acquire(2) and is exactly what the swap layer reports for that read: the
// same fault, fired again for a direct SwapStore::swap_in, gives the same text.
TEST_P(LayerPrefetcherFault, ReadErrorSurfacesAtThatLayersAcquireWithTheSwapLayersText) {
  Rig rig(options(5, {read_eio_in_layer(2, 2)}));
  auto p = rig.make(rig.options(2, forward(5)));
  run_order(*p, rig, {0, 1});
  std::string text;
  try {
    p->acquire(2);
    ADD_FAILURE() << "no throw";
  } catch (const IoError& e) {
    text = e.what();
    EXPECT_EQ(e.sys_errno(), EIO);
  }
  EXPECT_NE(text.find(rig.store().file_paths()[0]), std::string::npos) << text;
  EXPECT_NE(text.find("offset=2097152"), std::string::npos) << text;
  EXPECT_NE(text.find("length="), std::string::npos) << text;
  EXPECT_NE(text.find("(EIO)"), std::string::npos) << text;

  // The same fault for a direct read of the layer (the rule's second firing).
  swap::BufferPoolOptions po;
  po.budget_bytes = kLayer;
  po.huge_pages = false;
  swap::BufferPool pool(po);
  swap::BufferLease lease = pool.acquire(kLayer);
  try {
    rig.store().swap_in(rig.keys()[2], lease.span()).wait();
    ADD_FAILURE() << "no throw";
  } catch (const IoError& e) {
    EXPECT_EQ(text, e.what());
  }

  // The prefetcher is still usable: layer 2 is read again, the iteration completes exactly.
  EXPECT_EQ(p->stats().read_failures, 1u);
  cuda::DeviceSpan span = p->acquire(2);
  rig.check_on_stream(2, span);
  p->release(2);
  run_order(*p, rig, {3, 4});
  p->end_iteration();
  run_order(*p, rig, forward(5));
  EXPECT_EQ(rig.mismatches(), std::vector<std::string>{});
  EXPECT_EQ(rig.plan().injected_errors(), 2u);
}

// With depth 0 the failing read is the acquire's own (on demand).
TEST_P(LayerPrefetcherFault, OnDemandReadErrorSurfacesAtAcquire) {
  Rig rig(options(3, {read_eio_in_layer(1, 1)}));
  auto p = rig.make(rig.options(0, forward(3)));
  run_order(*p, rig, {0});
  try {
    p->acquire(1);
    ADD_FAILURE() << "no throw";
  } catch (const IoError& e) {
    EXPECT_EQ(e.sys_errno(), EIO);
    EXPECT_NE(std::string(e.what()).find("offset=1048576"), std::string::npos) << e.what();
  }
  run_order(*p, rig, {1, 2});
  EXPECT_EQ(rig.mismatches(), std::vector<std::string>{});
}

// Short reads are resubmitted by the engine and delays reorder completions: every byte still
// arrives, in every iteration.
TEST_P(LayerPrefetcherFault, ShortAndDelayedReadsStillDeliverEveryByte) {
  FaultRule shorts;
  shorts.kind = FaultKind::kShort;
  shorts.op = IoOp::kRead;
  shorts.short_bytes = 4096;
  shorts.probability = 0.3;
  FaultRule delays;
  delays.kind = FaultKind::kDelay;
  delays.op = IoOp::kRead;
  delays.delay = std::chrono::microseconds(300);
  delays.probability = 0.3;
  Rig rig(options(6, {shorts, delays}));
  auto p = rig.make(rig.options(3, forward(6)));
  for (int iteration = 0; iteration < 3; ++iteration) {
    run_order(*p, rig, forward(6));
    p->end_iteration();
  }
  EXPECT_EQ(rig.mismatches(), std::vector<std::string>{});
  EXPECT_GT(rig.plan().injected(), 0u);
  EXPECT_EQ(p->stats().read_failures, 0u);
}

// A read issued ahead fails and its layer is never acquired (the trainer stops first): nothing
// is lost, but the drive failed, so wait_for_reads() counts it and the destructor says so in a
// warning with the swap layer's text (file, offset, length, errno).
TEST_P(LayerPrefetcherFault, AFailedReadNobodyAcquiredIsCountedAndLogged) {
  Rig rig(options(3, {read_eio_in_layer(2, 1)}));
  std::vector<std::string> lines;
  {
    auto p = rig.make(rig.options(2, forward(3)));
    run_order(*p, rig, {0});  // its release issues layers 1 and 2
    p->wait_for_reads();
    EXPECT_EQ(p->stats().read_failures, 1u);
    EXPECT_EQ(rig.plan().injected_errors(), 1u);
    test::LogCapture log(LogLevel::kWarning);
    p.reset();
    lines = log.lines();
  }
  ASSERT_EQ(lines.size(), 1u) << testing::PrintToString(lines);
  EXPECT_EQ(lines[0].rfind("warning: layer prefetcher: the read of layer 2, issued ahead and never "
                           "acquired, failed: swap_in of key 'layer2': read failed: " +
                               rig.store().file_paths()[0] + " offset=2097152 length=1048576",
                           0),
            0u)
      << lines[0];
  EXPECT_NE(lines[0].find("(EIO)"), std::string::npos) << lines[0];
  EXPECT_EQ(rig.mismatches(), std::vector<std::string>{});
}

INSTANTIATE_TEST_SUITE_P(Backends, LayerPrefetcherFault,
                         ::testing::Values(IoEngineKind::kThreads, IoEngineKind::kUring),
                         [](const auto& p) {
                           return std::string(swap::io_engine_kind_name(p.param));
                         });

}  // namespace
}  // namespace zinf::prefetch
