// SPDX-License-Identifier: Apache-2.0
// The C API (zinf.h): every function's error codes and messages (the C++ exception's text,
// per thread and per engine), NULL handling, size checks, and a round trip whose bytes and
// master weights equal the C++ OffloadEngine's.
#include "zinf.h"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <limits>
#include <vector>

#include "support/test_dir.h"
#include "zinf/common/error.h"
#include "zinf/config.h"
#include "zinf/cuda/cuda_interop.h"
#include "zinf/cuda/device.h"
#include "zinf/offload/config.h"
#include "zinf/offload/engine.h"

extern "C" int zinf_capi_c_smoke(char* message, std::size_t capacity);  // capi_c_smoke.c

namespace {

namespace off = zinf::offload;

const char* kConfig = R"({
  "zero_optimization": {"stage": 3, "sub_group_size": 32768,
    "offload_param": {"device": "cpu", "buffer_count": 2, "buffer_size": 4096},
    "offload_optimizer": {"device": "cpu"}},
  "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.1}}
})";

const zinf_layer_spec kLayers[] = {{"a", 1000, ZINF_DTYPE_BF16}, {"b", 257, ZINF_DTYPE_F16}};
// The host simulation, so the tests may read fetched parameters on the host on any machine
// (the default, ZINF_DEVICE_AUTO, is a GPU where there is one).
const zinf_engine_options kHost{sizeof(zinf_engine_options), ZINF_DEVICE_HOST, 0, nullptr,
                                ZINF_STATE_PRECISION_CONFIG};

