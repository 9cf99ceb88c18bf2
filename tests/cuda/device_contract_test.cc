// SPDX-License-Identifier: Apache-2.0
// The Device contract (zinf/cuda/device.h, and adopting native streams through
// zinf/cuda/cuda_interop.h), run against every backend. Built twice: as
// device_contract_test for the host simulation (uncapped and bandwidth-capped), and with
// ZINF_TEST_CUDA_BACKEND as device_contract_gpu_test (label gpu) for CUDA, where every case
// skips with the runtime's reason when no device is visible.
#include "zinf/cuda/device.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ostream>
#include <cstddef>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "support/pattern.h"
#include "device_test_util.h"
#include "zinf/common/error.h"
#include "zinf/cuda/cuda_interop.h"

namespace zinf::cuda {
namespace {

using test::check_pattern;
using test::fill_pattern;
using test::Gate;
using test::PageBuffer;

struct Backend {
  const char* label;
  DeviceOptions options;
};

// Names the backend in gtest's output instead of dumping its bytes.
[[maybe_unused]] void PrintTo(const Backend& backend, std::ostream* os) { *os << backend.label; }

#if ZINF_TEST_CUDA_BACKEND
const Backend kBackends[] = {{"cuda", DeviceOptions{DeviceKind::kCuda}}};
#else
// 1 GiB of simulated device memory, so that running out of it is part of the contract run;
// 4 GB/s keeps the capped variant's copies (at most a few MiB) in milliseconds.
const Backend kBackends[] = {
    {"host", DeviceOptions{DeviceKind::kHost, 0, 0, 1ull << 30}},
    {"host_capped", DeviceOptions{DeviceKind::kHost, 0, 4.0, 1ull << 30}},
};
#endif

PageBuffer patterned(std::size_t n, std::uint32_t id, std::uint32_t generation,
                     std::uint64_t offset = 0) {
  PageBuffer v(n);
  fill_pattern(v, id, offset, generation);
  return v;
}

class DeviceContract : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    if (GetParam().options.kind == DeviceKind::kCuda) {
      CudaAvailability cuda = probe_cuda();
      if (!cuda.available()) GTEST_SKIP() << "no CUDA device visible: " << cuda.reason;
    }
    device_ = make_device(GetParam().options);
  }

  std::string name() const { return std::string(device_->name()); }

  std::unique_ptr<Device> device_;
};

TEST_P(DeviceContract, RoundTripEveryBytePageableAndPinned) {
  // An odd size, copied in two pieces at odd offsets, both from pageable and pinned memory.
  constexpr std::size_t kSize = (1u << 20) + 123;
  constexpr std::size_t kSplit = 4099;
  DeviceBuffer buf = device_->allocate(kSize);
  ASSERT_EQ(buf.size(), kSize);
  Stream s = device_->create_stream();
  for (bool pinned : {false, true}) {
    SCOPED_TRACE(pinned ? "pinned" : "pageable");
    const std::uint32_t gen = pinned ? 2 : 1;
    PageBuffer in = patterned(kSize, 7, gen);
    PageBuffer out(kSize);
    PinnedRegistration reg_in, reg_out;
    if (pinned) {
      reg_in = device_->register_host(in);
      reg_out = device_->register_host(out);
    }
    device_->copy_to_device(s, buf, 0, in.span().first(kSplit));
    device_->copy_to_device(s, buf.span(kSplit, kSize - kSplit), in.span().subspan(kSplit));
    device_->copy_to_host(s, out.span().first(kSize - kSplit), buf, 0);
    device_->copy_to_host(s, out.span().subspan(kSize - kSplit),
                          buf.span().subspan(kSize - kSplit, kSplit));
    device_->synchronize(s);
    EXPECT_EQ(check_pattern(out, 7, 0, gen), "");
    EXPECT_TRUE(reg_in.close().ok());
    EXPECT_TRUE(reg_out.close().ok());
  }
}

