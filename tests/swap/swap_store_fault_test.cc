// SPDX-License-Identifier: Apache-2.0
// SwapStore under faults injected inside each IoEngine backend (FaultPlan): a write's EIO
// reaches the swap's ticket naming key, file, offset and length, and leaves the key refusing
// swap_ins until rewritten; read errors leave the store usable; short transfers are resubmitted
// and the data is exact; a same-key overlap is refused while a swap is held in flight; with
// the default options, a byte flipped in a swap file is refused as kCorrupt, never returned.
#include "zinf/swap/swap_store.h"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "io_test_util.h"
#include "support/corrupt_swap_file.h"
#include "support/pattern.h"
#include "support/test_dir.h"
#include "zinf/common/error.h"
#include "zinf/swap/crc32c.h"
#include "zinf/swap/fault_injection.h"
#include "zinf/swap/io_engine.h"

namespace zinf::swap {
namespace {

using test::AlignedBuffer;
using test::check_pattern;
using test::fill_pattern;

constexpr std::uint32_t kStripe = 64 << 10;

class SwapStoreFault : public test::BackendTest {
 protected:
  // An engine with `rules` and a store over `n_dirs` directories (file i gets FileId i: the
  // engine is fresh and the store attaches in order).
  void make(std::vector<FaultRule> rules, int n_dirs, bool checksums = false) {
    plan_ = std::make_shared<FaultPlan>(std::move(rules), 1);
    IoOptions io;
    io.kind = GetParam();
    io.block_size = kStripe;
    io.queue_depth = 4;
    io.faults = plan_;
    engine_ = make_io_engine(io);
    SwapStoreOptions o;
    for (int i = 0; i < n_dirs; ++i) o.directories.push_back(dir_.subdir("d" + std::to_string(i)));
    o.capacity_bytes = 4 << 20;
    o.stripe_bytes = kStripe;
    o.checksums = checksums;
    store_ = std::make_unique<SwapStore>(o, *engine_);
  }

  void TearDown() override {
    store_.reset();
    engine_.reset();
  }

  test::TestDir dir_;
  std::shared_ptr<FaultPlan> plan_;
  std::unique_ptr<IoEngine> engine_;
  std::unique_ptr<SwapStore> store_;
};

TEST_P(SwapStoreFault, WriteEioSurfacesWithKeyPathOffsetLength) {
  // Three files; unit 4 of the tensor is file 1's second stripe (offset 65536).
  FaultRule eio;
  eio.kind = FaultKind::kError;
  eio.op = IoOp::kWrite;
  eio.file = FileId{1};
  eio.offset_begin = kStripe;
  eio.offset_end = 2 * kStripe;
  eio.err = EIO;
  make({eio}, 3);
  const std::uint64_t bytes = 6 * kStripe;
  store_->allocate("w", bytes);
  AlignedBuffer out(bytes);
  fill_pattern(out.span(), 1, 0, 1);

  Status s = store_->swap_out("w", out.span()).wait_status();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), ErrorCode::kIo);
  EXPECT_EQ(s.sys_errno(), EIO);
  EXPECT_EQ(s.path(), store_->file_paths()[1]);
  EXPECT_EQ(s.offset(), kStripe);
  EXPECT_EQ(s.length(), kStripe);
  const std::string text = s.to_string();
  const std::string engine = std::string(engine_->name());
  EXPECT_EQ(text, "swap_out of key 'w': write failed: " + store_->file_paths()[1] +
                      " offset=65536 length=65536 done=0 engine=" + engine +
                      ": Input/output error at piece offset=65536 length=65536 (EIO)");
  EXPECT_EQ(plan_->injected_errors(), 1u);
  EXPECT_EQ(store_->stats().failures, 1u);

  // The key's stored bytes are undefined now: swap_in refuses, quoting the failure.
  AlignedBuffer in(bytes);
  try {
    (void)store_->swap_in("w", in.span());
    FAIL() << "swap_in of a key whose swap_out failed";
  } catch (const EngineFailed& e) {
    EXPECT_EQ(std::string(e.what()), "refusing work after an earlier failure: " + text);
  }
  // The store stays usable: the rule fired once, so rewriting the whole tensor heals the key.
  store_->swap_out("w", out.span()).wait();
  store_->swap_in("w", in.span()).wait();
  EXPECT_EQ(check_pattern(in.span(), 1, 0, 1), "");
}