// The text the C++ API throws for `body`, or "" if it does not throw.
template <typename Body>
std::string what_of(Body&& body) {
  try {
    body();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

std::uint16_t bf16_of(float f) {
  std::uint32_t bits = 0;
  std::memcpy(&bits, &f, sizeof bits);
  bits += 0x7fffu + ((bits >> 16) & 1u);  // round to nearest even (finite values)
  return static_cast<std::uint16_t>(bits >> 16);
}

std::vector<float> weights_of(std::size_t n, float scale) {
  std::vector<float> w(n);
  for (std::size_t i = 0; i < n; ++i) w[i] = scale * static_cast<float>(i % 89) - 0.3f;
  return w;
}

std::vector<float> grads_of(std::size_t n) {
  std::vector<float> g(n);
  for (std::size_t i = 0; i < n; ++i) g[i] = 0.01f * static_cast<float>(i % 13) - 0.05f;
  return g;
}

// Host work that holds a stream until open(), standing in for a trainer's kernel still
// running. Destruction opens it, so a failing test never leaves a stream stuck: declare it
// after the engine and streams it holds.
class StreamGate {
 public:
  StreamGate() = default;
  ~StreamGate() { open(); }
  StreamGate(const StreamGate&) = delete;
  StreamGate& operator=(const StreamGate&) = delete;
  std::function<void()> waiter() const {
    return [f = future_] { f.wait(); };
  }
  void open() {
    if (!opened_) promise_.set_value();
    opened_ = true;
  }

 private:
  std::promise<void> promise_;
  std::shared_future<void> future_ = promise_.get_future().share();
  bool opened_ = false;
};

using EngineOwner = std::unique_ptr<zinf_engine, void (*)(zinf_engine*)>;

// Owns a C engine for a test.
struct Engine {
  zinf_engine* e = nullptr;
  Engine() {
    const zinf_status s = zinf_engine_create(kConfig, kLayers, 2, &kHost, &e);
    EXPECT_EQ(s, ZINF_OK) << zinf_last_error();
  }
  ~Engine() { zinf_engine_destroy(e); }
};

TEST(CApi, VersionIsTheBuildVersion) { EXPECT_STREQ(zinf_version(), ZINF_VERSION); }

TEST(CApi, StatusNames) {
  EXPECT_STREQ(zinf_status_name(ZINF_OK), "ok");
  EXPECT_STREQ(zinf_status_name(ZINF_ERR_USAGE), "usage");
  EXPECT_STREQ(zinf_status_name(ZINF_ERR_IO), "io");
  EXPECT_STREQ(zinf_status_name(ZINF_ERR_NO_SPACE), "no_space");
  EXPECT_STREQ(zinf_status_name(ZINF_ERR_NOT_FOUND), "not_found");
  EXPECT_STREQ(zinf_status_name(ZINF_ERR_PERMISSION), "permission");
  EXPECT_STREQ(zinf_status_name(ZINF_ERR_CORRUPT), "corrupt");
  EXPECT_STREQ(zinf_status_name(ZINF_ERR_DEVICE), "device");
  EXPECT_STREQ(zinf_status_name(ZINF_ERR_FAILED), "failed");
  EXPECT_STREQ(zinf_status_name(ZINF_ERR_NO_MEMORY), "no_memory");
  EXPECT_STREQ(zinf_status_name(ZINF_ERR_INTERNAL), "internal");
  EXPECT_STREQ(zinf_status_name(static_cast<zinf_status>(15)), "unknown");
}

TEST(CApi, BadConfigIsUsageWithTheReadersText) {
  for (const char* json : {R"({"zero_optimization": {"stagee": 3}})", "{\"aio\": ", "[1]"}) {
    const std::string want = what_of([&] { off::parse_config(json); });
    ASSERT_FALSE(want.empty()) << json;
    zinf_engine* sentinel = reinterpret_cast<zinf_engine*>(0x1);
    zinf_engine* out = sentinel;
    EXPECT_EQ(zinf_engine_create(json, kLayers, 2, nullptr, &out), ZINF_ERR_USAGE) << json;
    EXPECT_EQ(zinf_last_error(), want);
    EXPECT_EQ(out, sentinel) << "out is written only on success";
  }
}

TEST(CApi, UnreadableConfigFileNamesIt) {
  zinf::test::TestDir dir;
  const std::string path = dir.file("missing.json");
  const std::string want = what_of([&] { off::load_config(path); });
  ASSERT_NE(want.find(path), std::string::npos) << want;
  zinf_engine* out = nullptr;
  EXPECT_EQ(zinf_engine_create_from_file(path.c_str(), kLayers, 2, nullptr, &out),
            ZINF_ERR_NOT_FOUND);
  EXPECT_EQ(zinf_last_error(), want);
  EXPECT_EQ(out, nullptr);
}

TEST(CApi, CreatesFromAFile) {
  zinf::test::TestDir dir;
  const std::string path = dir.file("ds_config.json");
  std::FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs(kConfig, f);
  std::fclose(f);
  zinf_engine* e = nullptr;
  ASSERT_EQ(zinf_engine_create_from_file(path.c_str(), kLayers, 2, nullptr, &e), ZINF_OK)
      << zinf_last_error();
  std::size_t count = 0;
  EXPECT_EQ(zinf_engine_layer_count(e, &count), ZINF_OK);
  EXPECT_EQ(count, 2u);
  zinf_engine_destroy(e);
}

TEST(CApi, ModelChecksOfTheEngineAreUsageErrors) {
  // A layer larger than offload_param.buffer_size (4096 elements): the engine's check.
  const zinf_layer_spec big[] = {{"big", 5000, ZINF_DTYPE_BF16}};
  zinf_engine* out = nullptr;
  EXPECT_EQ(zinf_engine_create(kConfig, big, 1, nullptr, &out), ZINF_ERR_USAGE);
  EXPECT_NE(std::string(zinf_last_error()).find("big"), std::string::npos) << zinf_last_error();
  EXPECT_EQ(out, nullptr);
}

// A layer too large for 64-bit byte counts is a usage error naming it, whatever the tiers (it
// once aborted in the planning's align_up, which multiplied before checking).
TEST(CApi, AHugeLayerIsAUsageErrorNotACrash) {
  const char* configs[] = {kConfig, "{}",
                           "{\"zero_optimization\": {\"offload_optimizer\": {\"device\": \"cpu\"}}}"};
  for (const char* config : configs) {
    for (const std::uint64_t numel : {~std::uint64_t{0}, (std::uint64_t{1} << 63) - 1,
                                      (std::uint64_t{1} << 62) - 1, (std::uint64_t{1} << 50) + 1}) {
      const zinf_layer_spec huge[] = {{"huge", numel, ZINF_DTYPE_BF16}};
      zinf_engine* out = nullptr;
      EXPECT_EQ(zinf_engine_create(config, huge, 1, nullptr, &out), ZINF_ERR_USAGE)
          << config << " " << numel;
      EXPECT_NE(std::string(zinf_last_error()).find("'huge' has " + std::to_string(numel)),
                std::string::npos)
          << zinf_last_error();
      EXPECT_EQ(out, nullptr);
    }
  }
  // Each layer within the limit, the sum beyond it.
  std::vector<zinf_layer_spec> many;
  std::vector<std::string> names;
  for (int i = 0; i < 20; ++i) names.push_back("l" + std::to_string(i));
  for (const auto& n : names) many.push_back({n.c_str(), std::uint64_t{1} << 50, ZINF_DTYPE_BF16});
  zinf_engine* out = nullptr;
  EXPECT_EQ(zinf_engine_create("{}", many.data(), many.size(), nullptr, &out), ZINF_ERR_USAGE);
  EXPECT_NE(std::string(zinf_last_error()).find("in all"), std::string::npos) << zinf_last_error();
}

// A buffer_size whose bytes do not fit in 64 bits is a usage error naming the key (it once
// aborted the process in align_up), and nothing is created.
TEST(CApi, AHugeBufferSizeIsAUsageErrorNamingTheKey) {
  for (const char* size : {"18446744073709551615", "9223372036854771713"}) {
    const std::string json =
        std::string(R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu", )"
                    R"("buffer_size": )") +
        size + "}}}";
    zinf_engine* sentinel = reinterpret_cast<zinf_engine*>(0x1);
    zinf_engine* out = sentinel;
    EXPECT_EQ(zinf_engine_create(json.c_str(), kLayers, 2, &kHost, &out), ZINF_ERR_USAGE);
    EXPECT_EQ(std::string(zinf_last_error()),
              std::string("<string>: zero_optimization.offload_param.buffer_size: at most "
                          "1125899906842624 (2^50 elements: the largest layer zinf takes), got ") +
                  size);
    EXPECT_EQ(out, sentinel);
  }
}

TEST(CApi, CreateArgumentErrors) {
  zinf_engine* out = nullptr;
  EXPECT_EQ(zinf_engine_create(nullptr, kLayers, 2, nullptr, &out), ZINF_ERR_USAGE);
  EXPECT_STREQ(zinf_last_error(), "zinf_engine_create: config is NULL");
  EXPECT_EQ(zinf_engine_create_from_file(nullptr, kLayers, 2, nullptr, &out), ZINF_ERR_USAGE);
  EXPECT_STREQ(zinf_last_error(), "zinf_engine_create_from_file: config is NULL");
  EXPECT_EQ(zinf_engine_create(kConfig, kLayers, 2, nullptr, nullptr), ZINF_ERR_USAGE);
  EXPECT_STREQ(zinf_last_error(), "zinf_engine_create: out is NULL");
  EXPECT_EQ(zinf_engine_create(kConfig, nullptr, 2, nullptr, &out), ZINF_ERR_USAGE);
  EXPECT_STREQ(zinf_last_error(), "zinf_engine_create: layers is NULL");

  const zinf_layer_spec unnamed[] = {{"a", 10, ZINF_DTYPE_BF16}, {nullptr, 10, ZINF_DTYPE_BF16}};
  EXPECT_EQ(zinf_engine_create(kConfig, unnamed, 2, nullptr, &out), ZINF_ERR_USAGE);
  EXPECT_STREQ(zinf_last_error(), "zinf_engine_create: layers[1].name is NULL");
  const zinf_layer_spec bad_dtype[] = {{"a", 10, static_cast<zinf_dtype>(3)}};
  EXPECT_EQ(zinf_engine_create(kConfig, bad_dtype, 1, nullptr, &out), ZINF_ERR_USAGE);
  EXPECT_STREQ(zinf_last_error(), "zinf_engine_create: unknown dtype 3");
  const zinf_engine_options bad_device{0, static_cast<zinf_device_kind>(3), 0, nullptr,
                                      ZINF_STATE_PRECISION_CONFIG};
  EXPECT_EQ(zinf_engine_create(kConfig, kLayers, 2, &bad_device, &out), ZINF_ERR_USAGE);
  EXPECT_STREQ(zinf_last_error(), "zinf_engine_create: unknown device kind 3");
  EXPECT_EQ(out, nullptr);
}

TEST(CApi, CudaWithoutAGpuIsADeviceErrorWithTheReason) {
  if (zinf::cuda::probe_cuda().available()) GTEST_SKIP() << "a CUDA device is visible";
  const std::string want =
      what_of([] { zinf::cuda::make_device({.kind = zinf::cuda::DeviceKind::kCuda}); });
  const zinf_engine_options cuda{0, ZINF_DEVICE_CUDA, 0, nullptr, ZINF_STATE_PRECISION_CONFIG};
  zinf_engine* out = nullptr;
  EXPECT_EQ(zinf_engine_create(kConfig, kLayers, 2, &cuda, &out), ZINF_ERR_DEVICE);
  EXPECT_EQ(zinf_last_error(), want);
  EXPECT_EQ(out, nullptr);
}

TEST(CApi, NullEngineIsUsageForEveryFunction) {
  float f[1] = {};
  void* data = nullptr;
  std::size_t n = 0;
  zinf_stats stats{};
  zinf_adam_params hyper{};
  zinf_save_snapshot snapshot = ZINF_SAVE_SNAPSHOT_NONE;
  zinf_device_kind kind = ZINF_DEVICE_AUTO;
  struct Case {
    zinf_status status;
    const char* function;
  };
  const Case cases[] = {
      {zinf_engine_layer_count(nullptr, &n), "zinf_engine_layer_count"},
      {zinf_engine_device_kind(nullptr, &kind), "zinf_engine_device_kind"},
      {zinf_engine_set_master_weights(nullptr, 0, f, 1), "zinf_engine_set_master_weights"},
      {zinf_engine_read_master_weights(nullptr, 0, f, 1), "zinf_engine_read_master_weights"},
      {zinf_engine_fetch(nullptr, 0, &data, &n), "zinf_engine_fetch"},
      {zinf_engine_release(nullptr, 0), "zinf_engine_release"},
      {zinf_engine_set_gradients(nullptr, 0, f, 1, ZINF_DTYPE_F32), "zinf_engine_set_gradients"},
      {zinf_engine_step(nullptr, nullptr), "zinf_engine_step"},
      {zinf_engine_get_hyper(nullptr, &hyper), "zinf_engine_get_hyper"},
      {zinf_engine_set_hyper(nullptr, &hyper), "zinf_engine_set_hyper"},
      {zinf_engine_get_layer_hyper(nullptr, 0, &hyper), "zinf_engine_get_layer_hyper"},
      {zinf_engine_set_layer_hyper(nullptr, 0, &hyper), "zinf_engine_set_layer_hyper"},
      {zinf_engine_set_gradients_device(nullptr, 0, f, 1, ZINF_DTYPE_F32),
       "zinf_engine_set_gradients_device"},
      {zinf_engine_save(nullptr, "/tmp"), "zinf_engine_save"},
      {zinf_engine_load(nullptr, "/tmp"), "zinf_engine_load"},
      {zinf_engine_save_async(nullptr, "/tmp"), "zinf_engine_save_async"},
      {zinf_engine_wait_save(nullptr), "zinf_engine_wait_save"},
      {zinf_engine_last_save_snapshot(nullptr, &snapshot), "zinf_engine_last_save_snapshot"},
      {zinf_engine_stats(nullptr, &stats), "zinf_engine_stats"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(c.status, ZINF_ERR_USAGE) << c.function;
  }
  // The message is the last call's; check one function fully.
  EXPECT_EQ(zinf_engine_stats(nullptr, &stats), ZINF_ERR_USAGE);
  EXPECT_STREQ(zinf_last_error(), "zinf_engine_stats: engine is NULL");
  EXPECT_STREQ(zinf_engine_last_error(nullptr), "");
  zinf_engine_destroy(nullptr);  // a no-op
}

TEST(CApi, NullOutputsAreUsageErrors) {
  Engine h;
  ASSERT_NE(h.e, nullptr);
  std::size_t n = 0;
  void* data = nullptr;
  EXPECT_EQ(zinf_engine_layer_count(h.e, nullptr), ZINF_ERR_USAGE);
  EXPECT_STREQ(zinf_last_error(), "zinf_engine_layer_count: count is NULL");
  EXPECT_EQ(zinf_engine_device_kind(h.e, nullptr), ZINF_ERR_USAGE);
  EXPECT_STREQ(zinf_last_error(), "zinf_engine_device_kind: kind is NULL");
  EXPECT_EQ(zinf_engine_set_master_weights(h.e, 0, nullptr, 1000), ZINF_ERR_USAGE);
  EXPECT_STREQ(zinf_last_error(), "zinf_engine_set_master_weights: weights is NULL");
  EXPECT_EQ(zinf_engine_read_master_weights(h.e, 0, nullptr, 1000), ZINF_ERR_USAGE);
  EXPECT_STREQ(zinf_last_error(), "zinf_engine_read_master_weights: out is NULL");
  EXPECT_EQ(zinf_engine_fetch(h.e, 0, nullptr, &n), ZINF_ERR_USAGE);
  EXPECT_STREQ(zinf_last_error(), "zinf_engine_fetch: data is NULL");
  EXPECT_EQ(zinf_engine_fetch(h.e, 0, &data, nullptr), ZINF_ERR_USAGE);
  EXPECT_STREQ(zinf_last_error(), "zinf_engine_fetch: bytes is NULL");
  EXPECT_EQ(zinf_engine_set_gradients(h.e, 0, nullptr, 1000, ZINF_DTYPE_F32), ZINF_ERR_USAGE);
  EXPECT_STREQ(zinf_last_error(), "zinf_engine_set_gradients: grads is NULL");
  EXPECT_EQ(zinf_engine_get_hyper(h.e, nullptr), ZINF_ERR_USAGE);
  EXPECT_STREQ(zinf_last_error(), "zinf_engine_get_hyper: out is NULL");
  EXPECT_EQ(zinf_engine_set_hyper(h.e, nullptr), ZINF_ERR_USAGE);
  EXPECT_STREQ(zinf_last_error(), "zinf_engine_set_hyper: params is NULL");
  EXPECT_EQ(zinf_engine_save(h.e, nullptr), ZINF_ERR_USAGE);
  EXPECT_STREQ(zinf_last_error(), "zinf_engine_save: dir is NULL");
  EXPECT_EQ(zinf_engine_load(h.e, nullptr), ZINF_ERR_USAGE);
  EXPECT_STREQ(zinf_last_error(), "zinf_engine_load: dir is NULL");
  EXPECT_EQ(zinf_engine_stats(h.e, nullptr), ZINF_ERR_USAGE);
  EXPECT_STREQ(zinf_last_error(), "zinf_engine_stats: out is NULL");
  // Each failure is also the engine's message.
  EXPECT_STREQ(zinf_engine_last_error(h.e), "zinf_engine_stats: out is NULL");
}

TEST(CApi, WrongSizesAndIndicesAreUsageErrors) {
  Engine h;
  ASSERT_NE(h.e, nullptr);
  std::vector<float> buf(2000);
  EXPECT_EQ(zinf_engine_set_master_weights(h.e, 0, buf.data(), 999), ZINF_ERR_USAGE);
  EXPECT_STREQ(zinf_last_error(),
               "zinf_engine_set_master_weights: layer 0 ('a') has 1000 elements, got 999");
  EXPECT_EQ(zinf_engine_read_master_weights(h.e, 1, buf.data(), 1000), ZINF_ERR_USAGE);
  EXPECT_STREQ(zinf_last_error(),
               "zinf_engine_read_master_weights: layer 1 ('b') has 257 elements, got 1000");
  EXPECT_EQ(zinf_engine_set_gradients(h.e, 2, buf.data(), 1000, ZINF_DTYPE_F32), ZINF_ERR_USAGE);
  EXPECT_STREQ(zinf_last_error(),
               "zinf_engine_set_gradients: layer 2 out of range (the engine has 2 layers)");
  EXPECT_EQ(zinf_engine_set_gradients(h.e, 0, buf.data(), 1000, static_cast<zinf_dtype>(3)),
            ZINF_ERR_USAGE);
  EXPECT_STREQ(zinf_last_error(), "zinf_engine_set_gradients: unknown dtype 3");
  EXPECT_STREQ(zinf_engine_last_error(h.e), "zinf_engine_set_gradients: unknown dtype 3");
}

TEST(CApi, EngineErrorsCarryTheEnginesText) {
  Engine h;
  ASSERT_NE(h.e, nullptr);
  // Releasing a layer that was never fetched, and a fetch out of range: whatever the engine
  // throws reaches the caller as usage with the same text.
  std::vector<off::LayerSpec> specs = {{"a", 1000, zinf::ElementType::kBF16},
                                       {"b", 257, zinf::ElementType::kF16}};
  auto device = zinf::cuda::make_device({.kind = zinf::cuda::DeviceKind::kHost});
  zinf::cuda::Stream stream = device->create_stream();
  off::OffloadEngine cpp(off::parse_config(kConfig), specs, *device, stream);
  void* data = nullptr;
  std::size_t bytes = 0;
  const std::string want = what_of([&] { cpp.fetch(5); });
  ASSERT_FALSE(want.empty());
  EXPECT_EQ(zinf_engine_fetch(h.e, 5, &data, &bytes), ZINF_ERR_USAGE);
  EXPECT_EQ(zinf_last_error(), want);
  EXPECT_EQ(zinf_engine_last_error(h.e), want);
  EXPECT_EQ(data, nullptr);
}

TEST(CApi, MessagesArePerThreadAndPerEngine) {
  Engine a;
  Engine b;
  ASSERT_NE(a.e, nullptr);
  ASSERT_NE(b.e, nullptr);
  float f[1] = {};
  EXPECT_EQ(zinf_engine_set_master_weights(a.e, 0, f, 1), ZINF_ERR_USAGE);
  const std::string msg = zinf_last_error();
  EXPECT_EQ(zinf_engine_last_error(a.e), msg);
  EXPECT_STREQ(zinf_engine_last_error(b.e), "");
  std::string other_thread = "unset";
  std::thread([&] { other_thread = zinf_last_error(); }).join();
  EXPECT_EQ(other_thread, "");
  // A successful call leaves both messages as they were.
  std::size_t n = 0;
  EXPECT_EQ(zinf_engine_layer_count(a.e, &n), ZINF_OK);
  EXPECT_EQ(zinf_last_error(), msg);
  EXPECT_EQ(zinf_engine_last_error(a.e), msg);
}

// Set weights, fetch (bytes = bf16/fp16 of them), step with gradients, read: the master
// weights equal those of the C++ engine doing the same, bit for bit.
TEST(CApi, RoundTripMatchesTheCppEngine) {
  Engine h;
  ASSERT_NE(h.e, nullptr);
  std::vector<off::LayerSpec> specs = {{"a", 1000, zinf::ElementType::kBF16},
                                       {"b", 257, zinf::ElementType::kF16}};
  auto device = zinf::cuda::make_device({.kind = zinf::cuda::DeviceKind::kHost});
  zinf::cuda::Stream stream = device->create_stream();
  off::OffloadEngine cpp(off::parse_config(kConfig), specs, *device, stream);

  std::vector<std::vector<float>> w(2), g(2);
  for (std::size_t l = 0; l < 2; ++l) {
    w[l] = weights_of(specs[l].numel, 0.01f * static_cast<float>(l + 1));
    g[l] = grads_of(specs[l].numel);
    ASSERT_EQ(zinf_engine_set_master_weights(h.e, l, w[l].data(), w[l].size()), ZINF_OK)
        << zinf_last_error();
    cpp.set_master_weights(l, w[l]);
  }
  // Layer 0 is bf16: its fetched bytes are the round-to-nearest-even bf16 of the weights.
  void* data = nullptr;
  std::size_t bytes = 0;
  ASSERT_EQ(zinf_engine_fetch(h.e, 0, &data, &bytes), ZINF_OK) << zinf_last_error();
  ASSERT_EQ(bytes, 2000u);
  std::vector<std::uint16_t> fetched(1000);
  std::memcpy(fetched.data(), data, bytes);
  ASSERT_EQ(zinf_engine_release(h.e, 0), ZINF_OK) << zinf_last_error();
  for (std::size_t i = 0; i < 1000; ++i) ASSERT_EQ(fetched[i], bf16_of(w[0][i])) << i;
  // Layer 1 (fp16): the same bytes as the C++ engine's fetch.
  ASSERT_EQ(zinf_engine_fetch(h.e, 1, &data, &bytes), ZINF_OK) << zinf_last_error();
  zinf::cuda::DeviceSpan cpp_span = cpp.fetch(1);
  device->synchronize(stream);
  ASSERT_EQ(bytes, cpp_span.size());
  EXPECT_EQ(std::memcmp(data, cpp_span.data(), bytes), 0);
  ASSERT_EQ(zinf_engine_release(h.e, 1), ZINF_OK);
  cpp.release(1);

  for (int step = 0; step < 3; ++step) {
    for (std::size_t l = 0; l < 2; ++l) {
      ASSERT_EQ(zinf_engine_set_gradients(h.e, l, g[l].data(), g[l].size(), ZINF_DTYPE_F32),
                ZINF_OK)
          << zinf_last_error();
      cpp.set_gradients(l, zinf::adam::GradView::f32(g[l]));
    }
    zinf_step_stats s{};
    ASSERT_EQ(zinf_engine_step(h.e, &s), ZINF_OK) << zinf_last_error();
    const off::StepStats cs = cpp.step();
    EXPECT_EQ(s.step, cs.step);
    EXPECT_EQ(s.elements, cs.elements);
    EXPECT_EQ(s.elements, 1257u);
  }
  for (std::size_t l = 0; l < 2; ++l) {
    std::vector<float> c_out(specs[l].numel), cpp_out(specs[l].numel);
    ASSERT_EQ(zinf_engine_read_master_weights(h.e, l, c_out.data(), c_out.size()), ZINF_OK);
    cpp.read_master_weights(l, cpp_out);
    EXPECT_EQ(std::memcmp(c_out.data(), cpp_out.data(), c_out.size() * sizeof(float)), 0) << l;
    EXPECT_NE(c_out, w[l]) << "the steps changed nothing";
  }
  zinf_stats stats{};
  ASSERT_EQ(zinf_engine_stats(h.e, &stats), ZINF_OK);
  const off::EngineStats cpp_stats = cpp.stats();
  EXPECT_EQ(stats.steps, 3u);
  EXPECT_EQ(stats.steps, cpp_stats.steps);
  EXPECT_EQ(stats.last_step.step, cpp_stats.last_step.step);
  EXPECT_EQ(stats.pinned_bytes_peak, cpp_stats.pinned_bytes_peak);
}

// zinf_stats mirrors EngineStats field for field, param_read_gbps (the parameters' NVMe read
// rate, which the demo and trainers report) included: nonzero with NVMe parameters, zero in
// the cpu tier.
TEST(CApi, StatsCarryTheParameterReadRate) {
  zinf::test::TestDir dir;
  const std::string config = R"({"zero_optimization": {"stage": 3, "sub_group_size": 32768,
      "offload_param": {"device": "nvme", "nvme_path": ")" +
                             dir.subdir("param") + R"(",
                        "buffer_count": 2, "buffer_size": 4096},
      "offload_optimizer": {"device": "cpu"}}, "zinf": {"backend": "threads"}})";
  zinf_engine* e = nullptr;
  ASSERT_EQ(zinf_engine_create(config.c_str(), kLayers, 2, nullptr, &e), ZINF_OK)
      << zinf_last_error();
  std::vector<std::vector<float>> g(2);
  for (std::size_t l = 0; l < 2; ++l) {
    const std::vector<float> w = weights_of(kLayers[l].numel, 0.01f);
    g[l] = grads_of(kLayers[l].numel);
    ASSERT_EQ(zinf_engine_set_master_weights(e, l, w.data(), w.size()), ZINF_OK);
  }
  for (std::size_t l = 0; l < 2; ++l) {
    void* data = nullptr;
    std::size_t bytes = 0;
    ASSERT_EQ(zinf_engine_fetch(e, l, &data, &bytes), ZINF_OK) << zinf_last_error();
    ASSERT_EQ(zinf_engine_release(e, l), ZINF_OK);
    ASSERT_EQ(zinf_engine_set_gradients(e, l, g[l].data(), g[l].size(), ZINF_DTYPE_F32), ZINF_OK);
  }
  ASSERT_EQ(zinf_engine_step(e, nullptr), ZINF_OK) << zinf_last_error();
  zinf_stats nvme{};
  ASSERT_EQ(zinf_engine_stats(e, &nvme), ZINF_OK);
  zinf_engine_destroy(e);
  EXPECT_GE(nvme.param_bytes_read, 1000u * 2 + 257u * 2);  // both layers were read
  EXPECT_GT(nvme.param_read_gbps, 0.0);

  Engine cpu;
  ASSERT_NE(cpu.e, nullptr);
  zinf_stats host{};
  host.param_read_gbps = -1;
  ASSERT_EQ(zinf_engine_stats(cpu.e, &host), ZINF_OK);
  EXPECT_EQ(host.param_read_gbps, 0.0);
}

