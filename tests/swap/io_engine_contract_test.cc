// SPDX-License-Identifier: Apache-2.0
// The IoEngine contract (zinf/swap/io_engine.h), run against every backend that starts here:
// byte-exact round trips over many sizes, concurrency, ticket semantics, EOF and alignment
// errors, and the buffered path.
#include <atomic>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "io_test_util.h"
#include "support/pattern.h"
#include "support/test_dir.h"
#include "zinf/common/error.h"
#include "zinf/swap/fault_injection.h"
#include "zinf/swap/file.h"
#include "zinf/swap/io_engine.h"

namespace zinf::swap {
namespace {

using test::AlignedBuffer;
using test::check_pattern;
using test::fill_pattern;

constexpr std::uint32_t kBlock = 64 << 10;  // small blocks: many pieces per request, fast tests

class IoEngineContract : public test::BackendTest {
 protected:
  std::unique_ptr<IoEngine> make(std::shared_ptr<FaultPlan> faults = nullptr,
                                 std::uint32_t queue_depth = 8) {
    IoOptions o;
    o.kind = GetParam();
    o.block_size = kBlock;
    o.queue_depth = queue_depth;
    o.faults = std::move(faults);
    return make_io_engine(o);
  }

  File open_file(const std::string& name, bool direct = true) {
    FileOptions fo;
    fo.create = true;
    fo.direct = direct;
    return File::open(dir_.file(name), fo);
  }