TEST_P(SwapStoreFault, WriteEioThroughTheTicketException) {
  FaultRule eio;
  eio.op = IoOp::kWrite;
  eio.err = EIO;
  make({eio}, 1);
  store_->allocate("k", 3 * kStripe);
  AlignedBuffer out(3 * kStripe);
  try {
    store_->swap_out("k", out.span()).wait();
    FAIL() << "EIO not reported";
  } catch (const IoError& e) {
    EXPECT_EQ(e.sys_errno(), EIO);
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("swap_out of key 'k': write failed: " + store_->file_paths()[0] +
                             " offset=0 length=196608 ",
                         0),
              0u)
        << what;
    EXPECT_TRUE(what.ends_with("(EIO)")) << what;
  }
}

TEST_P(SwapStoreFault, ReadEioLeavesTheStoreUsable) {
  FaultRule eio;
  eio.op = IoOp::kRead;
  eio.offset_begin = 2 * kStripe;
  eio.offset_end = 3 * kStripe;
  eio.err = EIO;
  make({eio}, 1, /*checksums=*/true);
  store_->allocate("r", 4 * kStripe);
  AlignedBuffer out(4 * kStripe);
  fill_pattern(out.span(), 2, 0, 1);
  store_->swap_out("r", out.span()).wait();
  AlignedBuffer in(4 * kStripe);
  Status s = store_->swap_in("r", in.span()).wait_status();
  EXPECT_EQ(s.sys_errno(), EIO);
  EXPECT_EQ(s.path(), store_->file_paths()[0]);
  EXPECT_EQ(s.offset(), 2 * kStripe);
  EXPECT_EQ(s.length(), kStripe);
  EXPECT_EQ(s.operation(), "swap_in of key 'r': read");
  // A read error does not touch the stored data: the next swap_in succeeds.
  store_->swap_in("r", in.span()).wait();
  EXPECT_EQ(check_pattern(in.span(), 2, 0, 1), "");
}

TEST_P(SwapStoreFault, ShortTransfersAreResubmittedAndDataIsExact) {
  FaultRule short_w;
  short_w.kind = FaultKind::kShort;
  short_w.op = IoOp::kWrite;
  short_w.short_bytes = 4096 + 512;
  short_w.times = 1000;
  FaultRule short_r = short_w;
  short_r.op = IoOp::kRead;
  short_r.short_bytes = 8192;
  for (bool checksums : {false, true}) {
    SCOPED_TRACE(checksums ? "checksums" : "no checksums");
    make({short_w, short_r}, 2, checksums);
    const std::uint64_t bytes = 5 * kStripe + 12345;
    store_->allocate("s", bytes);
    AlignedBuffer out(store_->padded_size(bytes));
    fill_pattern(out.span(), 3, 0, 7);
    store_->swap_out("s", out.span()).wait();
    AlignedBuffer in(store_->padded_size(bytes));
    store_->swap_in("s", in.span()).wait();
    EXPECT_EQ(check_pattern(in.span(), 3, 0, 7), "");
    EXPECT_GT(engine_->stats().short_resubmits, 10u);
    EXPECT_GT(plan_->injected(), 10u);
    EXPECT_EQ(store_->stats().failures, 0u);
    TearDown();
  }
}

TEST_P(SwapStoreFault, SameKeyOverlapRefusedWhileInFlight) {
  // Hold the write's pieces in flight long enough for the overlapping calls below (they run
  // right after submit, so the delay only has to outlast a few function calls).
  FaultRule delay;
  delay.kind = FaultKind::kDelay;
  delay.op = IoOp::kWrite;
  delay.delay = std::chrono::milliseconds(1500);
  make({delay}, 1);
  store_->allocate("k", 4 * kStripe);
  store_->allocate("other", kStripe);
  AlignedBuffer out(4 * kStripe);
  fill_pattern(out.span(), 4, 0, 1);
  IoTicket t = store_->swap_out_range("k", 0, 2 * kStripe, out.span().first(2 * kStripe));
  AlignedBuffer in(4 * kStripe);
  EXPECT_THROW((void)store_->swap_out("k", out.span()), UsageError);
  EXPECT_THROW((void)store_->swap_in_range("k", kStripe, kStripe, in.span()), UsageError);
  EXPECT_THROW(store_->release("k"), UsageError);
  // A disjoint range of the same key, and other keys, are fine.
  IoTicket t2 =
      store_->swap_out_range("k", 2 * kStripe, 2 * kStripe, out.span().subspan(2 * kStripe));
  IoTicket t3 = store_->swap_out("other", out.span().first(kStripe));
  EXPECT_FALSE(t.poll()) << "the delay did not hold the write in flight; the checks above "
                            "may not have seen it";
  t.wait();
  t2.wait();
  t3.wait();
  store_->swap_in("k", in.span()).wait();
  EXPECT_EQ(check_pattern(in.span(), 4, 0, 1), "");
  store_->release("k");
}