TEST_P(DeviceContract, CopiesOnOneStreamRunInOrder) {
  // 32 generations go through the same device range; each is read back before the next lands.
  // All of it is enqueued before one synchronize, so only stream order can make this pass.
  constexpr std::size_t kSize = 64 * 1024 + 8;
  constexpr std::uint32_t kGenerations = 32;
  DeviceBuffer buf = device_->allocate(kSize);
  Stream s = device_->create_stream();
  std::vector<PageBuffer> in, out;
  std::vector<PinnedRegistration> regs;
  for (std::uint32_t g = 0; g < kGenerations; ++g) {
    in.push_back(patterned(kSize, 3, g));
    out.emplace_back(kSize);
  }
  for (std::uint32_t g = 0; g < kGenerations; ++g) {
    regs.push_back(device_->register_host(in[g]));
    regs.push_back(device_->register_host(out[g]));
  }
  for (std::uint32_t g = 0; g < kGenerations; ++g) {
    device_->copy_to_device(s, buf.span(), in[g]);
    device_->copy_to_host(s, out[g], buf.span());
  }
  device_->synchronize(s);
  for (std::uint32_t g = 0; g < kGenerations; ++g) {
    EXPECT_EQ(check_pattern(out[g], 3, 0, g), "") << "generation " << g;
  }
}

TEST_P(DeviceContract, HostWorkRunsInStreamOrder) {
  Stream s = device_->create_stream();
  std::vector<int> order;  // touched only by the stream's work, read after synchronize
  for (int i = 0; i < 100; ++i) device_->enqueue_host_work(s, [&order, i] { order.push_back(i); });
  device_->synchronize(s);
  ASSERT_EQ(order.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[i], i);
}

TEST_P(DeviceContract, StreamWaitsForEventOfAnotherStreamWithoutBlockingHost) {
  constexpr std::size_t kSize = 256 * 1024;
  DeviceBuffer buf = device_->allocate(kSize);
  PageBuffer old_data = patterned(kSize, 5, 1);
  PageBuffer new_data = patterned(kSize, 5, 2);
  PageBuffer out(kSize);
  PinnedRegistration r1 = device_->register_host(old_data);
  PinnedRegistration r2 = device_->register_host(new_data);
  PinnedRegistration r3 = device_->register_host(out);
  Stream copy = device_->create_stream();
  Stream compute = device_->create_stream();
  Event ready = device_->create_event();
  Gate gate;

  device_->copy_to_device(copy, buf.span(), old_data);
  device_->synchronize(copy);
  // copy: [blocked on gate] -> new data -> record(ready);  compute: wait(ready) -> read back.
  device_->enqueue_host_work(copy, gate.waiter());
  device_->copy_to_device(copy, buf.span(), new_data);
  device_->record(ready, copy);
  device_->wait(compute, ready);  // returns although the copy stream is blocked
  device_->copy_to_host(compute, out, buf.span());

  EXPECT_FALSE(ready.query());
  // The compute stream is held at the wait, so its read-back has not written anything yet.
  for (std::byte b : out) ASSERT_EQ(b, std::byte{0});

  gate.open();
  device_->synchronize(compute);
  EXPECT_EQ(check_pattern(out, 5, 0, 2), "");
  EXPECT_TRUE(ready.query());
}

TEST_P(DeviceContract, BusyHoldsItsStreamAndWhatWaitsOnItWithoutBlockingHost) {
  // busy(1 s) -> copy in -> record(e) on one stream; wait(e) -> copy back on another. The host
  // returns from every enqueue at once (the event is still pending right after), the copy back
  // sees the copy in, and nothing completes before the busy time has passed.
  using namespace std::chrono_literals;
  constexpr std::size_t kSize = 64 * 1024;
  DeviceBuffer buf = device_->allocate(kSize);
  PageBuffer in = patterned(kSize, 9, 1);
  PageBuffer out(kSize);
  PinnedRegistration r1 = device_->register_host(in);
  PinnedRegistration r2 = device_->register_host(out);
  Stream s = device_->create_stream();
  Stream t = device_->create_stream();
  Event e = device_->create_event();
  const auto start = std::chrono::steady_clock::now();
  device_->enqueue_busy(s, 1s);
  device_->copy_to_device(s, buf.span(), in);
  device_->record(e, s);
  device_->wait(t, e);
  device_->copy_to_host(t, out, buf.span());
  EXPECT_FALSE(e.query()) << "the busy time is spent on the device, not in the enqueue";
  device_->synchronize(t);
  EXPECT_GE(std::chrono::steady_clock::now() - start, 1s);
  EXPECT_TRUE(e.query());
  EXPECT_EQ(check_pattern(out, 9, 0, 1), "");
  device_->enqueue_busy(s, 0s);  // nothing to do
  device_->synchronize(s);
}