// The state_precision option overrides the config's zinf.state_precision: with bf16 or int8
// moments an nvme step reads and writes smaller records than fp32's (the config's, here),
// and a value outside the enum is refused naming it.
TEST(CApi, StatePrecisionOptionShrinksTheOptimizersRecords) {
  zinf::test::TestDir dir;
  std::uint64_t bytes[4] = {};
  for (int p = 0; p < 4; ++p) {
    const std::string config = R"({"zero_optimization": {"stage": 3, "sub_group_size": 32768,
        "offload_param": {"device": "cpu"},
        "offload_optimizer": {"device": "nvme", "nvme_path": ")" +
                               dir.subdir("opt" + std::to_string(p)) + R"("}},
        "zinf": {"backend": "threads"}})";
    zinf_engine_options o = kHost;
    o.state_precision = static_cast<zinf_state_precision>(p);
    zinf_engine* e = nullptr;
    ASSERT_EQ(zinf_engine_create(config.c_str(), kLayers, 2, &o, &e), ZINF_OK)
        << zinf_last_error();
    EngineOwner owner(e, zinf_engine_destroy);
    for (std::size_t l = 0; l < 2; ++l) {
      const std::vector<float> w = weights_of(kLayers[l].numel, 0.01f);
      ASSERT_EQ(zinf_engine_set_master_weights(e, l, w.data(), w.size()), ZINF_OK)
          << zinf_last_error();
    }
    // Alive until the step: the update may read them after set_gradients returns.
    const std::vector<float> g[2] = {grads_of(kLayers[0].numel), grads_of(kLayers[1].numel)};
    for (std::size_t l = 0; l < 2; ++l) {
      ASSERT_EQ(zinf_engine_set_gradients(e, l, g[l].data(), g[l].size(), ZINF_DTYPE_F32),
                ZINF_OK)
          << zinf_last_error();
    }
    zinf_step_stats st{};
    ASSERT_EQ(zinf_engine_step(e, &st), ZINF_OK) << zinf_last_error();
    bytes[p] = st.bytes_read;
    EXPECT_EQ(st.bytes_written, st.bytes_read);
  }
  EXPECT_EQ(bytes[ZINF_STATE_PRECISION_CONFIG], bytes[ZINF_STATE_PRECISION_FP32]);
  EXPECT_LT(bytes[ZINF_STATE_PRECISION_BF16], bytes[ZINF_STATE_PRECISION_FP32]);
  EXPECT_LE(bytes[ZINF_STATE_PRECISION_INT8], bytes[ZINF_STATE_PRECISION_BF16]);

  zinf_engine_options bad = kHost;
  const int seven = 7;  // what a C caller can store in the enum; C++ may not cast it
  std::memcpy(&bad.state_precision, &seven, sizeof seven);
  zinf_engine* out = nullptr;
  EXPECT_EQ(zinf_engine_create(kConfig, kLayers, 2, &bad, &out), ZINF_ERR_USAGE);
  EXPECT_EQ(std::string(zinf_last_error()),
            "zinf_engine_create: unknown state_precision 7 (expected "
            "ZINF_STATE_PRECISION_CONFIG, _FP32, _BF16 or _INT8)");
  EXPECT_EQ(out, nullptr);
}