// Integrity is on by default: a byte changed in the file behind the store's back (a drive's
// silent error, a stray write) fails the swap_in as kCorrupt naming the file, the offset and
// both CRCs, and the buffer is not data. The file is found through the open descriptors, not
// by name (the store may keep it anonymous).
TEST_P(SwapStoreFault, DefaultOptionsRefuseAByteFlippedInTheFile) {
  make({}, 1);
  SwapStoreOptions o;  // only what must be given: integrity is the default's
  o.directories = {dir_.subdir("default")};
  o.capacity_bytes = 4 << 20;
  SwapStore store(o, *engine_);
  EXPECT_TRUE(store.checksums());
  const std::uint64_t unit = store.stripe_bytes();
  const std::uint64_t bytes = 3 * unit;
  store.allocate("w", bytes);
  AlignedBuffer out(bytes);
  fill_pattern(out.span(), 9, 0, 1);
  store.swap_out("w", out.span()).wait();

  // One file, the tensor at its start: unit 1 is file offset `unit`. Flip one byte inside it.
  const auto flip = test::flip_swap_file_byte(o.directories[0], unit + 123);
  ASSERT_EQ(flip.before, out.data()[unit + 123]) << "the flip did not hit the stored tensor";
  std::vector<std::byte> corrupted(out.data() + unit, out.data() + 2 * unit);
  corrupted[123] = flip.after;
  char crcs[64];
  std::snprintf(crcs, sizeof crcs, "crc32c written 0x%08x, read 0x%08x",
                crc32c(out.span().subspan(unit, unit)), crc32c(corrupted));
  const std::string& path = store.file_paths()[0];
  const std::string where =
      path + " offset=" + std::to_string(unit) + " length=" + std::to_string(unit);

  AlignedBuffer in(bytes);
  try {
    store.swap_in("w", in.span()).wait();
    FAIL() << "a flipped byte was handed back as data";
  } catch (const IoError& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCorrupt);
    EXPECT_EQ(e.status().path(), path);
    EXPECT_EQ(e.status().offset(), unit);
    EXPECT_EQ(e.status().length(), unit);
    EXPECT_EQ(std::string(e.what()),
              "swap_in of key 'w' failed: " + where + ": checksum mismatch in stripe unit 1 " +
                  "(tensor offset " + std::to_string(unit) + " length " + std::to_string(unit) +
                  ", stored at " + where + "): " + crcs);
  }
  // A range read verifies too: the untouched unit reads, the flipped one fails again.
  AlignedBuffer one(unit);
  store.swap_in_range("w", 0, unit, one.span()).wait();
  EXPECT_EQ(check_pattern(one.span(), 9, 0, 1), "");
  try {
    store.swap_in_range("w", unit, unit, one.span()).wait();
    FAIL() << "a flipped byte was handed back as data by swap_in_range";
  } catch (const IoError& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCorrupt);
    EXPECT_NE(std::string(e.what()).find(crcs), std::string::npos) << e.what();
  }
  EXPECT_EQ(store.stats().checksum_failures, 2u);
  // Rewriting the tensor heals it.
  store.swap_out("w", out.span()).wait();
  store.swap_in("w", in.span()).wait();
  EXPECT_EQ(check_pattern(in.span(), 9, 0, 1), "");
}

INSTANTIATE_TEST_SUITE_P(Backends, SwapStoreFault, ::testing::ValuesIn(test::all_backends()),
                         test::backend_param_name);

}  // namespace
}  // namespace zinf::swap