TEST_P(DeviceContract, EventQueryBeforeAndAfterItsWork) {
  Stream s = device_->create_stream();
  Event e = device_->create_event();
  EXPECT_TRUE(e.query()) << "an event never recorded counts as complete";
  e.synchronize();  // returns at once
  Gate gate;
  device_->enqueue_host_work(s, gate.waiter());
  device_->record(e, s);
  EXPECT_FALSE(e.query());
  EXPECT_FALSE(e.query()) << "query does not change anything";
  gate.open();
  e.synchronize();
  EXPECT_TRUE(e.query());
  device_->synchronize(s);
}

TEST_P(DeviceContract, EventTracksItsLatestRecord) {
  Stream blocked = device_->create_stream();
  Stream free_stream = device_->create_stream();
  Event e = device_->create_event();
  Gate gate;
  device_->enqueue_host_work(blocked, gate.waiter());
  device_->record(e, blocked);
  EXPECT_FALSE(e.query());
  device_->record(e, free_stream);  // replaces the first record
  device_->synchronize(free_stream);
  e.synchronize();
  EXPECT_TRUE(e.query());
  gate.open();
  device_->synchronize(blocked);
}

TEST_P(DeviceContract, WaitOnEventNeverRecordedDoesNotBlock) {
  Stream s = device_->create_stream();
  Event e = device_->create_event();
  bool ran = false;
  device_->wait(s, e);
  device_->enqueue_host_work(s, [&ran] { ran = true; });
  device_->synchronize(s);
  EXPECT_TRUE(ran);
}

TEST_P(DeviceContract, ManyStreamsFromManyThreads) {
  // 4 threads x 4 streams, each stream with its own region and pattern, enqueued concurrently.
  constexpr int kThreads = 4;
  constexpr int kStreamsPerThread = 4;
  constexpr std::size_t kRegion = 96 * 1024 + 40;
  constexpr int kStreams = kThreads * kStreamsPerThread;
  DeviceBuffer buf = device_->allocate(kRegion * kStreams);
  std::vector<PageBuffer> in, out;
  std::vector<PinnedRegistration> regs;
  for (int i = 0; i < kStreams; ++i) {
    in.push_back(patterned(kRegion, static_cast<std::uint32_t>(100 + i), 9, kRegion * i));
    out.emplace_back(kRegion);
    regs.push_back(device_->register_host(in[i]));
    regs.push_back(device_->register_host(out[i]));
  }
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<Stream> streams;
      for (int k = 0; k < kStreamsPerThread; ++k) streams.push_back(device_->create_stream());
      for (int k = 0; k < kStreamsPerThread; ++k) {
        int i = t * kStreamsPerThread + k;
        DeviceSpan region = buf.span(kRegion * i, kRegion);
        device_->copy_to_device(streams[k], region, in[i]);
        device_->copy_to_host(streams[k], out[i], region);
      }
      for (Stream& st : streams) device_->synchronize(st);
    });
  }
  for (std::thread& th : threads) th.join();
  for (int i = 0; i < kStreams; ++i) {
    EXPECT_EQ(check_pattern(out[i], static_cast<std::uint32_t>(100 + i), kRegion * i, 9), "")
        << "stream " << i;
  }
  EXPECT_EQ(device_->stats().bytes_to_device, kRegion * kStreams);
  EXPECT_EQ(device_->stats().bytes_to_host, kRegion * kStreams);
}