TEST(CApi, SaveAndLoadRestoreTheWeights) {
  zinf::test::TestDir dir;
  Engine h;
  ASSERT_NE(h.e, nullptr);
  const std::vector<float> w = weights_of(1000, 0.02f);
  const std::vector<float> g = grads_of(1000);
  const std::vector<float> w1 = weights_of(257, 0.03f);
  ASSERT_EQ(zinf_engine_set_master_weights(h.e, 0, w.data(), 1000), ZINF_OK);
  ASSERT_EQ(zinf_engine_set_master_weights(h.e, 1, w1.data(), 257), ZINF_OK);
  const std::string ckpt = dir.subdir("ckpt");
  ASSERT_EQ(zinf_engine_save(h.e, ckpt.c_str()), ZINF_OK) << zinf_last_error();
  ASSERT_EQ(zinf_engine_set_gradients(h.e, 0, g.data(), 1000, ZINF_DTYPE_F32), ZINF_OK);
  ASSERT_EQ(zinf_engine_step(h.e, nullptr), ZINF_OK) << zinf_last_error();
  ASSERT_EQ(zinf_engine_load(h.e, ckpt.c_str()), ZINF_OK) << zinf_last_error();
  std::vector<float> out(1000);
  ASSERT_EQ(zinf_engine_read_master_weights(h.e, 0, out.data(), 1000), ZINF_OK);
  EXPECT_EQ(out, w);

  // The checkpoint's hyper-parameters come back with it: a learning rate set after the save
  // is replaced by the saved one, and get_hyper says so.
  zinf_adam_params p{};
  ASSERT_EQ(zinf_engine_get_hyper(h.e, &p), ZINF_OK);
  const double saved_lr = p.lr;
  p.lr = saved_lr * 4;
  ASSERT_EQ(zinf_engine_set_hyper(h.e, &p), ZINF_OK) << zinf_last_error();
  ASSERT_EQ(zinf_engine_load(h.e, ckpt.c_str()), ZINF_OK) << zinf_last_error();
  ASSERT_EQ(zinf_engine_get_hyper(h.e, &p), ZINF_OK);
  EXPECT_DOUBLE_EQ(p.lr, saved_lr);

  // zinf_engine_save_async: the checkpoint holds the weights at the call although a step runs
  // before zinf_engine_wait_save. This engine's optimizer state is in memory (the cpu tier),
  // which a save always streams; none is reported before the first.
  const std::string ckpt2 = dir.subdir("ckpt2");
  zinf_save_snapshot snapshot = ZINF_SAVE_SNAPSHOT_REFLINK;
  ASSERT_EQ(zinf_engine_last_save_snapshot(h.e, &snapshot), ZINF_OK) << zinf_last_error();
  EXPECT_EQ(snapshot, ZINF_SAVE_SNAPSHOT_NONE);
  ASSERT_EQ(zinf_engine_save_async(h.e, ckpt2.c_str()), ZINF_OK) << zinf_last_error();
  ASSERT_EQ(zinf_engine_last_save_snapshot(h.e, &snapshot), ZINF_OK) << zinf_last_error();
  EXPECT_EQ(snapshot, ZINF_SAVE_SNAPSHOT_STREAMED);
  EXPECT_EQ(zinf_engine_last_save_snapshot(h.e, nullptr), ZINF_ERR_USAGE);
  EXPECT_STREQ(zinf_last_error(), "zinf_engine_last_save_snapshot: out is NULL");
  ASSERT_EQ(zinf_engine_set_gradients(h.e, 0, g.data(), 1000, ZINF_DTYPE_F32), ZINF_OK);
  ASSERT_EQ(zinf_engine_step(h.e, nullptr), ZINF_OK) << zinf_last_error();
  ASSERT_EQ(zinf_engine_wait_save(h.e), ZINF_OK) << zinf_last_error();
  ASSERT_EQ(zinf_engine_wait_save(h.e), ZINF_OK) << zinf_last_error();  // none in flight
  ASSERT_EQ(zinf_engine_load(h.e, ckpt2.c_str()), ZINF_OK) << zinf_last_error();
  ASSERT_EQ(zinf_engine_read_master_weights(h.e, 0, out.data(), 1000), ZINF_OK);
  EXPECT_EQ(out, w);
  EXPECT_EQ(zinf_engine_save_async(h.e, nullptr), ZINF_ERR_USAGE);
  EXPECT_STREQ(zinf_last_error(), "zinf_engine_save_async: dir is NULL");
  EXPECT_EQ(zinf_engine_save_async(h.e, ""), ZINF_ERR_USAGE);
  EXPECT_STREQ(zinf_last_error(), "zinf_engine_save_async: dir is empty");

  const std::string missing = dir.file("nothing-here");
  EXPECT_NE(zinf_engine_load(h.e, missing.c_str()), ZINF_OK);
  EXPECT_NE(std::string(zinf_last_error()).find(missing), std::string::npos) << zinf_last_error();
}

