// SPDX-License-Identifier: Apache-2.0
// ActivationStore on the host simulation of a device: round trips of odd sizes byte for byte
// on both tiers (the source overwritten right after wait_saved), loads in reverse order read
// ahead, the pinned budget held, a failed write-back or read surfacing at that tensor's load
// with the swap layer's text, and misuse refused with the exact message.
#include "zinf/offload/activation_store.h"

#include <cerrno>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "support/test_dir.h"
#include "zinf/common/error.h"
#include "zinf/swap/fault_injection.h"

namespace zinf::offload {
namespace {

constexpr std::uint64_t kMiB = 1 << 20;

std::vector<std::byte> pattern(std::size_t n, std::uint32_t seed) {
  std::vector<std::byte> out(n);
  std::uint32_t x = seed * 2654435761u + 1;
  for (auto& b : out) {
    x = x * 1664525u + 1013904223u;
    b = static_cast<std::byte>(x >> 24);
  }
  return out;
}

// A device, the trainer's stream, and a store of `tier`.
struct Rig {
  explicit Rig(ActivationStoreOptions o, const test::TestDir& dir) {
    device = cuda::make_device(cuda::DeviceOptions{.kind = cuda::DeviceKind::kHost});
    stream = device->create_stream();
    if (o.tier == ActivationTier::kNvme && o.directories.empty()) {
      o.directories = {dir.subdir("act")};
    }
    store = std::make_unique<ActivationStore>(*device, o);
  }
  ~Rig() {
    store.reset();
    buffers.clear();
  }
  // A device buffer holding `bytes`.
  cuda::DeviceBuffer& upload(const std::vector<std::byte>& bytes) {
    buffers.push_back(device->allocate(bytes.size()));
    device->copy_to_device(stream, buffers.back().span(), bytes);
    device->synchronize(stream);
    return buffers.back();
  }
  std::vector<std::byte> download(const cuda::DeviceBuffer& b) {
    std::vector<std::byte> out(b.size());
    device->copy_to_host(stream, out, b.span());
    device->synchronize(stream);
    return out;
  }