TEST_P(DeviceContract, AllocationAccounting) {
  const DeviceStats before = device_->stats();
  EXPECT_EQ(before.allocated_bytes, 0u);
  EXPECT_EQ(before.live_allocations, 0u);
  {
    DeviceBuffer a = device_->allocate(4096);
    DeviceBuffer b = device_->allocate(1000);
    DeviceBuffer empty = device_->allocate(0);
    EXPECT_TRUE(empty.empty());
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(a.data()) % 256, 0u);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b.data()) % 256, 0u);
    DeviceStats st = device_->stats();
    EXPECT_EQ(st.allocated_bytes, 5096u);
    EXPECT_EQ(st.live_allocations, 2u);
    EXPECT_EQ(st.total_allocations, 2u);
    EXPECT_EQ(st.peak_allocated_bytes, 5096u);

    DeviceBuffer moved = std::move(a);  // ownership moves, nothing is counted twice
    EXPECT_TRUE(a.empty());  // NOLINT(bugprone-use-after-move): a moved-from owner is empty
    EXPECT_EQ(moved.size(), 4096u);
    EXPECT_EQ(device_->stats().allocated_bytes, 5096u);
    moved.reset();
    EXPECT_TRUE(moved.empty());
    st = device_->stats();
    EXPECT_EQ(st.allocated_bytes, 1000u);
    EXPECT_EQ(st.live_allocations, 1u);
    EXPECT_EQ(st.peak_allocated_bytes, 5096u);
  }
  DeviceStats after = device_->stats();
  EXPECT_EQ(after.allocated_bytes, 0u);
  EXPECT_EQ(after.live_allocations, 0u);
  EXPECT_EQ(after.total_allocations, 2u);
}