TEST(CApi, HyperParametersRoundTrip) {
  Engine h;
  ASSERT_NE(h.e, nullptr);
  zinf_adam_params p{};
  ASSERT_EQ(zinf_engine_get_hyper(h.e, &p), ZINF_OK);
  EXPECT_DOUBLE_EQ(p.lr, 0.01);
  EXPECT_DOUBLE_EQ(p.weight_decay, 0.1);
  EXPECT_EQ(p.adamw, 1);
  EXPECT_EQ(p.bias_correction, 1);
  p.lr = 0.5;
  ASSERT_EQ(zinf_engine_set_hyper(h.e, &p), ZINF_OK) << zinf_last_error();
  zinf_adam_params q{};
  ASSERT_EQ(zinf_engine_get_hyper(h.e, &q), ZINF_OK);
  EXPECT_DOUBLE_EQ(q.lr, 0.5);
  q.beta1 = 1.5;  // out of [0, 1): the optimizer's check, and nothing changes
  EXPECT_EQ(zinf_engine_set_hyper(h.e, &q), ZINF_ERR_USAGE);
  EXPECT_NE(std::string(zinf_last_error()).find("beta1"), std::string::npos) << zinf_last_error();
  ASSERT_EQ(zinf_engine_get_hyper(h.e, &p), ZINF_OK);
  EXPECT_DOUBLE_EQ(p.beta1, 0.9);
}

// One layer's own set (no decay, as for a bias): the other keeps the engine's, zinf_engine_
// set_hyper would reset both, and the training is the C++ engine's with the same sets, bitwise.
TEST(CApi, LayerHyperParametersAreTheLayersOwn) {
  Engine h;
  ASSERT_NE(h.e, nullptr);
  zinf_adam_params p{};
  ASSERT_EQ(zinf_engine_get_layer_hyper(h.e, 1, &p), ZINF_OK) << zinf_last_error();
  EXPECT_DOUBLE_EQ(p.weight_decay, 0.1);
  p.weight_decay = 0.0;
  ASSERT_EQ(zinf_engine_set_layer_hyper(h.e, 1, &p), ZINF_OK) << zinf_last_error();
  zinf_adam_params q{};
  ASSERT_EQ(zinf_engine_get_layer_hyper(h.e, 1, &q), ZINF_OK);
  EXPECT_DOUBLE_EQ(q.weight_decay, 0.0);
  ASSERT_EQ(zinf_engine_get_layer_hyper(h.e, 0, &q), ZINF_OK);
  EXPECT_DOUBLE_EQ(q.weight_decay, 0.1);
  ASSERT_EQ(zinf_engine_get_hyper(h.e, &q), ZINF_OK);
  EXPECT_DOUBLE_EQ(q.weight_decay, 0.1);
  EXPECT_EQ(zinf_engine_get_layer_hyper(h.e, 2, &q), ZINF_ERR_USAGE);
  p.eps = 0.0;  // refused, naming the C field; nothing changes
  EXPECT_EQ(zinf_engine_set_layer_hyper(h.e, 1, &p), ZINF_ERR_USAGE);
  EXPECT_NE(std::string(zinf_last_error()).find("zinf_engine_set_layer_hyper: params->eps"),
            std::string::npos)
      << zinf_last_error();

  std::vector<off::LayerSpec> specs = {{"a", 1000, zinf::ElementType::kBF16},
                                       {"b", 257, zinf::ElementType::kF16}};
  auto device = zinf::cuda::make_device({.kind = zinf::cuda::DeviceKind::kHost});
  zinf::cuda::Stream stream = device->create_stream();
  off::OffloadEngine cpp(off::parse_config(kConfig), specs, *device, stream);
  zinf::adam::AdamParams no_decay = cpp.hyper(1);
  no_decay.weight_decay = 0.0;
  cpp.set_hyper(1, no_decay);
  std::vector<std::vector<float>> w(2), g(2);
  for (std::size_t l = 0; l < 2; ++l) {
    w[l] = weights_of(specs[l].numel, 0.5f);
    g[l] = grads_of(specs[l].numel);
    ASSERT_EQ(zinf_engine_set_master_weights(h.e, l, w[l].data(), w[l].size()), ZINF_OK);
    cpp.set_master_weights(l, w[l]);
  }
  for (int step = 0; step < 2; ++step) {
    for (std::size_t l = 0; l < 2; ++l) {
      ASSERT_EQ(zinf_engine_set_gradients(h.e, l, g[l].data(), g[l].size(), ZINF_DTYPE_F32),
                ZINF_OK);
      cpp.set_gradients(l, zinf::adam::GradView::f32(g[l]));
    }
    ASSERT_EQ(zinf_engine_step(h.e, nullptr), ZINF_OK) << zinf_last_error();
    (void)cpp.step();
  }
  for (std::size_t l = 0; l < 2; ++l) {
    std::vector<float> c_out(specs[l].numel), cpp_out(specs[l].numel);
    ASSERT_EQ(zinf_engine_read_master_weights(h.e, l, c_out.data(), c_out.size()), ZINF_OK);
    cpp.read_master_weights(l, cpp_out);
    EXPECT_EQ(std::memcmp(c_out.data(), cpp_out.data(), c_out.size() * sizeof(float)), 0) << l;
  }
}

// Gradients in device memory (host memory on the host simulation) give the weights host
// gradients give, bitwise; a wrong count is refused before anything is queued.
TEST(CApi, DeviceGradientsGiveTheWeightsOfHostGradients) {
  Engine dev_side, host_side;
  ASSERT_NE(dev_side.e, nullptr);
  ASSERT_NE(host_side.e, nullptr);
  const std::size_t numel[2] = {1000, 257};
  std::vector<std::vector<float>> w(2), g(2);
  for (std::size_t l = 0; l < 2; ++l) {
    w[l] = weights_of(numel[l], 0.25f);
    g[l] = grads_of(numel[l]);
    ASSERT_EQ(zinf_engine_set_master_weights(dev_side.e, l, w[l].data(), numel[l]), ZINF_OK);
    ASSERT_EQ(zinf_engine_set_master_weights(host_side.e, l, w[l].data(), numel[l]), ZINF_OK);
  }
  EXPECT_EQ(zinf_engine_set_gradients_device(dev_side.e, 0, g[0].data(), 999, ZINF_DTYPE_F32),
            ZINF_ERR_USAGE);
  for (int step = 0; step < 3; ++step) {
    for (std::size_t l = 0; l < 2; ++l) {
      ASSERT_EQ(zinf_engine_set_gradients_device(dev_side.e, l, g[l].data(), numel[l],
                                                 ZINF_DTYPE_F32),
                ZINF_OK)
          << zinf_last_error();
      ASSERT_EQ(zinf_engine_set_gradients(host_side.e, l, g[l].data(), numel[l], ZINF_DTYPE_F32),
                ZINF_OK);
    }
    ASSERT_EQ(zinf_engine_step(dev_side.e, nullptr), ZINF_OK) << zinf_last_error();
    ASSERT_EQ(zinf_engine_step(host_side.e, nullptr), ZINF_OK) << zinf_last_error();
  }
  for (std::size_t l = 0; l < 2; ++l) {
    std::vector<float> a(numel[l]), b(numel[l]);
    ASSERT_EQ(zinf_engine_read_master_weights(dev_side.e, l, a.data(), numel[l]), ZINF_OK);
    ASSERT_EQ(zinf_engine_read_master_weights(host_side.e, l, b.data(), numel[l]), ZINF_OK);
    EXPECT_EQ(std::memcmp(a.data(), b.data(), numel[l] * sizeof(float)), 0) << l;
  }
  zinf_stats stats{};
  stats.struct_size = sizeof stats;
  ASSERT_EQ(zinf_engine_stats(dev_side.e, &stats), ZINF_OK);
  EXPECT_EQ(stats.struct_size, ZINF_STATS_SIZE_V3);
  EXPECT_EQ(stats.grad_bytes_to_host, 3u * (1000 + 257) * 4);
  EXPECT_EQ(stats.skipped_steps, 0u);
  EXPECT_EQ(stats.last_step_skipped, 0u);
  EXPECT_DOUBLE_EQ(stats.last_grad_scale_applied, 1.0);
  EXPECT_DOUBLE_EQ(stats.loss_scale, 1.0);
  double scale = 0;
  ASSERT_EQ(zinf_engine_loss_scale(dev_side.e, &scale), ZINF_OK);
  EXPECT_DOUBLE_EQ(scale, 1.0);
  EXPECT_EQ(zinf_engine_loss_scale(dev_side.e, nullptr), ZINF_ERR_USAGE);
}