  std::unique_ptr<cuda::Device> device;
  cuda::Stream stream;
  std::deque<cuda::DeviceBuffer> buffers;  // references stay valid as it grows
  std::unique_ptr<ActivationStore> store;
};

ActivationStoreOptions options_for(ActivationTier tier) {
  ActivationStoreOptions o;
  o.tier = tier;
  o.capacity_bytes = 64 * kMiB;
  o.pinned_budget_bytes = 16 * kMiB;
  o.io.kind = swap::IoEngineKind::kThreads;
  return o;
}

// A plan that fails the first `op` piece at file offsets [begin, end) with EIO.
std::shared_ptr<swap::FaultPlan> eio_plan(swap::IoOp op, std::uint64_t begin, std::uint64_t end) {
  swap::FaultRule r;
  r.kind = swap::FaultKind::kError;
  r.op = op;
  r.offset_begin = begin;
  r.offset_end = end;
  r.err = EIO;
  return std::make_shared<swap::FaultPlan>(std::vector<swap::FaultRule>{r});
}

class ActivationStoreTiers : public ::testing::TestWithParam<ActivationTier> {};

// Forward saves tensors of odd sizes and overwrites each source right after wait_saved (as a
// caching allocator reusing the memory would); backward loads them in reverse into fresh
// buffers: every byte comes back.
TEST_P(ActivationStoreTiers, RoundTripsEveryByteInReverseOrder) {
  test::TestDir dir;
  Rig rig(options_for(GetParam()), dir);
  const std::vector<std::size_t> sizes = {1, 4095, 4096, 100000, kMiB, 3 * kMiB + 7};
  std::vector<std::vector<std::byte>> want;
  std::vector<ActivationStore::Handle> handles;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    want.push_back(pattern(sizes[i], static_cast<std::uint32_t>(i)));
    cuda::DeviceBuffer& src = rig.upload(want.back());
    handles.push_back(rig.store->save("act" + std::to_string(i), src.span(), rig.stream));
    rig.store->wait_saved(handles.back(), rig.stream);
    const std::vector<std::byte> junk(sizes[i], std::byte{0xEE});
    rig.device->copy_to_device(rig.stream, src.span(), junk);
    rig.device->synchronize(rig.stream);  // `junk` must outlive the copy
  }
  EXPECT_EQ(rig.store->stats().held_tensors, sizes.size());
  for (std::size_t k = sizes.size(); k-- > 0;) {
    cuda::DeviceBuffer dst = rig.device->allocate(sizes[k]);
    rig.store->load(handles[k], dst.span(), rig.stream);
    EXPECT_EQ(rig.download(dst), want[k]) << "tensor " << k;
  }
  const ActivationStats st = rig.store->stats();
  EXPECT_EQ(st.saved, sizes.size());
  EXPECT_EQ(st.loaded, sizes.size());
  EXPECT_EQ(st.held_tensors, 0u);
  EXPECT_EQ(st.held_bytes, 0u);
  EXPECT_LE(st.pinned_bytes_peak, 16 * kMiB);
  if (GetParam() == ActivationTier::kNvme) {
    EXPECT_EQ(st.hits + st.on_demand, sizes.size());
  }
}

INSTANTIATE_TEST_SUITE_P(Tiers, ActivationStoreTiers,
                         ::testing::Values(ActivationTier::kCpu, ActivationTier::kNvme),
                         [](const auto& p) {
                           return std::string(p.param == ActivationTier::kCpu ? "cpu" : "nvme");
                         });

// Twelve tensors through six tensors' worth of staging: forward waits for write-backs, and in
// backward every load but the first finds its tensor read ahead (or still in staging), while
// staging never holds more than its budget.
TEST(ActivationStore, NvmeReadsAheadInReverseOrderWithinTheBudget) {
  test::TestDir dir;
  ActivationStoreOptions o = options_for(ActivationTier::kNvme);
  o.pinned_budget_bytes = 6 * kMiB;
  o.prefetch_depth = 2;
  Rig rig(o, dir);
  std::vector<ActivationStore::Handle> handles;
  std::vector<std::vector<std::byte>> want;
  for (std::uint32_t i = 0; i < 12; ++i) {
    want.push_back(pattern(kMiB, 100 + i));
    cuda::DeviceBuffer& src = rig.upload(want.back());
    handles.push_back(rig.store->save("block" + std::to_string(i), src.span(), rig.stream));
  }
  rig.device->synchronize(rig.stream);
  for (std::size_t k = 12; k-- > 0;) {
    cuda::DeviceBuffer dst = rig.device->allocate(kMiB);
    rig.store->load(handles[k], dst.span(), rig.stream);
    EXPECT_EQ(rig.download(dst), want[k]) << "tensor " << k;
  }
  const ActivationStats st = rig.store->stats();
  EXPECT_LE(st.on_demand, 1u);
  EXPECT_EQ(st.hits + st.on_demand, 12u);
  EXPECT_GE(st.bytes_written, 6 * kMiB);  // at least half had to leave staging
  EXPECT_GE(st.bytes_read, 5 * kMiB);     // and came back through reads
  EXPECT_LE(st.pinned_bytes_peak, 6 * kMiB);
}

// A budget below twice the largest tensor: a load waits for the previous load's copy-in to
// give its staging back instead of waiting for ever (the previous tensor is freed by this
// thread, which the load once blocked). Forward and backward twice, every byte compared.
TEST(ActivationStore, NvmeWithLessThanTwoTensorsOfStagingNeverDeadlocks) {
  test::TestDir dir;
  ActivationStoreOptions o = options_for(ActivationTier::kNvme);
  o.pinned_budget_bytes = kMiB + kMiB / 2;
  o.prefetch_depth = 1;
  Rig rig(o, dir);
  for (int round = 0; round < 2; ++round) {
    std::vector<ActivationStore::Handle> handles;
    std::vector<std::vector<std::byte>> want;
    for (std::uint32_t i = 0; i < 5; ++i) {
      want.push_back(pattern(kMiB, 200 + i + 10 * static_cast<std::uint32_t>(round)));
      cuda::DeviceBuffer& src = rig.upload(want.back());
      handles.push_back(rig.store->save("t" + std::to_string(i), src.span(), rig.stream));
    }
    for (std::size_t k = handles.size(); k-- > 0;) {
      cuda::DeviceBuffer dst = rig.device->allocate(kMiB);
      rig.store->load(handles[k], dst.span(), rig.stream);  // no synchronize in between
      std::vector<std::byte> got(kMiB);
      rig.device->copy_to_host(rig.stream, got, dst.span());
      rig.device->synchronize(rig.stream);
      EXPECT_EQ(got, want[k]) << "round " << round << " tensor " << k;
    }
    EXPECT_EQ(rig.store->stats().held_tensors, 0u);
    EXPECT_LE(rig.store->stats().pinned_bytes_peak, kMiB + kMiB / 2);
  }
}

// The cpu tier holds every tensor in its budget: one that does not fit is refused, naming the
// tensor and the numbers, and fits again once a load has freed room.
TEST(ActivationStore, CpuTierRefusesATensorPastItsBudget) {
  test::TestDir dir;
  ActivationStoreOptions o = options_for(ActivationTier::kCpu);
  o.pinned_budget_bytes = 3 * kMiB;
  Rig rig(o, dir);
  std::vector<ActivationStore::Handle> handles;
  for (std::uint32_t i = 0; i < 3; ++i) {
    cuda::DeviceBuffer& src = rig.upload(pattern(kMiB, i));
    handles.push_back(rig.store->save("h" + std::to_string(i), src.span(), rig.stream));
  }
  cuda::DeviceBuffer& extra = rig.upload(pattern(kMiB, 9));
  try {
    (void)rig.store->save("h3", extra.span(), rig.stream);
    FAIL() << "a tensor past the budget was saved";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(),
                 "ActivationStore::save: tensor 'h3' of 1048576 bytes does not fit: 3 tensors "
                 "held fill 3145728 of the pinned budget's 3145728 bytes; raise "
                 "pinned_budget_bytes or use the nvme tier");
  }
  cuda::DeviceBuffer dst = rig.device->allocate(kMiB);
  rig.store->load(handles[2], dst.span(), rig.stream);
  rig.device->synchronize(rig.stream);
  const ActivationStore::Handle h3 = rig.store->save("h3", extra.span(), rig.stream);
  cuda::DeviceBuffer back = rig.device->allocate(kMiB);
  rig.store->load(h3, back.span(), rig.stream);
  EXPECT_EQ(rig.download(back), pattern(kMiB, 9));
  EXPECT_LE(rig.store->stats().pinned_bytes_peak, 3 * kMiB);
}