TEST_P(DeviceContract, AllocationBeyondCapacityIsDeviceError) {
  const std::uint64_t capacity = device_->stats().capacity_bytes;
  ASSERT_GT(capacity, 0u);
  const std::size_t bytes = capacity + 4096;
  try {
    DeviceBuffer b = device_->allocate(bytes);
    FAIL() << "allocating " << bytes << " bytes succeeded";
  } catch (const DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(bytes) + " bytes"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(device_->stats().allocated_bytes, 0u);
  EXPECT_EQ(device_->stats().live_allocations, 0u);
  DeviceBuffer still_works = device_->allocate(4096);
  EXPECT_EQ(still_works.size(), 4096u);
}

TEST_P(DeviceContract, PinnedRegistrationAndPageableCopies) {
  PageBuffer pinned_mem(64 * 1024), pageable(4096);
  DeviceBuffer buf = device_->allocate(64 * 1024);
  Stream s = device_->create_stream();
  {
    PinnedRegistration reg = device_->register_host(pinned_mem);
    EXPECT_EQ(reg.range().data(), pinned_mem.data());
    DeviceStats st = device_->stats();
    EXPECT_EQ(st.pinned_bytes, 64u * 1024);
    EXPECT_EQ(st.pinned_registrations, 1u);

    device_->copy_to_device(s, buf.span(), pinned_mem);
    device_->copy_to_host(s, pinned_mem.span().subspan(1024, 4096), buf.span(0, 4096));
    device_->copy_to_device(s, buf.span(0, 4096), pageable);
    device_->synchronize(s);
    EXPECT_EQ(device_->stats().pageable_copies, 1u);

    PinnedRegistration moved = std::move(reg);
    EXPECT_TRUE(reg.empty());  // NOLINT(bugprone-use-after-move)
    EXPECT_TRUE(moved.close().ok());
    EXPECT_TRUE(moved.empty());
    EXPECT_TRUE(moved.close().ok()) << "closing twice is a no-op";
    EXPECT_EQ(device_->stats().pinned_bytes, 0u);
    // The range can be registered again once released.
    PinnedRegistration again = device_->register_host(pinned_mem);
    EXPECT_EQ(device_->stats().pinned_registrations, 1u);
  }
  EXPECT_EQ(device_->stats().pinned_registrations, 0u);
}

TEST_P(DeviceContract, OverlappingRegistrationIsDeviceError) {
  PageBuffer mem(8192);
  PinnedRegistration reg = device_->register_host(mem.span().first(4096));
  std::span<std::byte> overlapping = mem.span().subspan(2048, 4096);
  try {
    PinnedRegistration bad = device_->register_host(overlapping);
    FAIL() << "overlapping registration succeeded";
  } catch (const DeviceError& e) {
    char first[32], second[32];
    std::snprintf(first, sizeof first, "0x%zx",
                  reinterpret_cast<std::uintptr_t>(overlapping.data()));
    std::snprintf(second, sizeof second, "0x%zx", reinterpret_cast<std::uintptr_t>(mem.data()));
    EXPECT_EQ(std::string(e.what()),
              "register_host on " + name() + ": address=" + first +
                  " length=4096 overlaps a registered range (address=" + second + " length=4096)");
  }
  // The second half does not overlap and registers.
  PinnedRegistration rest = device_->register_host(mem.span().subspan(4096));
  EXPECT_EQ(device_->stats().pinned_bytes, 8192u);
  EXPECT_THROW((void)device_->register_host({}), UsageError);
}

TEST_P(DeviceContract, MisuseIsUsageErrorWithExactText) {
  DeviceBuffer buf = device_->allocate(4096);
  Stream s = device_->create_stream();
  Event e = device_->create_event();
  PageBuffer host(200);
  auto expect_usage = [](auto&& call, const std::string& text) {
    try {
      call();
      ADD_FAILURE() << "no UsageError; expected: " << text;
    } catch (const UsageError& err) {
      EXPECT_EQ(std::string(err.what()), text);
    }
  };
  const std::string n = name();
  expect_usage([&] { device_->copy_to_device(s, buf, 4000, host); },
               "device range out of bounds on " + n + ": offset=4000 length=200 size=4096");
  expect_usage([&] { device_->copy_to_host(s, host, buf, 3897); },
               "device range out of bounds on " + n + ": offset=3897 length=200 size=4096");
  expect_usage([&] { (void)buf.span(4097, 0); },
               "device range out of bounds on " + n + ": offset=4097 length=0 size=4096");
  expect_usage([&] { (void)buf.span(8, 100).subspan(50, 51); },
               "device range out of bounds on " + n + ": offset=50 length=51 size=100");
  expect_usage([&] { device_->copy_to_device(s, buf.span(), host); },
               "copy_to_device on " + n + ": source length 200 != destination length 4096");
  expect_usage([&] { device_->copy_to_host(s, host, buf.span(0, 100)); },
               "copy_to_host on " + n + ": source length 100 != destination length 200");
  expect_usage([&] { device_->copy_to_device(StreamRef{}, buf.span(0, 200), host); },
               "copy_to_device on " + n + ": empty stream");
  expect_usage([&] { device_->synchronize(StreamRef{}); },
               "synchronize on " + n + ": empty stream");
  Event empty_event;
  expect_usage([&] { device_->record(empty_event, s); }, "record on " + n + ": empty event");
  expect_usage([&] { device_->wait(s, empty_event); }, "wait on " + n + ": empty event");
  expect_usage([&] { (void)empty_event.query(); }, "Event::query: empty event");
  expect_usage([&] { device_->enqueue_host_work(s, {}); },
               "enqueue_host_work on " + n + ": empty function");
  expect_usage([&] { device_->enqueue_busy(s, std::chrono::nanoseconds(-5)); },
               "enqueue_busy on " + n + ": negative duration -5 ns");
  expect_usage([&] { device_->enqueue_busy(StreamRef{}, std::chrono::milliseconds(1)); },
               "enqueue_busy on " + n + ": empty stream");

  std::unique_ptr<Device> other = make_device(GetParam().options);
  Stream other_stream = other->create_stream();
  Event other_event = other->create_event();
  DeviceBuffer other_buf = other->allocate(200);
  expect_usage([&] { device_->copy_to_device(other_stream, buf.span(0, 200), host); },
               "copy_to_device on " + n + ": the stream belongs to another device");
  expect_usage([&] { device_->copy_to_host(s, host, other_buf.span()); },
               "copy_to_host on " + n + ": the device span belongs to another device");
  expect_usage([&] { device_->record(other_event, s); },
               "record on " + n + ": the event belongs to another device");
  expect_usage([&] { device_->wait(s, other_event); },
               "wait on " + n + ": the event belongs to another device");
  // Nothing of the above was enqueued: the stream is healthy.
  device_->synchronize(s);
  EXPECT_EQ(device_->stats().bytes_to_device, 0u);
}

TEST_P(DeviceContract, FailedHostWorkFailsItsStreamEventsAndWaiters) {
  Stream s = device_->create_stream();
  Stream waiter = device_->create_stream();
  Event before = device_->create_event();
  Event after = device_->create_event();
  std::atomic<bool> later_work_ran{false};
  std::atomic<bool> waiter_work_ran{false};

  device_->record(before, s);
  device_->enqueue_host_work(s, [] { throw std::runtime_error("boom"); });
  device_->enqueue_host_work(s, [&] { later_work_ran = true; });
  device_->record(after, s);
  device_->wait(waiter, after);
  device_->enqueue_host_work(waiter, [&] { waiter_work_ran = true; });

  const std::string expected =
      "host work on stream " + std::to_string(s.id()) + " failed: engine=" + name() + ": boom";
  for (int attempt = 0; attempt < 2; ++attempt) {  // the stream stays failed
    try {
      device_->synchronize(s);
      ADD_FAILURE() << "synchronize did not report the failure";
    } catch (const DeviceError& e) {
      EXPECT_EQ(std::string(e.what()), expected);
    }
  }
  EXPECT_FALSE(later_work_ran) << "a failed stream runs no more host work";
  EXPECT_TRUE(before.query()) << "an event recorded before the failure is clean";
  EXPECT_THROW(
      {
        try {
          (void)after.query();
        } catch (const DeviceError& e) {
          EXPECT_EQ(std::string(e.what()), expected);
          throw;
        }
      },
      DeviceError);
  EXPECT_THROW(after.synchronize(), DeviceError);
  try {
    device_->synchronize(waiter);
    ADD_FAILURE() << "the waiting stream did not inherit the failure";
  } catch (const DeviceError& e) {
    EXPECT_EQ(std::string(e.what()), expected);
  }
  EXPECT_FALSE(waiter_work_ran);

  // Another stream of the same device is unaffected.
  Stream fresh = device_->create_stream();
  bool ran = false;
  device_->enqueue_host_work(fresh, [&ran] { ran = true; });
  device_->synchronize(fresh);
  EXPECT_TRUE(ran);
}

TEST_P(DeviceContract, DestroyingAStreamWaitsForItsWork) {
  constexpr std::size_t kSize = 512 * 1024;
  DeviceBuffer buf = device_->allocate(kSize);
  PageBuffer in = patterned(kSize, 4, 4);
  PageBuffer out(kSize);
  PinnedRegistration r1 = device_->register_host(in);
  PinnedRegistration r2 = device_->register_host(out);
  std::atomic<bool> done{false};
  {
    Stream s = device_->create_stream();
    device_->copy_to_device(s, buf.span(), in);
    device_->copy_to_host(s, out, buf.span());
    device_->enqueue_host_work(s, [&done] { done = true; });
  }
  EXPECT_TRUE(done);
  EXPECT_EQ(check_pattern(out, 4, 0, 4), "");
}

TEST_P(DeviceContract, MovedFromOwnersAreEmpty) {
  Stream a = device_->create_stream();
  const std::uint64_t id = a.id();
  Stream b = std::move(a);
  EXPECT_TRUE(a.empty());  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(b.id(), id);
  EXPECT_EQ(b.ref().device(), device_.get());
  Stream c = device_->create_stream();
  EXPECT_NE(c.id(), b.id());
  c = std::move(b);  // c's old stream is destroyed
  EXPECT_EQ(c.id(), id);
  Event e = device_->create_event();
  Event f = std::move(e);
  EXPECT_TRUE(e.empty());  // NOLINT(bugprone-use-after-move)
  EXPECT_FALSE(f.empty());
  device_->record(f, c);
  f.synchronize();
}

// A trainer's stream: made by another Device of the same kind (for CUDA, any cudaStream_t of
// the GPU; for the host simulation, the stand-in adopt_stream documents), adopted by device_.
// Work the owner enqueues and work zinf enqueues through the adoption share one order.
TEST_P(DeviceContract, AdoptedStreamRunsInTheNativeStreamsOrder) {
  constexpr std::size_t kSize = 128 * 1024;
  std::unique_ptr<Device> trainer = make_device(GetParam().options);
  Stream native = trainer->create_stream();
  DeviceBuffer buf = device_->allocate(kSize);
  PageBuffer in = patterned(kSize, 11, 1);
  PageBuffer out(kSize);
  PinnedRegistration r1 = device_->register_host(in);
  PinnedRegistration r2 = device_->register_host(out);
  Event done = device_->create_event();
  {
    AdoptedStream adopted = adopt_stream(*device_, native_stream(native));
    Gate gate;
    EXPECT_FALSE(adopted.empty());
    EXPECT_EQ(adopted.native(), native_stream(native));
    EXPECT_EQ(native_stream(adopted), native_stream(native));
    EXPECT_EQ(adopted.ref().device(), device_.get());
    // native: [owner's work, blocked on the gate] -> zinf's copy in and out -> record(done).
    trainer->enqueue_host_work(native, gate.waiter());
    device_->copy_to_device(adopted, buf.span(), in);
    device_->copy_to_host(adopted, out, buf.span());
    device_->record(done, adopted);
    EXPECT_FALSE(done.query()) << "zinf's copies wait behind the owner's work";
    for (std::byte b : out) ASSERT_EQ(b, std::byte{0});
    gate.open();
    device_->synchronize(adopted);
    EXPECT_TRUE(done.query());
    EXPECT_EQ(check_pattern(out, 11, 0, 1), "");
  }
  trainer->synchronize(native);
}

TEST_P(DeviceContract, DestroyingAnAdoptionWaitsForItsWorkAndLeavesTheNativeStream) {
  std::unique_ptr<Device> trainer = make_device(GetParam().options);
  Stream native = trainer->create_stream();
  std::atomic<bool> zinf_done{false};
  {
    AdoptedStream adopted = adopt_stream(*device_, native_stream(native));
    device_->enqueue_host_work(adopted, [&zinf_done] { zinf_done = true; });
    AdoptedStream moved = std::move(adopted);
    EXPECT_TRUE(adopted.empty());  // NOLINT(bugprone-use-after-move)
    EXPECT_EQ(adopted.native(), nullptr);
  }
  EXPECT_TRUE(zinf_done);
  // The native stream is still its owner's, and still works.
  std::atomic<bool> owner_done{false};
  trainer->enqueue_host_work(native, [&owner_done] { owner_done = true; });
  trainer->synchronize(native);
  EXPECT_TRUE(owner_done);
}

TEST_P(DeviceContract, AdoptionMisuseIsUsageError) {
  EXPECT_THROW(adopt_stream(*device_, nullptr), UsageError);
  try {
    (void)native_stream(StreamRef());
    ADD_FAILURE() << "native_stream of an empty StreamRef";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(), "native_stream: empty stream");
  }
  if (GetParam().options.kind == DeviceKind::kCuda) return;  // a bad pointer is UB for CUDA
  // The host simulation checks a handle against its live streams, never dereferencing it.
  int not_a_stream = 0;
  try {
    (void)adopt_stream(*device_, &not_a_stream);
    ADD_FAILURE() << "adopted a pointer that is no stream";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("is not a live host stream"), std::string::npos)
        << e.what();
  }
  // An adoption that outlives its native stream's owner refuses work instead of hanging.
  std::optional<Stream> native(device_->create_stream());
  AdoptedStream adopted = adopt_stream(*device_, native_stream(*native));
  native.reset();
  EXPECT_THROW(device_->enqueue_host_work(adopted, [] {}), UsageError);
  EXPECT_THROW(adopt_stream(*device_, native_stream(adopted)), UsageError);
}