// A config with clipping and a static fp16 loss scale runs the staged mode: the C caller reads
// the scale to multiply its loss by, an overflow is a skipped step, reported in the stats.
TEST(CApi, StagedModeReportsTheLossScaleAndSkippedSteps) {
  const char* config = R"({
  "zero_optimization": {"stage": 3, "sub_group_size": 32768,
    "offload_param": {"device": "cpu", "buffer_count": 2, "buffer_size": 4096},
    "offload_optimizer": {"device": "cpu"}},
  "gradient_clipping": 1.0,
  "fp16": {"enabled": true, "loss_scale": 128},
  "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}
})";
  const zinf_layer_spec layers[] = {{"a", 1000, ZINF_DTYPE_F16}};
  zinf_engine* created = nullptr;
  ASSERT_EQ(zinf_engine_create(config, layers, 1, &kHost, &created), ZINF_OK)
      << zinf_last_error();
  EngineOwner e(created, zinf_engine_destroy);
  double scale = 0;
  ASSERT_EQ(zinf_engine_loss_scale(e.get(), &scale), ZINF_OK);
  EXPECT_DOUBLE_EQ(scale, 128.0);
  std::vector<float> w = weights_of(1000, 0.5f), g = grads_of(1000);
  ASSERT_EQ(zinf_engine_set_master_weights(e.get(), 0, w.data(), w.size()), ZINF_OK);
  g[7] = std::numeric_limits<float>::infinity();
  ASSERT_EQ(zinf_engine_set_gradients(e.get(), 0, g.data(), g.size(), ZINF_DTYPE_F32), ZINF_OK);
  ASSERT_EQ(zinf_engine_step(e.get(), nullptr), ZINF_OK) << zinf_last_error();
  zinf_stats stats{};
  stats.struct_size = sizeof stats;
  ASSERT_EQ(zinf_engine_stats(e.get(), &stats), ZINF_OK);
  EXPECT_EQ(stats.steps, 0u);
  EXPECT_EQ(stats.skipped_steps, 1u);
  EXPECT_EQ(stats.last_step_skipped, 1u);
  EXPECT_DOUBLE_EQ(stats.loss_scale, 128.0);
  std::vector<float> after(1000);
  ASSERT_EQ(zinf_engine_read_master_weights(e.get(), 0, after.data(), after.size()), ZINF_OK);
  EXPECT_EQ(after, w) << "a skipped step changes nothing";
}

// Hostile configs are usage errors with the reader's message, never a crash or a hang.
TEST(CApi, HostileConfigsAreUsageErrors) {
  zinf_engine* out = nullptr;
  // 100000 nested '[' overflowed the stack while the error message printed the value.
  const std::string deep(100000, '[');
  EXPECT_EQ(zinf_engine_create(deep.c_str(), kLayers, 2, nullptr, &out), ZINF_ERR_USAGE);
  EXPECT_NE(std::string(zinf_last_error()).find("nesting deeper than 64 levels"), std::string::npos)
      << zinf_last_error();
  // An overflowing number escaped the reader as nlohmann's own exception (ZINF_ERR_INTERNAL).
  EXPECT_EQ(
      zinf_engine_create(R"({"optimizer": {"params": {"lr": 1e309}}})", kLayers, 2, nullptr, &out),
      ZINF_ERR_USAGE);
  EXPECT_NE(std::string(zinf_last_error()).find("optimizer.params.lr: number out of range"),
            std::string::npos)
      << zinf_last_error();
  EXPECT_EQ(out, nullptr);

  zinf::test::TestDir dir;
  const std::string fifo = dir.file("config.fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  auto status = std::async(std::launch::async, [&] {
    zinf_engine* e = nullptr;
    const zinf_status s = zinf_engine_create_from_file(fifo.c_str(), kLayers, 2, nullptr, &e);
    zinf_engine_destroy(e);
    return std::make_pair(s, std::string(zinf_last_error()));
  });
  if (status.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
    ADD_FAILURE() << "zinf_engine_create_from_file blocked on a FIFO";
    const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);  // unblock it: end of file
    if (fd >= 0) ::close(fd);
  }
  const auto [s, message] = status.get();
  EXPECT_EQ(s, ZINF_ERR_USAGE);
  EXPECT_EQ(message, fifo + ": the config is a FIFO, not a regular file; give a JSON file");
}

// A set_hyper with a non-finite or out-of-range value is refused, naming the field, and
// changes nothing: the next step gives exactly what an engine that never had the call gives.
// (It used to be accepted; the next step then failed and left a cpu-tier engine failed.)
TEST(CApi, RefusedSetHyperLeavesTheEngineUsableAndItsStateIntact) {
  Engine spoiled;
  Engine clean;
  ASSERT_NE(spoiled.e, nullptr);
  ASSERT_NE(clean.e, nullptr);
  std::vector<std::vector<float>> g(2);
  for (zinf_engine* e : {spoiled.e, clean.e}) {
    for (std::size_t l = 0; l < 2; ++l) {
      const std::vector<float> w = weights_of(kLayers[l].numel, 0.02f);
      ASSERT_EQ(zinf_engine_set_master_weights(e, l, w.data(), w.size()), ZINF_OK);
    }
  }
  zinf_adam_params before{};
  ASSERT_EQ(zinf_engine_get_hyper(spoiled.e, &before), ZINF_OK);
  const std::vector<std::pair<const char*, void (*)(zinf_adam_params&)>> bad = {
      {"lr", [](zinf_adam_params& p) { p.lr = INFINITY; }},
      {"lr", [](zinf_adam_params& p) { p.lr = NAN; }},
      {"lr", [](zinf_adam_params& p) { p.lr = 1e39; }},
      {"beta2", [](zinf_adam_params& p) { p.beta2 = 1.0; }},
      {"eps", [](zinf_adam_params& p) { p.eps = INFINITY; }},
      {"eps", [](zinf_adam_params& p) { p.eps = NAN; }},
      {"eps", [](zinf_adam_params& p) { p.eps = 0.0; }},
      {"weight_decay", [](zinf_adam_params& p) { p.weight_decay = INFINITY; }},
      {"weight_decay", [](zinf_adam_params& p) { p.weight_decay = -1.0; }},
      {"grad_scale", [](zinf_adam_params& p) { p.grad_scale = NAN; }},
      {"grad_scale", [](zinf_adam_params& p) { p.grad_scale = 0.0; }},
  };
  for (const auto& [field, spoil] : bad) {
    zinf_adam_params p = before;
    spoil(p);
    EXPECT_EQ(zinf_engine_set_hyper(spoiled.e, &p), ZINF_ERR_USAGE) << field;
    const std::string want = std::string("zinf_engine_set_hyper: params->") + field + " must be";
    EXPECT_EQ(std::string(zinf_last_error()).rfind(want, 0), 0u) << zinf_last_error();
    zinf_adam_params now{};
    ASSERT_EQ(zinf_engine_get_hyper(spoiled.e, &now), ZINF_OK);
    EXPECT_TRUE(now.lr == before.lr && now.beta1 == before.beta1 && now.beta2 == before.beta2 &&
                now.eps == before.eps && now.weight_decay == before.weight_decay &&
                now.grad_scale == before.grad_scale && now.adamw == before.adamw &&
                now.bias_correction == before.bias_correction)
        << field;
  }
  for (zinf_engine* e : {spoiled.e, clean.e}) {
    for (std::size_t l = 0; l < 2; ++l) {
      g[l] = grads_of(kLayers[l].numel);
      ASSERT_EQ(zinf_engine_set_gradients(e, l, g[l].data(), g[l].size(), ZINF_DTYPE_F32), ZINF_OK);
    }
    ASSERT_EQ(zinf_engine_step(e, nullptr), ZINF_OK) << zinf_last_error();
  }
  for (std::size_t l = 0; l < 2; ++l) {
    std::vector<float> a(kLayers[l].numel), b(kLayers[l].numel);
    ASSERT_EQ(zinf_engine_read_master_weights(spoiled.e, l, a.data(), a.size()), ZINF_OK);
    ASSERT_EQ(zinf_engine_read_master_weights(clean.e, l, b.data(), b.size()), ZINF_OK);
    EXPECT_EQ(a, b) << "layer " << l;
  }
}