// A failed write-back (tensor 2's, at 2 MiB of the one swap file) surfaces at that tensor's
// load as the swap layer's IoError naming the tensor's key, the file, offset and errno; the
// others come back exactly, and so does a tensor saved after the failure.
TEST(ActivationStore, AFailedWriteBackSurfacesAtThatTensorsLoad) {
  test::TestDir dir;
  ActivationStoreOptions o = options_for(ActivationTier::kNvme);
  o.pinned_budget_bytes = 2 * kMiB;  // everything must leave staging
  o.prefetch_depth = 0;
  o.io.faults = eio_plan(swap::IoOp::kWrite, 2 * kMiB, 3 * kMiB);
  Rig rig(o, dir);
  std::vector<ActivationStore::Handle> handles;
  for (std::uint32_t i = 0; i < 4; ++i) {
    cuda::DeviceBuffer& src = rig.upload(pattern(kMiB, 40 + i));
    handles.push_back(rig.store->save("t" + std::to_string(i), src.span(), rig.stream));
  }
  rig.device->synchronize(rig.stream);
  for (std::size_t k = 4; k-- > 0;) {
    cuda::DeviceBuffer dst = rig.device->allocate(kMiB);
    if (k != 2) {
      rig.store->load(handles[k], dst.span(), rig.stream);
      EXPECT_EQ(rig.download(dst), pattern(kMiB, 40 + static_cast<std::uint32_t>(k)));
      continue;
    }
    try {
      rig.store->load(handles[k], dst.span(), rig.stream);
      FAIL() << "a tensor whose write-back failed was loaded";
    } catch (const IoError& e) {
      const std::string text = e.what();
      EXPECT_EQ(e.sys_errno(), EIO);
      EXPECT_EQ(text.rfind("ActivationStore::load of tensor 't2': swap_out of key 't2#3'", 0), 0u)
          << text;
      EXPECT_NE(text.find("offset=2097152"), std::string::npos) << text;
      EXPECT_NE(text.find("(EIO)"), std::string::npos) << text;
    }
  }
  // The handle is gone; the store goes on.
  cuda::DeviceBuffer dst = rig.device->allocate(kMiB);
  EXPECT_THROW(rig.store->load(handles[2], dst.span(), rig.stream), UsageError);
  cuda::DeviceBuffer& src = rig.upload(pattern(kMiB, 99));
  const ActivationStore::Handle h = rig.store->save("after", src.span(), rig.stream);
  rig.store->load(h, dst.span(), rig.stream);
  EXPECT_EQ(rig.download(dst), pattern(kMiB, 99));
}