  test::TestDir dir_;
};

TEST_P(IoEngineContract, NameIsTheBackend) {
  auto engine = make();
  EXPECT_EQ(engine->name(), io_engine_kind_name(GetParam()));
  auto faulty = make(std::make_shared<FaultPlan>());
  EXPECT_EQ(faulty->name(), std::string(io_engine_kind_name(GetParam())) + "+faults");
}

TEST_P(IoEngineContract, RoundTripsEveryByteForManySizes) {
  auto engine = make();
  File file = open_file("sizes.dat");
  const std::uint64_t a = std::max<std::uint32_t>(file.alignment(), 1);
  const FileId id = engine->attach(file);
  // 4 KiB, one block, odd multiples of the alignment, block multiples, and many blocks.
  const std::vector<std::uint64_t> sizes = {4096,        kBlock,     3 * 4096 + a,
                                            5 * a,       2 * kBlock, 3 * kBlock + 7 * a,
                                            64 * kBlock, kBlock - a, a};
  std::uint64_t offset = 0;
  std::uint32_t generation = 1;
  for (std::uint64_t size : sizes) {
    SCOPED_TRACE("size=" + std::to_string(size) + " offset=" + std::to_string(offset));
    AlignedBuffer out(size), in(size);
    fill_pattern(out.span(), id.index, offset, generation);
    IoRequest w{IoOp::kWrite, id, offset, out.span()};
    engine->submit({&w, 1}).wait();
    IoRequest r{IoOp::kRead, id, offset, in.span()};
    IoTicket t = engine->submit({&r, 1});
    t.wait();
    EXPECT_EQ(t.bytes_done(), size);
    EXPECT_EQ(check_pattern(in.span(), id.index, offset, generation), "");
    offset += size + a;  // leave an aligned gap so neighbours cannot hide a misplaced write
    ++generation;
  }
  const IoStats s = engine->stats();
  EXPECT_EQ(s.requests, 2 * sizes.size());
  EXPECT_EQ(s.failures, 0u);
  EXPECT_EQ(s.bytes_read, s.bytes_written);
  EXPECT_GE(s.pieces, 2u * 64);
}

TEST_P(IoEngineContract, ManyConcurrentTicketsFromSeveralThreads) {
  auto engine = make(nullptr, 16);
  File file = open_file("concurrent.dat");
  const FileId id = engine->attach(file);
  constexpr int kThreads = 4;
  constexpr int kBatchesPerThread = 16;
  constexpr std::uint64_t kRequestBytes = 3 * kBlock + 4096;  // 4 pieces, the last one short
  constexpr std::uint64_t kSlot = 4 * kBlock;
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      try {
        std::vector<AlignedBuffer> outs, ins;
        std::vector<IoTicket> tickets;
        // Each batch writes two requests in distinct slots, all tickets in flight together.
        for (int b = 0; b < kBatchesPerThread; ++b) {
          IoRequest reqs[2];
          for (int k = 0; k < 2; ++k) {
            const std::uint64_t off = ((t * kBatchesPerThread + b) * 2 + k) * kSlot;
            outs.emplace_back(kRequestBytes);
            fill_pattern(outs.back().span(), id.index, off, 7);
            reqs[k] = IoRequest{IoOp::kWrite, id, off, outs.back().span()};
          }
          tickets.push_back(engine->submit(reqs));
        }
        for (auto& tk : tickets) tk.wait();
        tickets.clear();
        for (int b = 0; b < kBatchesPerThread; ++b) {
          IoRequest reqs[2];
          for (int k = 0; k < 2; ++k) {
            const std::uint64_t off = ((t * kBatchesPerThread + b) * 2 + k) * kSlot;
            ins.emplace_back(kRequestBytes);
            reqs[k] = IoRequest{IoOp::kRead, id, off, ins.back().span()};
          }
          tickets.push_back(engine->submit(reqs));
        }
        for (auto& tk : tickets) tk.wait();
        for (int b = 0; b < kBatchesPerThread; ++b) {
          for (int k = 0; k < 2; ++k) {
            const std::uint64_t off = ((t * kBatchesPerThread + b) * 2 + k) * kSlot;
            std::string e = check_pattern(ins[b * 2 + k].span(), id.index, off, 7);
            if (!e.empty() && errors[t].empty()) errors[t] = e;
          }
        }
      } catch (const std::exception& e) {
        errors[t] = e.what();
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(errors[t], "") << "thread " << t;
  EXPECT_EQ(engine->stats().requests, std::uint64_t{kThreads * kBatchesPerThread * 2 * 2});
}

TEST_P(IoEngineContract, WaitForTimesOutAndPollReportsProgress) {
  // A 300 ms injected delay is a lower bound on completion, so the early checks cannot race.
  FaultRule delay;
  delay.kind = FaultKind::kDelay;
  delay.delay = std::chrono::milliseconds(300);
  auto engine = make(std::make_shared<FaultPlan>(std::vector<FaultRule>{delay}));
  File file = open_file("wait.dat");
  const FileId id = engine->attach(file);
  AlignedBuffer buf(4096);
  IoRequest w{IoOp::kWrite, id, 0, buf.span()};
  IoTicket t = engine->submit({&w, 1});
  EXPECT_FALSE(t.poll());
  EXPECT_FALSE(t.completed_at().has_value());
  EXPECT_FALSE(t.wait_for(std::chrono::milliseconds(1)));
  const auto before = std::chrono::steady_clock::now();
  EXPECT_TRUE(t.wait_for(std::chrono::seconds(30)));
  EXPECT_TRUE(t.poll());
  ASSERT_TRUE(t.completed_at().has_value());
  EXPECT_LE(*t.completed_at(), std::chrono::steady_clock::now());
  EXPECT_GE(std::chrono::steady_clock::now(), before);
  EXPECT_EQ(t.bytes_done(), 4096u);

  IoTicket empty;
  EXPECT_TRUE(empty.poll());
  EXPECT_TRUE(empty.wait_for(std::chrono::nanoseconds(0)));
  EXPECT_TRUE(engine->submit({}).poll());  // an empty batch completes at once
}

TEST_P(IoEngineContract, CallbackRunsExactlyOnceBeforeWaitReturns) {
  auto engine = make();
  File file = open_file("callback.dat");
  const FileId id = engine->attach(file);
  constexpr int kBatches = 32;
  std::vector<std::atomic<int>> calls(kBatches);
  std::vector<std::atomic<int>> failures(kBatches);
  std::vector<AlignedBuffer> bufs;
  std::vector<IoTicket> tickets;
  for (int i = 0; i < kBatches; ++i) {
    bufs.emplace_back(2 * kBlock);
    IoRequest w{IoOp::kWrite, id, std::uint64_t(i) * 2 * kBlock, bufs.back().span()};
    tickets.push_back(engine->submit({&w, 1}, [&, i](const Status& s) {
      calls[i].fetch_add(1);
      if (!s.ok()) failures[i].fetch_add(1);
    }));
  }
  for (auto& t : tickets) t.wait();
  for (int i = 0; i < kBatches; ++i) {
    EXPECT_EQ(calls[i].load(), 1) << "batch " << i;
    EXPECT_EQ(failures[i].load(), 0) << "batch " << i;
  }
  // A failing batch calls back once, with the failure.
  AlignedBuffer big(4 * kBlock);
  IoRequest r{IoOp::kRead, id, 2 * kBlock * kBatches, big.span()};  // entirely past EOF
  std::atomic<int> n{0};
  ErrorCode seen = ErrorCode::kOk;
  Status st = engine
                  ->submit({&r, 1},
                           [&](const Status& s) {
                             n.fetch_add(1);
                             seen = s.code();
                           })
                  .wait_status();
  EXPECT_EQ(n.load(), 1);
  EXPECT_EQ(seen, ErrorCode::kShortTransfer);
  EXPECT_EQ(st.code(), ErrorCode::kShortTransfer);
}

TEST_P(IoEngineContract, ReadPastEndOfFileIsShortTransferNamingTheRequest) {
  auto engine = make();
  File file = open_file("eof.dat");
  const FileId id = engine->attach(file);
  AlignedBuffer out(8192);
  fill_pattern(out.span(), id.index, 0, 3);
  IoRequest w{IoOp::kWrite, id, 0, out.span()};
  engine->submit({&w, 1}).wait();

  AlignedBuffer in(16384);
  IoRequest r{IoOp::kRead, id, 4096, in.span()};
  try {
    engine->submit({&r, 1}).wait();
    FAIL() << "a read past the end of the file succeeded";
  } catch (const IoError& e) {
    EXPECT_EQ(e.code(), ErrorCode::kShortTransfer);
    const std::string what = e.what();
    EXPECT_NE(what.find(file.path()), std::string::npos) << what;
    EXPECT_NE(what.find("offset=4096"), std::string::npos) << what;
    EXPECT_NE(what.find("length=16384"), std::string::npos) << what;
    EXPECT_NE(what.find("done=4096"), std::string::npos) << what;
    EXPECT_NE(what.find("engine=" + std::string(engine->name())), std::string::npos) << what;
    EXPECT_NE(what.find("read failed"), std::string::npos) << what;
  }
  // The bytes that did exist arrived intact.
  EXPECT_EQ(check_pattern(in.span().first(4096), id.index, 4096, 3), "");
  EXPECT_EQ(engine->stats().failures, 1u);
}

TEST_P(IoEngineContract, EndOfFileInsideABlockIsShortTransfer) {
  // A file whose size is not a multiple of the alignment: the direct read returns a partial
  // block, the remainder comes back empty, and that must not pass as success.
  auto engine = make();
  File file = open_file("odd.dat");
  {
    File buffered = File::open(file.path(), FileOptions{.direct = false});
    std::vector<std::byte> bytes(5000);
    fill_pattern(bytes, 9, 0, 1);
    ASSERT_EQ(::pwrite(buffered.fd(), bytes.data(), bytes.size(), 0), 5000);
  }
  const FileId id = engine->attach(file);
  AlignedBuffer in(8192);
  IoRequest r{IoOp::kRead, id, 0, in.span()};
  Status s = engine->submit({&r, 1}).wait_status();
  EXPECT_EQ(s.code(), ErrorCode::kShortTransfer) << s.to_string();
  EXPECT_EQ(s.bytes_done(), 5000u) << s.to_string();
  EXPECT_EQ(check_pattern(in.span().first(5000), 9, 0, 1), "");
}

TEST_P(IoEngineContract, MisalignedRequestsAreRejectedBeforeAnyIo) {
  auto engine = make();
  File file = open_file("align.dat");
  if (!file.is_direct())
    GTEST_SKIP() << "no O_DIRECT under " << file.path() << ": nothing to align";
  const std::uint32_t a = file.alignment();
  const FileId id = engine->attach(file);
  AlignedBuffer buf(4 * 4096);
  struct Case {
    const char* what;
    std::uint64_t offset;
    std::size_t skip;
    std::size_t length;
  };
  const Case cases[] = {
      {"buffer", 0, 1, 4096}, {"offset", a / 2, 0, 4096}, {"length", 0, 0, a + 100}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    // The first request is fine; the batch must still be refused whole.
    IoRequest batch[2] = {{IoOp::kWrite, id, 0, buf.span().first(4096)},
                          {IoOp::kWrite, id, c.offset, buf.span().subspan(c.skip, c.length)}};
    try {
      engine->submit(batch);
      FAIL() << "misaligned " << c.what << " accepted";
    } catch (const UsageError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(file.path()), std::string::npos) << what;
      EXPECT_NE(what.find("offset=" + std::to_string(c.offset)), std::string::npos) << what;
      EXPECT_NE(what.find("length=" + std::to_string(c.length)), std::string::npos) << what;
      EXPECT_NE(what.find("multiples of " + std::to_string(a)), std::string::npos) << what;
    }
  }
  IoRequest unknown{IoOp::kRead, FileId{id.index + 5}, 0, buf.span()};
  EXPECT_THROW(engine->submit({&unknown, 1}), UsageError);
  EXPECT_EQ(engine->stats().requests, 0u);
  EXPECT_EQ(file.size(), 0u) << "a refused batch wrote data";
}

TEST_P(IoEngineContract, BufferedFileTakesUnalignedIo) {
  auto engine = make();
  File file = open_file("buffered.dat", /*direct=*/false);
  ASSERT_FALSE(file.is_direct());
  EXPECT_EQ(file.alignment(), 1u);
  const FileId id = engine->attach(file);
  std::vector<std::byte> out(3 * kBlock + 1001), in(out.size());
  fill_pattern(out, id.index, 13, 2);
  IoRequest w{IoOp::kWrite, id, 13, std::span<std::byte>(out).subspan(0)};
  engine->submit({&w, 1}).wait();
  IoRequest r{IoOp::kRead, id, 13, std::span<std::byte>(in).subspan(0)};
  engine->submit({&r, 1}).wait();
  EXPECT_EQ(check_pattern(in, id.index, 13, 2), "");
  EXPECT_EQ(file.size(), 13 + out.size());
}

TEST_P(IoEngineContract, DetachedFileIsUnknown) {
  auto engine = make();
  File file = open_file("detach.dat");
  const FileId id = engine->attach(file);
  engine->detach(id);
  AlignedBuffer buf(4096);
  IoRequest r{IoOp::kRead, id, 0, buf.span()};
  EXPECT_THROW(engine->submit({&r, 1}), UsageError);
  const FileId again = engine->attach(file);  // ids are reused; the file works again
  IoRequest w{IoOp::kWrite, again, 0, buf.span()};
  engine->submit({&w, 1}).wait();
  EXPECT_EQ(file.size(), 4096u);
}

TEST_P(IoEngineContract, RegisteredBuffersRoundTripInsideAndOutsideTheRegion) {
  auto engine = make();
  File file = open_file("registered.dat");
  const FileId id = engine->attach(file);
  AlignedBuffer arena(8 * kBlock);
  const std::span<std::byte> regions[] = {arena.span()};
  // Root (CAP_IPC_LOCK) or a large enough memlock limit: registration succeeds; elsewhere it
  // may refuse, and I/O must work either way.
  const bool registered = engine->register_buffers(regions);
  if (GetParam() == IoEngineKind::kThreads) {
    EXPECT_TRUE(registered);
  }
  AlignedBuffer outside(2 * kBlock);
  // Inside the region (fixed buffers on uring), straddling nothing, then a buffer outside it.
  auto inside_out = arena.span().subspan(kBlock, 3 * kBlock);
  auto inside_in = arena.span().subspan(4 * kBlock, 3 * kBlock);
  fill_pattern(inside_out, id.index, 0, 4);
  fill_pattern(outside.span(), id.index, 3 * kBlock, 4);
  IoRequest writes[2] = {{IoOp::kWrite, id, 0, inside_out},
                         {IoOp::kWrite, id, 3 * kBlock, outside.span()}};
  engine->submit(writes).wait();
  AlignedBuffer back(2 * kBlock);
  IoRequest reads[2] = {{IoOp::kRead, id, 0, inside_in},
                        {IoOp::kRead, id, 3 * kBlock, back.span()}};
  engine->submit(reads).wait();
  EXPECT_EQ(check_pattern(inside_in, id.index, 0, 4), "");
  EXPECT_EQ(check_pattern(back.span(), id.index, 3 * kBlock, 4), "");
  // Replacing the registration with nothing is allowed and I/O goes on.
  EXPECT_TRUE(engine->register_buffers({}));
  engine->submit(reads).wait();
  EXPECT_EQ(check_pattern(inside_in, id.index, 0, 4), "");
}

INSTANTIATE_TEST_SUITE_P(Backends, IoEngineContract, ::testing::ValuesIn(test::all_backends()),
                         test::backend_param_name);

}  // namespace
}  // namespace zinf::swap