// "" + "/LATEST" is a path at the root of the file system: an empty directory is misuse.
TEST(CApi, EmptyCheckpointDirectoryIsUsage) {
  Engine h;
  ASSERT_NE(h.e, nullptr);
  const std::vector<float> w = weights_of(1000, 0.02f);
  const std::vector<float> w1 = weights_of(257, 0.03f);
  ASSERT_EQ(zinf_engine_set_master_weights(h.e, 0, w.data(), 1000), ZINF_OK);
  ASSERT_EQ(zinf_engine_set_master_weights(h.e, 1, w1.data(), 257), ZINF_OK);
  EXPECT_EQ(zinf_engine_save(h.e, ""), ZINF_ERR_USAGE);
  EXPECT_STREQ(zinf_last_error(), "zinf_engine_save: dir is empty");
  EXPECT_EQ(zinf_engine_load(h.e, ""), ZINF_ERR_USAGE);
  EXPECT_STREQ(zinf_last_error(), "zinf_engine_load: dir is empty");
  // The C++ entry points refuse it too.
  const std::string want = what_of([&] {
    zinf::test::TestDir dir;
    auto device = zinf::cuda::make_device({.kind = zinf::cuda::DeviceKind::kHost});
    zinf::cuda::Stream compute = device->create_stream();
    off::OffloadEngine engine(
        off::parse_config(kConfig),
        {{"a", 1000, zinf::ElementType::kBF16}, {"b", 257, zinf::ElementType::kF16}}, *device,
        compute.ref());
    engine.load("");
  });
  EXPECT_EQ(want,
            "OffloadEngine::load: the checkpoint directory is empty (\"\"); give a directory");
  const std::vector<float> g = grads_of(1000);
  ASSERT_EQ(zinf_engine_set_gradients(h.e, 0, g.data(), 1000, ZINF_DTYPE_F32), ZINF_OK);
  EXPECT_EQ(zinf_engine_step(h.e, nullptr), ZINF_OK) << zinf_last_error();
}

// A "trainer" device with its own stream, an engine computing on that stream
// (options.compute_stream) with layer 0's weights set, the stream held by the trainer's work,
// and layer 0 fetched: fetch made the stream wait for the copy and returned without waiting
// itself, so `fetched` (recorded after it) is still pending. Members in destruction order:
// the gate opens before the engine goes, the engine before the stream and device it uses.
struct HeldFetch {
  std::unique_ptr<zinf::cuda::Device> trainer;
  zinf::cuda::Stream native;
  EngineOwner e{nullptr, zinf_engine_destroy};
  StreamGate gate;
  zinf::cuda::Event fetched;
  std::vector<float> w = weights_of(1000, 0.01f);
  void* data = nullptr;
  std::size_t bytes = 0;
};

void fetch_on_held_stream(zinf::cuda::DeviceKind kind, zinf_device_kind c_kind, HeldFetch& h) {
  h.trainer = zinf::cuda::make_device({.kind = kind});
  h.native = h.trainer->create_stream();
  zinf_engine_options o{};
  o.device = c_kind;
  o.compute_stream = zinf::cuda::native_stream(h.native);
  zinf_engine* created = nullptr;
  ASSERT_EQ(zinf_engine_create(kConfig, kLayers, 2, &o, &created), ZINF_OK) << zinf_last_error();
  h.e.reset(created);
  h.fetched = h.trainer->create_event();
  ASSERT_EQ(zinf_engine_set_master_weights(h.e.get(), 0, h.w.data(), h.w.size()), ZINF_OK);
  h.trainer->enqueue_host_work(h.native, h.gate.waiter());
  ASSERT_EQ(zinf_engine_fetch(h.e.get(), 0, &h.data, &h.bytes), ZINF_OK) << zinf_last_error();
  h.trainer->record(h.fetched, h.native);
  EXPECT_FALSE(h.fetched.query()) << "the stream is held: fetch returned before its copy";
  ASSERT_EQ(h.bytes, 2000u);
}

// The caller's compute stream (options.compute_stream): fetch makes that stream wait for the
// copy and returns without waiting itself. The "trainer's" work holds the stream, and fetch
// returns all the same (`fetched`, recorded after it, is still pending). The copy itself runs
// on the parameter tier's own copy stream (the pinned tier prefetches), so it may land before
// the trainer's stream moves on; what the stream sees once it does is the layer's bytes.
// Ordering only, no timing. A whole iteration on that stream then gives the same parameters
// as the master weights say.
TEST(CApi, FetchOnTheCallersStreamReturnsWithoutWaitingForIt) {
  HeldFetch h;
  fetch_on_held_stream(zinf::cuda::DeviceKind::kHost, ZINF_DEVICE_HOST, h);
  if (HasFatalFailure()) return;
  const std::uint16_t* p = nullptr;
  h.gate.open();
  h.trainer->synchronize(h.native);
  EXPECT_TRUE(h.fetched.query());
  p = static_cast<const std::uint16_t*>(h.data);
  for (std::size_t i = 0; i < 1000; ++i) ASSERT_EQ(p[i], bf16_of(h.w[i])) << i;
  ASSERT_EQ(zinf_engine_release(h.e.get(), 0), ZINF_OK) << zinf_last_error();

  const std::vector<float> g = grads_of(1000);
  ASSERT_EQ(zinf_engine_set_gradients(h.e.get(), 0, g.data(), g.size(), ZINF_DTYPE_F32),
            ZINF_OK);
  ASSERT_EQ(zinf_engine_step(h.e.get(), nullptr), ZINF_OK) << zinf_last_error();
  std::vector<float> after(1000);
  ASSERT_EQ(zinf_engine_read_master_weights(h.e.get(), 0, after.data(), after.size()), ZINF_OK);
  ASSERT_EQ(zinf_engine_fetch(h.e.get(), 0, &h.data, &h.bytes), ZINF_OK) << zinf_last_error();
  h.trainer->synchronize(h.native);
  p = static_cast<const std::uint16_t*>(h.data);
  for (std::size_t i = 0; i < 1000; ++i) ASSERT_EQ(p[i], bf16_of(after[i])) << i;
  EXPECT_NE(after, h.w) << "the step changed nothing";
  ASSERT_EQ(zinf_engine_release(h.e.get(), 0), ZINF_OK);
}

TEST(CApi, ACallersStreamThatIsNoStreamIsUsage) {
  int not_a_stream = 0;
  zinf_engine_options o{};
  o.device = ZINF_DEVICE_HOST;
  o.compute_stream = &not_a_stream;
  zinf_engine* out = nullptr;
  EXPECT_EQ(zinf_engine_create(kConfig, kLayers, 2, &o, &out), ZINF_ERR_USAGE);
  EXPECT_NE(std::string(zinf_last_error()).find("is not a live host stream"), std::string::npos)
      << zinf_last_error();
  EXPECT_EQ(out, nullptr);
}

// The CUDA path of the test above: a real cudaStream_t (made here through zinf, as a trainer's
// runtime would), ordering checked with an event on it. Skips without a GPU.
TEST(CApi, FetchOnTheCallersCudaStreamReturnsWithoutWaitingForIt) {
  const zinf::cuda::CudaAvailability cuda = zinf::cuda::probe_cuda();
  if (!cuda.available()) GTEST_SKIP() << "no CUDA device visible: " << cuda.reason;
  HeldFetch h;
  fetch_on_held_stream(zinf::cuda::DeviceKind::kCuda, ZINF_DEVICE_CUDA, h);
  if (HasFatalFailure()) return;
  h.gate.open();
  h.trainer->synchronize(h.native);
  EXPECT_TRUE(h.fetched.query());
  ASSERT_EQ(zinf_engine_release(h.e.get(), 0), ZINF_OK) << zinf_last_error();
  const std::vector<float> g = grads_of(1000);
  ASSERT_EQ(zinf_engine_set_gradients(h.e.get(), 0, g.data(), g.size(), ZINF_DTYPE_F32),
            ZINF_OK);
  ASSERT_EQ(zinf_engine_step(h.e.get(), nullptr), ZINF_OK) << zinf_last_error();
}

// Zero-initialised options (struct_size 0 = the first version) and NULL options pick the
// device C++ picks by default (make_device's auto: CUDA if visible, else host).
TEST(CApi, DefaultOptionsPickTheDeviceCppPicks) {
  const zinf_device_kind want =
      zinf::cuda::probe_cuda().available() ? ZINF_DEVICE_CUDA : ZINF_DEVICE_HOST;
  const zinf_engine_options zero{};
  for (const zinf_engine_options* o : {&zero, static_cast<const zinf_engine_options*>(nullptr)}) {
    zinf_engine* e = nullptr;
    ASSERT_EQ(zinf_engine_create(kConfig, kLayers, 2, o, &e), ZINF_OK) << zinf_last_error();
    zinf_device_kind kind = ZINF_DEVICE_AUTO;
    EXPECT_EQ(zinf_engine_device_kind(e, &kind), ZINF_OK);
    EXPECT_EQ(kind, want) << (o == nullptr ? "NULL options" : "zeroed options");
    zinf_engine_destroy(e);
  }
  zinf_engine* e = nullptr;
  ASSERT_EQ(zinf_engine_create(kConfig, kLayers, 2, &kHost, &e), ZINF_OK) << zinf_last_error();
  zinf_device_kind kind = ZINF_DEVICE_AUTO;
  EXPECT_EQ(zinf_engine_device_kind(e, &kind), ZINF_OK);
  EXPECT_EQ(kind, ZINF_DEVICE_HOST);
  zinf_engine_destroy(e);
}

