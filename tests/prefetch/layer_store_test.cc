// SPDX-License-Identifier: Apache-2.0
// LayerStore (the store OffloadEngine's nvme tier and zinf.torch.offload_parameters share):
// every byte of layers of odd sizes round-trips through write, traced fetches (acquire and
// fetch_into on the compute stream) and untraced reads; a rewrite is seen by the next fetch;
// the read-ahead works from the second iteration; fetch_into copies from the window on the
// device with no host copy; misuse and a bad directory give the exact error.
#include "zinf/prefetch/layer_store.h"

#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "support/pattern.h"
#include "support/test_dir.h"
#include "zinf/common/error.h"
#include "zinf/cuda/cuda_interop.h"
#include "zinf/cuda/device.h"

namespace zinf::prefetch {
namespace {

using test::check_pattern;
using test::fill_pattern;

// Odd sizes: below a page, between pages, and above the 1 MiB stripe.
const std::vector<std::uint64_t> kSizes = {1000, 70000, (1u << 20) + 4097};

class LayerStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cuda::DeviceOptions d;
    d.kind = cuda::DeviceKind::kHost;
    device_ = cuda::make_device(d);
    compute_ = device_->create_stream();
  }
  void TearDown() override {
    store_.reset();
    compute_ = {};
  }

  LayerStoreOptions options() const {
    LayerStoreOptions o;
    for (std::size_t l = 0; l < kSizes.size(); ++l) {
      o.keys.push_back("layer" + std::to_string(l));
      o.bytes.push_back(kSizes[l]);
    }
    o.directories = {dir_.subdir("nvme")};
    o.io.kind = swap::IoEngineKind::kThreads;
    o.depth = 1;
    o.huge_pages = false;
    return o;
  }

  void make() { store_ = std::make_unique<LayerStore>(options(), *device_, compute_); }

  void write_all(std::uint32_t generation) {
    for (std::size_t l = 0; l < kSizes.size(); ++l) {
      std::vector<std::byte> bytes(kSizes[l]);
      fill_pattern(bytes, static_cast<std::uint32_t>(l), 0, generation);
      store_->write(l, bytes);
    }
  }

  // One iteration of fetch_into into host buffers (the host device's "device" memory).
  std::string fetch_all(std::uint32_t generation) {
    std::string errors;
    for (std::size_t l = 0; l < kSizes.size(); ++l) {
      std::vector<std::byte> out(kSizes[l]);
      store_->fetch_into(l, cuda::adopt_device_memory(*device_, out.data(), out.size()));
      device_->synchronize(compute_);
      errors += check_pattern(out, static_cast<std::uint32_t>(l), 0, generation);
    }
    store_->end_iteration();
    return errors;
  }

  test::TestDir dir_;
  std::unique_ptr<cuda::Device> device_;
  cuda::Stream compute_;
  std::unique_ptr<LayerStore> store_;
};

TEST_F(LayerStoreTest, EveryByteRoundTripsThroughFetchesAndReads) {
  make();
  write_all(1);
  const cuda::DeviceStats before = device_->stats();
  for (int iteration = 0; iteration < 3; ++iteration) EXPECT_EQ(fetch_all(1), "");
  const cuda::DeviceStats after = device_->stats();
  std::uint64_t total = 0;
  for (auto b : kSizes) total += b;
  // Each fetch is one copy out of the window on the device; what reaches the window comes
  // from pinned staging (no pageable copy).
  EXPECT_EQ(after.bytes_on_device - before.bytes_on_device, 3 * total);
  EXPECT_EQ(after.pageable_copies, before.pageable_copies);
  EXPECT_GT(after.bytes_to_device, before.bytes_to_device);
  const PrefetcherStats s = store_->prefetch_stats();
  EXPECT_EQ(s.acquires, 3 * kSizes.size());
  EXPECT_GT(s.hits, 0u);  // read ahead from the second iteration on
  for (std::size_t l = 0; l < kSizes.size(); ++l) {
    std::vector<std::byte> out(kSizes[l]);
    store_->read(l, out);
    EXPECT_EQ(check_pattern(out, static_cast<std::uint32_t>(l), 0, 1), "") << "layer " << l;
  }
  EXPECT_EQ(store_->bytes_written(), total);
}

TEST_F(LayerStoreTest, ARewriteIsWhatTheNextFetchSees) {
  make();
  write_all(1);
  EXPECT_EQ(fetch_all(1), "");
  EXPECT_EQ(fetch_all(1), "");  // the window now holds reads of generation 1 ahead
  write_all(2);
  EXPECT_EQ(fetch_all(2), "");
  // A write through the fill callback: the padding is zeroed, the layer's bytes are what the
  // callback wrote.
  store_->write(0, [](std::span<std::byte> buf) {
    EXPECT_EQ(buf.size() % 4096, 0u);
    fill_pattern(buf.first(kSizes[0]), 0, 0, 3);
  });
  std::vector<std::byte> out(kSizes[0]);
  store_->read(0, out);
  EXPECT_EQ(check_pattern(out, 0, 0, 3), "");
}

TEST_F(LayerStoreTest, MisuseIsAUsageErrorNamingTheLayer) {
  make();
  std::vector<std::byte> small(10);
  auto expect_usage = [](auto&& call, const std::string& text) {
    try {
      call();
      ADD_FAILURE() << "no throw, expected: " << text;
    } catch (const UsageError& e) {
      EXPECT_EQ(std::string(e.what()), text);
    }
  };
  expect_usage([&] { store_->write(1, small); },
               "LayerStore::write: layer 1 ('layer1') holds 70000 bytes, got 10");
  expect_usage([&] { store_->read(3, small); }, "LayerStore::read: layer 3 of 3");
  expect_usage([&] { (void)store_->layer_bytes(7); }, "LayerStore::layer_bytes: layer 7 of 3");
  expect_usage(
      [&] {
        store_->fetch_into(0, cuda::adopt_device_memory(*device_, small.data(), small.size()));
      },
      "LayerStore::fetch_into: layer 0 ('layer0') holds 1000 bytes, got 10");
  LayerStoreOptions o = options();
  o.bytes[2] = 0;
  expect_usage([&] { LayerStore bad(o, *device_, compute_); },
               "LayerStore: layer 2 ('layer2') has no bytes");
  o = options();
  o.bytes.pop_back();
  expect_usage([&] { LayerStore bad(o, *device_, compute_); },
               "LayerStore: 3 keys but 2 sizes");
}

TEST_F(LayerStoreTest, AMissingDirectoryIsNamed) {
  LayerStoreOptions o = options();
  o.directories = {dir_.path() + "/absent"};
  try {
    LayerStore bad(o, *device_, compute_);
    ADD_FAILURE() << "no throw";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(dir_.path() + "/absent"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace zinf::prefetch