#if ZINF_TEST_CUDA_BACKEND
// The CUDA default stream, spelled as the runtime does (cudaStreamLegacy is (cudaStream_t)0x1).
TEST_P(DeviceContract, AdoptsTheLegacyDefaultStream) {
  constexpr std::size_t kSize = 4096;
  AdoptedStream legacy = adopt_stream(*device_, reinterpret_cast<void*>(0x1));
  DeviceBuffer buf = device_->allocate(kSize);
  PageBuffer in = patterned(kSize, 12, 1);
  PageBuffer out(kSize);
  device_->copy_to_device(legacy, buf.span(), in);
  device_->copy_to_host(legacy, out, buf.span());
  device_->synchronize(legacy);
  EXPECT_EQ(check_pattern(out, 12, 0, 1), "");
}
#endif

// Memory another allocator owns (here a DeviceBuffer's, standing in for PyTorch's) works as a
// DeviceSpan: copies through it reach that memory byte for byte.
TEST_P(DeviceContract, AdoptedDeviceMemoryRoundTripsEveryByte) {
  constexpr std::size_t kSize = 3 * 4096 + 17;
  DeviceBuffer owner = device_->allocate(kSize);
  const DeviceSpan span = adopt_device_memory(*device_, owner.data(), kSize);
  EXPECT_EQ(span.size(), kSize);
  EXPECT_EQ(span.device(), device_.get());
  Stream s = device_->create_stream();
  PageBuffer in = patterned(kSize, 21, 1);
  PageBuffer out(kSize);
  device_->copy_to_device(s, span, in);
  device_->copy_to_host(s, out, owner.span());
  device_->synchronize(s);
  EXPECT_EQ(check_pattern(out, 21, 0, 1), "");
  EXPECT_TRUE(adopt_device_memory(*device_, nullptr, 0).empty());
  try {
    (void)adopt_device_memory(*device_, nullptr, 8);
    ADD_FAILURE() << "no throw";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()),
              "adopt_device_memory: null address for 8 bytes on device " + std::string(name()));
  }
  if (GetParam().options.kind == DeviceKind::kCuda) {
    PageBuffer host(4096);  // host memory is refused, naming the address
    EXPECT_THROW((void)adopt_device_memory(*device_, host.data(), 4096), UsageError);
  }
}