// struct_size: below the first version is refused before anything is read or written; a
// newer caller's larger options are fine while the fields this library does not know are
// zero; a newer caller's larger stats get their unknown tail zeroed and learn how much was
// written.
TEST(CApi, StructSizeIsCheckedAndBoundsWhatIsReadAndWritten) {
  zinf_engine_options small = kHost;
  small.struct_size = offsetof(zinf_engine_options, compute_stream);
  zinf_engine* out = nullptr;
  EXPECT_EQ(zinf_engine_create(kConfig, kLayers, 2, &small, &out), ZINF_ERR_USAGE);
  EXPECT_EQ(std::string(zinf_last_error()), "zinf_engine_create: options->struct_size " +
                                                std::to_string(small.struct_size) +
                                                " is smaller than the first version's " +
                                                std::to_string(ZINF_ENGINE_OPTIONS_SIZE_V1) +
                                                " bytes (set it to sizeof the struct)");
  EXPECT_EQ(out, nullptr);

  struct NewerOptions {
    zinf_engine_options v1;
    std::uint64_t unknown;
  } newer{kHost, 0};
  newer.v1.struct_size = sizeof newer;
  ASSERT_EQ(zinf_engine_create(kConfig, kLayers, 2, &newer.v1, &out), ZINF_OK) << zinf_last_error();
  EngineOwner e(out, zinf_engine_destroy);
  zinf_device_kind kind = ZINF_DEVICE_AUTO;
  EXPECT_EQ(zinf_engine_device_kind(e.get(), &kind), ZINF_OK);
  EXPECT_EQ(kind, ZINF_DEVICE_HOST) << "the fields it covers are read";
  newer.unknown = 1;
  zinf_engine* refused = nullptr;
  EXPECT_EQ(zinf_engine_create(kConfig, kLayers, 2, &newer.v1, &refused), ZINF_ERR_USAGE);
  EXPECT_NE(std::string(zinf_last_error())
                .find("does not know, and byte " + std::to_string(sizeof(zinf_engine_options))),
            std::string::npos)
      << zinf_last_error();
  EXPECT_EQ(refused, nullptr);

  zinf_stats tiny{};
  tiny.struct_size = 8;
  tiny.steps = 77;
  EXPECT_EQ(zinf_engine_stats(e.get(), &tiny), ZINF_ERR_USAGE);
  EXPECT_NE(std::string(zinf_last_error()).find("zinf_engine_stats: out->struct_size 8"),
            std::string::npos)
      << zinf_last_error();
  EXPECT_EQ(tiny.steps, 77u) << "nothing is written on failure";
  EXPECT_EQ(tiny.struct_size, 8u);

  zinf_stats zero{};
  zero.steps = 77;
  ASSERT_EQ(zinf_engine_stats(e.get(), &zero), ZINF_OK) << zinf_last_error();
  EXPECT_EQ(zero.struct_size, ZINF_STATS_SIZE_V1);
  EXPECT_EQ(zero.steps, 0u);

  struct NewerStats {
    zinf_stats v1;
    std::uint64_t unknown;
  } stats{};
  stats.v1.struct_size = sizeof stats;
  stats.unknown = 0xdeadbeef;
  ASSERT_EQ(zinf_engine_stats(e.get(), &stats.v1), ZINF_OK) << zinf_last_error();
  EXPECT_EQ(stats.v1.struct_size, sizeof(zinf_stats));
  EXPECT_EQ(stats.unknown, 0u);
}

// Version 3 of zinf_stats: a one-rank engine has no collectives (0 bytes, also after a step)
// and reports the configured stage; a version-2 caller gets version 2's bytes and nothing past
// them, a version-1 caller version 1's.
TEST(CApi, StatsVersionThreeCountsNoCollectivesOnOneRank) {
  zinf_engine* raw = nullptr;
  ASSERT_EQ(zinf_engine_create(kConfig, kLayers, 2, &kHost, &raw), ZINF_OK) << zinf_last_error();
  std::unique_ptr<zinf_engine, void (*)(zinf_engine*)> e(raw, zinf_engine_destroy);
  const std::size_t numel[] = {1000, 257};
  for (std::size_t l = 0; l < 2; ++l) {
    const std::vector<float> w = weights_of(numel[l], 0.01f);
    ASSERT_EQ(zinf_engine_set_master_weights(e.get(), l, w.data(), numel[l]), ZINF_OK);
  }
  std::vector<std::vector<float>> g = {grads_of(numel[0]), grads_of(numel[1])};
  for (std::size_t l = 0; l < 2; ++l) {
    ASSERT_EQ(zinf_engine_set_gradients(e.get(), l, g[l].data(), numel[l], ZINF_DTYPE_F32),
              ZINF_OK);
  }
  ASSERT_EQ(zinf_engine_step(e.get(), nullptr), ZINF_OK) << zinf_last_error();

  zinf_stats v3{};
  v3.struct_size = sizeof v3;
  ASSERT_EQ(zinf_engine_stats(e.get(), &v3), ZINF_OK) << zinf_last_error();
  EXPECT_EQ(v3.struct_size, ZINF_STATS_SIZE_V3);
  EXPECT_EQ(v3.steps, 1u);
  EXPECT_EQ(v3.zero_stage, 3u) << "kConfig's stage, as configured";
  EXPECT_EQ(v3.last_step_allgather_bytes, 0u);
  EXPECT_EQ(v3.last_step_reduce_scatter_bytes, 0u);
  EXPECT_EQ(v3.last_step_all_reduce_bytes, 0u);

  // A caller built against version 2: the fields past it stay as the caller left them.
  zinf_stats v2;
  std::memset(&v2, 0xab, sizeof v2);
  v2.struct_size = ZINF_STATS_SIZE_V2;
  ASSERT_EQ(zinf_engine_stats(e.get(), &v2), ZINF_OK) << zinf_last_error();
  EXPECT_EQ(v2.struct_size, ZINF_STATS_SIZE_V2);
  EXPECT_EQ(v2.steps, 1u);
  EXPECT_EQ(v2.grad_staging_wait_seconds, v3.grad_staging_wait_seconds);
  EXPECT_EQ(v2.last_step_allgather_bytes, 0xababababababababull) << "past version 2: untouched";
  EXPECT_EQ(v2.zero_stage, 0xababababababababull);
  zinf_stats v1;
  std::memset(&v1, 0xab, sizeof v1);
  v1.struct_size = ZINF_STATS_SIZE_V1;
  ASSERT_EQ(zinf_engine_stats(e.get(), &v1), ZINF_OK) << zinf_last_error();
  EXPECT_EQ(v1.struct_size, ZINF_STATS_SIZE_V1);
  EXPECT_EQ(v1.param_read_gbps, v3.param_read_gbps);
  EXPECT_EQ(v1.skipped_steps, 0xababababababababull) << "past version 1: untouched";

  // A stage-2 config on one engine: reported as configured.
  const char* stage2 = R"({"zero_optimization": {"stage": 2,
    "offload_optimizer": {"device": "cpu"}}})";
  zinf_engine* two = nullptr;
  ASSERT_EQ(zinf_engine_create(stage2, kLayers, 2, &kHost, &two), ZINF_OK) << zinf_last_error();
  zinf_stats s2{};
  s2.struct_size = sizeof s2;
  EXPECT_EQ(zinf_engine_stats(two, &s2), ZINF_OK);
  EXPECT_EQ(s2.zero_stage, 2u);
  zinf_engine_destroy(two);
}

// zinf_engine_create_mpi in a process without MPI_Init (this test's), or in a build without
// MPI: a usage error that says which, and no engine. (The door itself: capi_mpi_test.c under
// mpirun.)
TEST(CApi, CreateMpiSaysWhyNotWithoutMpi) {
  zinf_engine* out = nullptr;
  EXPECT_EQ(zinf_engine_create_mpi(kConfig, kLayers, 2, &kHost, 0, &out), ZINF_ERR_USAGE);
  EXPECT_EQ(out, nullptr);
#if ZINF_HAVE_MPI
  EXPECT_STREQ(zinf_last_error(),
               "zinf_engine_create_mpi: mpi collectives: MPI is not initialized; call MPI_Init "
               "before make_mpi_collectives and MPI_Finalize after destroying it");
#else
  EXPECT_STREQ(zinf_last_error(),
               "zinf_engine_create_mpi: zinf was built without MPI (ZINF_WITH_MPI=OFF, or no MPI "
               "C bindings found at configure time; Debian: libopenmpi-dev)");
#endif
  // The C API's own argument checks come first, as zinf_engine_create's.
  EXPECT_EQ(zinf_engine_create_mpi(nullptr, kLayers, 2, &kHost, 0, &out), ZINF_ERR_USAGE);
  EXPECT_STREQ(zinf_last_error(), "zinf_engine_create_mpi: config is NULL");
  zinf_engine_options tiny = kHost;
  tiny.struct_size = 4;
  EXPECT_EQ(zinf_engine_create_mpi(kConfig, kLayers, 2, &tiny, 0, &out), ZINF_ERR_USAGE);
  EXPECT_NE(std::string(zinf_last_error()).find("zinf_engine_create_mpi: options->struct_size 4"),
            std::string::npos)
      << zinf_last_error();
  EXPECT_EQ(out, nullptr);
}

TEST(CApi, CallableFromC99) {
  char message[512] = {};
  EXPECT_EQ(zinf_capi_c_smoke(message, sizeof message), 0) << message;
}

}  // namespace