// A failed read back surfaces at the load of that tensor, with the read's text.
TEST(ActivationStore, AFailedReadSurfacesAtThatTensorsLoad) {
  test::TestDir dir;
  ActivationStoreOptions o = options_for(ActivationTier::kNvme);
  o.pinned_budget_bytes = 2 * kMiB;
  o.prefetch_depth = 0;
  o.io.faults = eio_plan(swap::IoOp::kRead, 1 * kMiB, 2 * kMiB);
  Rig rig(o, dir);
  std::vector<ActivationStore::Handle> handles;
  for (std::uint32_t i = 0; i < 4; ++i) {
    cuda::DeviceBuffer& src = rig.upload(pattern(kMiB, i));
    handles.push_back(rig.store->save("r" + std::to_string(i), src.span(), rig.stream));
  }
  rig.device->synchronize(rig.stream);
  cuda::DeviceBuffer dst = rig.device->allocate(kMiB);
  for (std::size_t k : {3u, 2u}) {
    rig.store->load(handles[k], dst.span(), rig.stream);
    EXPECT_EQ(rig.download(dst), pattern(kMiB, static_cast<std::uint32_t>(k)));
  }
  try {
    rig.store->load(handles[1], dst.span(), rig.stream);
    FAIL() << "a failed read was handed back";
  } catch (const IoError& e) {
    const std::string text = e.what();
    EXPECT_EQ(text.rfind("ActivationStore::load of tensor 'r1': swap_in of key 'r1#2'", 0), 0u)
        << text;
    EXPECT_NE(text.find("offset=1048576"), std::string::npos) << text;
  }
  rig.store->load(handles[0], dst.span(), rig.stream);
  EXPECT_EQ(rig.download(dst), pattern(kMiB, 0));
}

TEST(ActivationStore, MisuseIsUsageErrorWithExactText) {
  test::TestDir dir;
  Rig rig(options_for(ActivationTier::kCpu), dir);
  cuda::DeviceBuffer& src = rig.upload(pattern(8192, 1));
  auto expect_usage = [](auto&& f, const std::string& text) {
    try {
      f();
      ADD_FAILURE() << "no throw; expected: " << text;
    } catch (const UsageError& e) {
      EXPECT_EQ(std::string(e.what()), text);
    }
  };
  expect_usage([&] { (void)rig.store->save("", src.span(), rig.stream); },
               "ActivationStore::save: the tensor needs a name");
  expect_usage([&] { (void)rig.store->save("x", src.span(0, 0), rig.stream); },
               "ActivationStore::save: tensor 'x' is empty");
  const ActivationStore::Handle h = rig.store->save("x", src.span(), rig.stream);
  cuda::DeviceBuffer small = rig.device->allocate(4096);
  expect_usage([&] { rig.store->load(h, small.span(), rig.stream); },
               "ActivationStore::load: tensor 'x' has 8192 bytes, the destination 4096");
  cuda::DeviceBuffer dst = rig.device->allocate(8192);
  rig.store->load(h, dst.span(), rig.stream);
  expect_usage([&] { rig.store->load(h, dst.span(), rig.stream); },
               "ActivationStore::load: no tensor with handle 1 (never saved, loaded already, or "
               "cleared)");
  expect_usage([&] { rig.store->wait_saved(7, rig.stream); },
               "ActivationStore::wait_saved: no tensor with handle 7 (never saved, loaded "
               "already, or cleared)");
  // clear() forgets what was not loaded.
  (void)rig.store->save("y", src.span(), rig.stream);
  rig.store->clear();
  EXPECT_EQ(rig.store->stats().held_tensors, 0u);

  ActivationStoreOptions bad = options_for(ActivationTier::kNvme);
  bad.directories.clear();
  EXPECT_THROW(ActivationStore(*rig.device, bad), UsageError);
  bad = options_for(ActivationTier::kNvme);
  bad.directories = {dir.subdir("cap")};
  bad.capacity_bytes = 0;
  EXPECT_THROW(ActivationStore(*rig.device, bad), UsageError);
}

}  // namespace
}  // namespace zinf::offload