TEST_P(DeviceContract, CopyOnDeviceMovesEveryByteInStreamOrderAndCountsNoHostCopy) {
  // A copy between two device buffers at odd offsets, ordered after the copy that filled the
  // source and before the one that reads the destination back; counted on its own, never as
  // a pageable copy.
  constexpr std::size_t kSize = (1u << 20) + 4099;
  DeviceBuffer a = device_->allocate(kSize + 3);
  DeviceBuffer b = device_->allocate(kSize + 5);
  Stream s = device_->create_stream();
  PageBuffer in = patterned(kSize, 31, 4);
  PageBuffer out(kSize);
  PinnedRegistration reg_in = device_->register_host(in);
  PinnedRegistration reg_out = device_->register_host(out);
  const DeviceStats before = device_->stats();
  device_->copy_to_device(s, a.span(3, kSize), in);
  device_->copy_on_device(s, b.span(5, kSize), a.span(3, kSize));
  device_->copy_to_host(s, out, b.span(5, kSize));
  device_->synchronize(s);
  EXPECT_EQ(check_pattern(out, 31, 0, 4), "");
  const DeviceStats after = device_->stats();
  EXPECT_EQ(after.bytes_on_device - before.bytes_on_device, kSize);
  EXPECT_EQ(after.bytes_to_device - before.bytes_to_device, kSize);
  EXPECT_EQ(after.pageable_copies, before.pageable_copies);
  // Misuse, before anything is enqueued.
  try {
    device_->copy_on_device(s, b.span(0, 8), a.span(0, 16));
    ADD_FAILURE() << "no throw";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()),
              "copy_on_device on " + name() + ": source length 16 != destination length 8");
  }
  try {
    device_->copy_on_device(s, a.span(8, 16), a.span(0, 16));
    ADD_FAILURE() << "no throw";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("copy_on_device on " + name() + ": source "),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find(" overlap"), std::string::npos) << e.what();
  }
  std::unique_ptr<Device> other = make_device(GetParam().options);
  DeviceBuffer foreign = other->allocate(16);
  EXPECT_THROW(device_->copy_on_device(s, a.span(0, 16), foreign.span()), UsageError);
  device_->copy_on_device(s, a.span(0, 0), b.span(0, 0));  // empty: nothing to do
  device_->synchronize(s);
  EXPECT_TRUE(reg_in.close().ok());
  EXPECT_TRUE(reg_out.close().ok());
}

TEST_P(DeviceContract, NameAndKind) {
  if (GetParam().options.kind == DeviceKind::kCuda) {
    EXPECT_EQ(device_->kind(), DeviceKind::kCuda);
    EXPECT_EQ(name(), "cuda:" + std::to_string(GetParam().options.device_index));
  } else {
    EXPECT_EQ(device_->kind(), DeviceKind::kHost);
    EXPECT_EQ(name(), "host");
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, DeviceContract, ::testing::ValuesIn(kBackends),
                         [](const ::testing::TestParamInfo<Backend>& param_info) {
                           return std::string(param_info.param.label);
                         });

}  // namespace
}  // namespace zinf::cuda
