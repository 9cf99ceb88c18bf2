// SPDX-License-Identifier: Apache-2.0
// OffloadEngine on the HostDevice: the same synthetic training loop gives bitwise identical
// master weights for every parameter/optimizer tier combination, every fetch returns exactly
// the rounded current masters, out-of-order fetches work, save/load resumes bitwise, config
// contradictions are refused with their exact text before any file exists, misuse is refused;
// layers with hyper-parameters of their own step exactly as the plain kernel with those, set
// for one layer or all, kept by checkpoints.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <future>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "engine_test_util.h"
#include "support/log_capture.h"
#include "zinf/common/error.h"
#include "zinf/offload/config.h"
#include "zinf/offload/engine.h"
#include "zinf/offload/testing.h"
#include "zinf/swap/fault_injection.h"

namespace zinf::offload {
namespace {

using test::EngineRig;
using test::master_diff;

constexpr std::uint64_t kSteps = 3;
using Tiers = std::pair<OffloadDevice, OffloadDevice>;

std::vector<std::vector<float>> train(Tiers tiers, std::uint64_t steps = kSteps,
                                      bool checksums = true) {
  test::TestDir dir;
  EngineRig rig;
  EngineConfig c = test::engine_config(tiers.first, tiers.second, dir);
  c.zinf.checksums = checksums;
  rig.make(c);
  rig.init_weights();
  for (std::uint64_t t = 1; t <= steps; ++t) rig.iteration(t);
  // After the last step too: every fetch is the new masters, rounded.
  for (std::size_t l = 0; l < rig.engine().layer_count(); ++l) {
    EXPECT_EQ(rig.fetch_bits(l), rig.expected_bits(l)) << "layer " << l;
  }
  const EngineStats st = rig.engine().stats();
  EXPECT_EQ(st.steps, steps);
  EXPECT_EQ(st.last_step.step, steps);
  EXPECT_LE(st.pinned_bytes_peak, rig.engine().config().zinf.pinned_budget_bytes);
  if (tiers.first == OffloadDevice::kNvme) {
    EXPECT_GT(st.param_bytes_read, 0u);
    EXPECT_GT(st.param_bytes_written, 0u);
    EXPECT_GT(st.prefetch_hits + st.prefetch_on_demand, 0u);
    EXPECT_GT(st.param_read_gbps, 0.0);
  } else {
    EXPECT_EQ(st.param_read_gbps, 0.0);
    EXPECT_EQ(st.param_bytes_read, 0u);
  }
  if (tiers.first == OffloadDevice::kCpu) {
    // Prefetched like nvme: after the traced first iteration the window issues layers ahead.
    EXPECT_GT(st.prefetch_hits, 0u);
    EXPECT_GT(st.param_bytes_to_device, 0u);
  }
  if (tiers.second == OffloadDevice::kNvme) {
    EXPECT_GT(st.optimizer_bytes_read, 0u);
    EXPECT_GT(st.optimizer_bytes_written, 0u);
  }
  return rig.masters();
}

// The resident/cpu run every other combination must match, bitwise: computed once.
const std::vector<std::vector<float>>& reference_masters() {
  static const std::vector<std::vector<float>> reference =
      train({OffloadDevice::kNone, OffloadDevice::kNone});
  return reference;
}

class OffloadEngineTiers : public ::testing::TestWithParam<Tiers> {};

TEST_P(OffloadEngineTiers, GiveBitwiseTheMastersOfTheResidentTier) {
  EXPECT_EQ(master_diff(train(GetParam()), reference_masters()), "");
}

INSTANTIATE_TEST_SUITE_P(
    ParamByOptimizer, OffloadEngineTiers,
    ::testing::Values(Tiers{OffloadDevice::kNone, OffloadDevice::kNone},
                      Tiers{OffloadDevice::kNone, OffloadDevice::kCpu},
                      Tiers{OffloadDevice::kNone, OffloadDevice::kNvme},
                      Tiers{OffloadDevice::kCpu, OffloadDevice::kNone},
                      Tiers{OffloadDevice::kCpu, OffloadDevice::kCpu},
                      Tiers{OffloadDevice::kCpu, OffloadDevice::kNvme},
                      Tiers{OffloadDevice::kNvme, OffloadDevice::kNone},
                      Tiers{OffloadDevice::kNvme, OffloadDevice::kCpu},
                      Tiers{OffloadDevice::kNvme, OffloadDevice::kNvme}),
    [](const ::testing::TestParamInfo<Tiers>& tiers) {
      return "param_" + std::string(offload_device_name(tiers.param.first)) + "_optimizer_" +
             std::string(offload_device_name(tiers.param.second));
    });

TEST(OffloadEngine, TrainingMovesTheMasters) {
  std::vector<std::vector<float>> init;
  for (std::size_t l = 0; l < test::engine_layers().size(); ++l) {
    init.push_back(test::initial_weights(l, test::engine_layers()[l].numel));
  }
  EXPECT_NE(master_diff(reference_masters(), init), "");
}

// Without checksums the nvme parameter tier keeps the config's 2048-element sub-groups (with
// them, copy-out ranges must be whole 1 MiB stripes, so they round up to 524288 elements and
// each layer here is one sub-group): the copy-out of several sub-groups into one layer.
TEST(OffloadEngine, NvmeParametersWithoutChecksumsCopyOutSeveralSubGroupsPerLayer) {
  EXPECT_EQ(master_diff(train({OffloadDevice::kNvme, OffloadDevice::kNvme}, kSteps,
                              /*checksums=*/false),
                        reference_masters()),
            "");
}

TEST(OffloadEngine, OutOfOrderFetchesReturnTheRightLayer) {
  for (OffloadDevice p : {OffloadDevice::kNvme, OffloadDevice::kCpu}) {
    test::TestDir dir;
    EngineRig rig;
    rig.make(test::engine_config(p, OffloadDevice::kCpu, dir));
    rig.init_weights();
    rig.iteration(1);                      // traces 0,1,2,3 (+ reverse)
    rig.iteration(2, true, {2, 0, 3, 1});  // deviates: re-traces, fetches on demand
    rig.iteration(3, true, {3, 3 - 3, 1, 2});
    for (std::size_t l : {3u, 1u, 0u, 2u, 2u}) EXPECT_EQ(rig.fetch_bits(l), rig.expected_bits(l));
  }
}

// One iteration in which the host runs ahead of the copies: forward fetches are waited for
// (the gradients are computed from their bits), backward fetches are not: each is copied back to
// the host on the compute stream and its gradients handed in at once, so the step's copy-out of
// a layer may start while the window's copy of it is still queued behind others. Once the step
// is done, every backward fetch must have returned exactly the bits from before the step.
void iteration_ahead_of_copies(EngineRig& rig, std::uint64_t t) {
  OffloadEngine& e = rig.engine();
  const std::size_t n = e.layer_count();
  std::vector<std::vector<std::uint16_t>> want(n);
  for (std::size_t l = 0; l < n; ++l) want[l] = rig.expected_bits(l);
  std::vector<std::vector<float>> grads(n);
  for (std::size_t l = 0; l < n; ++l) {
    const auto got = rig.fetch_bits(l);
    EXPECT_EQ(got, want[l]) << "forward fetch of layer " << l << " in step " << t;
    for (std::size_t i = 0; i < got.size(); ++i) {
      grads[l].push_back(static_cast<float>(got[i] % 1000u) * 2e-5f - 1e-2f +
                         static_cast<float>(test::mix32(t * 7919 + l * 31 + i) % 101u) * 1e-5f);
    }
  }
  std::vector<std::vector<std::uint16_t>> back(n);
  for (std::size_t l = n; l-- > 0;) {
    back[l].resize(e.layer(l).numel);
    cuda::DeviceSpan span = e.fetch(l);
    rig.device().copy_to_host(rig.compute(),
                              std::as_writable_bytes(std::span<std::uint16_t>(back[l])), span);
    e.release(l);
    e.set_gradients(l, adam::GradView::f32(grads[l]));
  }
  (void)e.step();
  rig.device().synchronize(rig.compute());
  for (std::size_t l = 0; l < n; ++l) {
    EXPECT_EQ(back[l], want[l]) << "backward fetch of layer " << l << " in step " << t;
  }
}

// The pinned tier's copies read the pinned host copies that the step's copy-out and
// set_master_weights rewrite in place. With a copy lane slow enough (1 GB/s / 1000: ~10 ms per
// layer) that copies queue behind each other while the host runs ahead, every fetch still
// returns exactly the masters of its moment and training gives bitwise the resident tier's
// masters: a copy that read a layer during or after its rewrite would hand out new or torn
// parameters.
TEST(OffloadEngine, PinnedCopiesNeverReadALayerWhileItIsRewritten) {
  auto run = [](OffloadDevice tier) {
    test::TestDir dir;
    EngineRig rig(cuda::DeviceKind::kHost, tier == OffloadDevice::kCpu ? 0.001 : 0);
    EngineConfig c = test::engine_config(tier, OffloadDevice::kCpu, dir);
    c.zinf.prefetch_depth = 3;
    rig.make(c);
    rig.init_weights();
    for (std::uint64_t t = 1; t <= 3; ++t) iteration_ahead_of_copies(rig, t);
    // Right after step() the window is copying the next iteration's first layers; new master
    // weights rewrite every pinned copy at once.
    for (std::size_t l = 0; l < rig.engine().layer_count(); ++l) {
      std::vector<float> w = test::initial_weights(l + 10, rig.engine().layer(l).numel);
      rig.engine().set_master_weights(l, w);
    }
    iteration_ahead_of_copies(rig, 4);
    const EngineStats st = rig.engine().stats();
    if (tier == OffloadDevice::kCpu) {
      EXPECT_GT(st.prefetch_hits, 0u);
    }
    return rig.masters();
  };
  EXPECT_EQ(master_diff(run(OffloadDevice::kCpu), run(OffloadDevice::kNone)), "");
}

TEST(OffloadEngine, SaveLoadResumesBitwise) {
  for (Tiers tiers : {Tiers{OffloadDevice::kNvme, OffloadDevice::kNvme},
                      Tiers{OffloadDevice::kCpu, OffloadDevice::kCpu},
                      Tiers{OffloadDevice::kNone, OffloadDevice::kNvme}}) {
    SCOPED_TRACE(std::string(offload_device_name(tiers.first)));
    test::TestDir dir;
    const std::string ckpt = dir.subdir("ckpt");
    std::vector<std::vector<float>> uninterrupted;
    {
      EngineRig rig;
      rig.make(test::engine_config(tiers.first, tiers.second, dir));
      rig.init_weights();
      rig.iteration(1);
      rig.iteration(2);
      rig.engine().save(ckpt);
      rig.iteration(3);
      uninterrupted = rig.masters();
    }
    test::TestDir dir2;
    EngineRig rig;
    rig.make(test::engine_config(tiers.first, tiers.second, dir2));
    rig.engine().load(ckpt);
    // load rewrote the low-precision copies from the restored masters.
    for (std::size_t l = 0; l < rig.engine().layer_count(); ++l) {
      EXPECT_EQ(rig.fetch_bits(l), rig.expected_bits(l)) << "layer " << l;
    }
    rig.iteration(3);
    EXPECT_EQ(rig.engine().stats().last_step.step, 3u);
    EXPECT_EQ(master_diff(rig.masters(), uninterrupted), "");
  }
}

// save_async at a step boundary, with iterations running while it writes: the checkpoint's
// files are byte for byte those save() writes of the same state (layer table, manifest, state
// file), and loading it resumes bitwise like the synchronous one.
TEST(OffloadEngine, SaveAsyncWritesTheBytesOfSaveWhileIterationsRun) {
  auto read = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
  };
  auto latest = [&](const std::string& ckpt) {
    std::string name = read(ckpt + "/LATEST");
    return name.substr(0, name.find('\n'));
  };
  for (Tiers tiers : {Tiers{OffloadDevice::kNvme, OffloadDevice::kNvme},
                      Tiers{OffloadDevice::kCpu, OffloadDevice::kCpu}}) {
    SCOPED_TRACE(std::string(offload_device_name(tiers.first)));
    test::TestDir dir;
    const std::string sync_dir = dir.subdir("sync");
    const std::string async_dir = dir.subdir("async");
    {
      EngineRig rig;
      rig.make(test::engine_config(tiers.first, tiers.second, dir));
      rig.init_weights();
      rig.iteration(1);
      rig.iteration(2);
      rig.engine().save(sync_dir);
      rig.engine().save_async(async_dir);
      rig.iteration(3);
      rig.iteration(4);
      rig.engine().wait_save();
      EXPECT_FALSE(rig.engine().save_in_flight());
    }
    EXPECT_EQ(read(async_dir + "/zinf-engine-layers"), read(sync_dir + "/zinf-engine-layers"));
    for (const char* f : {"state.bin", "manifest"}) {
      const std::string a = read(async_dir + "/" + latest(async_dir) + "/" + f);
      EXPECT_FALSE(a.empty()) << f;
      EXPECT_TRUE(a == read(sync_dir + "/" + latest(sync_dir) + "/" + f)) << f << " differs";
    }
  }
}

TEST(OffloadEngine, LoadRefusesAnotherLayerTable) {
  test::TestDir dir;
  const std::string ckpt = dir.subdir("ckpt");
  EngineRig rig;
  rig.make(test::engine_config(OffloadDevice::kCpu, OffloadDevice::kCpu, dir));
  rig.init_weights();
  rig.engine().save(ckpt);
  auto layers = test::engine_layers();
  layers[1].numel += 1;
  rig.make(test::engine_config(OffloadDevice::kCpu, OffloadDevice::kCpu, dir), layers);
  try {
    rig.engine().load(ckpt);
    ADD_FAILURE() << "no throw";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()), "OffloadEngine::load: the checkpoint's layer table " + ckpt +
                                         "/zinf-engine-layers differs from this engine's layers "
                                         "(names, element counts, dtypes)");
  }
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The layer table is replaced, never written through a link planted at its name or at its
// old fixed temporary name; a load refuses a link or a FIFO there (at once), naming it. The
// swap files of both NVMe tiers never appear in their directories.
TEST(OffloadEngine, CheckpointFilesAreNeverFollowedOrBlockedOn) {
  test::TestDir dir;
  test::TestDir outside;
  const std::string victim = outside.file("victim");
  std::ofstream(victim) << "precious";
  const std::string ckpt = dir.subdir("ckpt");
  const std::string table = ckpt + "/zinf-engine-layers";
  ASSERT_EQ(::symlink(victim.c_str(), table.c_str()), 0);
  ASSERT_EQ(::symlink(victim.c_str(), (table + ".tmp").c_str()), 0);
  EngineRig rig;
  rig.make(test::engine_config(OffloadDevice::kNvme, OffloadDevice::kNvme, dir));
  EXPECT_TRUE(std::filesystem::is_empty(dir.file("param")));
  EXPECT_TRUE(std::filesystem::is_empty(dir.file("opt")));
  rig.init_weights();
  rig.iteration(1);
  rig.engine().save(ckpt);
  EXPECT_EQ(read_text(victim), "precious");
  EXPECT_TRUE(std::filesystem::is_regular_file(std::filesystem::symlink_status(table)));
  EXPECT_TRUE(std::filesystem::is_symlink(table + ".tmp")) << "not a name zinf gives now";

  const std::string moved = outside.file("table");
  std::filesystem::rename(table, moved);
  ASSERT_EQ(::symlink(moved.c_str(), table.c_str()), 0);
  try {
    rig.engine().load(ckpt);
    ADD_FAILURE() << "loaded a layer table through a link";
  } catch (const IoError& e) {
    EXPECT_EQ(e.status().path(), table) << e.what();
  }
  std::filesystem::remove(table);
  ASSERT_EQ(::mkfifo(table.c_str(), 0600), 0);
  auto load = std::async(std::launch::async, [&]() -> std::string {
    try {
      rig.engine().load(ckpt);
    } catch (const IoError& e) {
      return e.status().path();
    }
    return "loaded";
  });
  if (load.wait_for(std::chrono::seconds(10)) == std::future_status::timeout) {
    ADD_FAILURE() << "load blocked on a FIFO";
    const int fd = ::open(table.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC);  // let it return
    if (fd >= 0) ::close(fd);
  }
  EXPECT_EQ(load.get(), table);
  std::filesystem::remove(table);
  std::filesystem::rename(moved, table);
  rig.engine().load(ckpt);
  EXPECT_TRUE(std::filesystem::is_empty(dir.file("param")));
  EXPECT_TRUE(std::filesystem::is_empty(dir.file("opt")));
}

// One owner per checkpoint directory, engines included: a second engine's save and load fail
// at once naming the directory and the holder's pid; the first one's checkpoint stays whole.
TEST(OffloadEngine, ASecondEngineOnTheCheckpointDirectoryFailsNamingTheHolder) {
  test::TestDir dir;
  const std::string ckpt = dir.subdir("ckpt");
  std::vector<std::vector<float>> saved;
  EngineRig b;
  b.make(test::engine_config(OffloadDevice::kCpu, OffloadDevice::kCpu, dir));
  b.init_weights();
  {
    EngineRig a;
    a.make(test::engine_config(OffloadDevice::kCpu, OffloadDevice::kCpu, dir));
    a.init_weights();
    a.iteration(1);
    a.engine().save(ckpt);
    saved = a.masters();
    const std::string holder = "in use by zinf process " + std::to_string(::getpid());
    for (const bool save : {true, false}) {
      try {
        save ? b.engine().save(ckpt) : b.engine().load(ckpt);
        ADD_FAILURE() << (save ? "save" : "load") << " into a directory in use";
      } catch (const IoError& e) {
        EXPECT_EQ(e.status().path(), ckpt) << e.what();
        EXPECT_NE(std::string(e.what()).find(holder), std::string::npos) << e.what();
      }
    }
  }
  b.engine().load(ckpt);  // a is gone: b may take the directory
  EXPECT_EQ(master_diff(b.masters(), saved), "");
}

bool empty_dir(const std::string& path) { return std::filesystem::is_empty(path); }

// Builds an engine from `c`, expects UsageError `want`, and that neither NVMe directory got a
// file.
void expect_refused_before_any_file(EngineRig& rig, const EngineConfig& c,
                                    const std::string& want) {
  try {
    rig.make(c);
    ADD_FAILURE() << "no throw; expected: " << want;
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()), want);
  }
  EXPECT_TRUE(empty_dir(c.offload_param.nvme_path));
  EXPECT_TRUE(empty_dir(c.offload_optimizer.nvme_path));
}

TEST(OffloadEngine, LayerLargerThanTheBufferIsRefusedBeforeAnyFile) {
  test::TestDir dir;
  EngineRig rig;
  EngineConfig c = test::engine_config(OffloadDevice::kNvme, OffloadDevice::kNvme, dir);
  c.offload_param.buffer_size = 4096;
  expect_refused_before_any_file(rig, c,
                                 "OffloadEngine: layer 'l0' has 5000 elements, more than "
                                 "offload_param.buffer_size 4096; raise offload_param.buffer_size "
                                 "to at least 5000");
}

// What the optimizer refuses and what only a config built in code can contradict are refused
// before the parameter store makes its files, as the config's own checks are.
TEST(OffloadEngine, OptimizerRefusalsAndContradictionsComeBeforeAnyFile) {
  test::TestDir dir;
  EngineRig rig;
  EngineConfig c = test::engine_config(OffloadDevice::kNvme, OffloadDevice::kNvme, dir);
  c.optimizer.hyper.lr = -1;
  expect_refused_before_any_file(rig, c,
                                 "OffloadedOptimizer: lr must be in [0, 3.4028235e+38], got -1");
  c = test::engine_config(OffloadDevice::kNvme, OffloadDevice::kNvme, dir);
  c.zero_stage = 2;
  expect_refused_before_any_file(
      rig, c,
      "OffloadEngine: zero_optimization.offload_param.device: parameter "
      "offload (\"nvme\") needs zero_optimization.stage 3, but stage is 2");
}

// A config notice (an old key name read as the new one) reaches the log at the default level,
// so a user sees it without asking for more output.
TEST(OffloadEngine, ConfigNoticesAreLoggedAtTheDefaultLevel) {
  test::TestDir dir;
  EngineRig rig;
  EngineConfig c = test::engine_config(OffloadDevice::kCpu, OffloadDevice::kCpu, dir);
  c.notices = parse_config(R"({"aio": {"thread_count": 3}})").notices;
  ASSERT_EQ(c.notices.size(), 1u);
  std::vector<std::string> lines;
  {
    test::LogCapture log(LogLevel::kNotice);  // the default (tests may run with ZINF_LOG_LEVEL set)
    rig.make(c);
    lines = log.lines();
  }
  EXPECT_NE(std::find(lines.begin(), lines.end(), "notice: config: " + c.notices[0]), lines.end())
      << testing::PrintToString(lines);
}

TEST(OffloadEngine, PinnedBudgetTooSmallNamesTheSmallestThatWorks) {
  test::TestDir dir;
  EngineRig rig;
  EngineConfig c = test::engine_config(OffloadDevice::kNvme, OffloadDevice::kCpu, dir);
  c.offload_optimizer.buffer_count = 4;
  c.zinf.prefetch_depth = 2;
  c.zinf.pinned_budget_bytes = 1000;
  c.zinf.grad_staging_buffers = 0;  // host gradients only (DeviceGradients tests the staging)
  const std::vector<LayerSpec> one = {{"w", 2048, ElementType::kBF16}};
  // Optimizer (cpu tier): 2048 x 12 bytes of state + 4 copy-out staging buffers of 4096;
  // parameters: (depth 2 + 2) x 4096 bytes of staging.
  try {
    rig.make(c, one);
    ADD_FAILURE() << "no throw";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(),
                 "OffloadEngine: zinf.pinned_budget_bytes 1000 cannot hold the "
                 "optimizer's 40960 bytes plus the parameter staging's 16384 bytes; the "
                 "smallest budget that works is 57344");
  }
  EXPECT_TRUE(empty_dir(c.offload_param.nvme_path));
  c.zinf.pinned_budget_bytes = 57343;
  EXPECT_THROW(rig.make(c, one), UsageError);
  EXPECT_TRUE(empty_dir(c.offload_param.nvme_path));
  c.zinf.pinned_budget_bytes = 57344;
  rig.make(c, one);
  EXPECT_EQ(rig.engine().stats().pinned_bytes, 57344u);
}

TEST(OffloadEngine, NvmeWithoutAPathIsRefused) {
  test::TestDir dir;
  EngineRig rig;
  EngineConfig c = test::engine_config(OffloadDevice::kNvme, OffloadDevice::kCpu, dir);
  c.offload_param.nvme_path.clear();
  try {
    rig.make(c);
    ADD_FAILURE() << "no throw";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(),
                 "OffloadEngine: zero_optimization.offload_param.nvme_path: device is "
                 "\"nvme\" but no NVMe directory is given (set "
                 "zero_optimization.offload_param.nvme_path or zinf.nvme_paths)");
  }
  c = test::engine_config(OffloadDevice::kCpu, OffloadDevice::kNvme, dir);
  c.offload_optimizer.nvme_path.clear();
  try {
    rig.make(c);
    ADD_FAILURE() << "no throw";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(),
                 "OffloadEngine: zero_optimization.offload_optimizer.nvme_path: device "
                 "is \"nvme\" but no NVMe directory is given (set "
                 "zero_optimization.offload_optimizer.nvme_path or zinf.nvme_paths)");
  }
}

TEST(OffloadEngine, RefusesMisuse) {
  test::TestDir dir;
  EngineRig rig;
  rig.make(test::engine_config(OffloadDevice::kNvme, OffloadDevice::kCpu, dir));
  auto expect_usage = [](auto&& f, const std::string& want) {
    try {
      f();
      ADD_FAILURE() << "no throw: " << want;
    } catch (const UsageError& e) {
      EXPECT_EQ(std::string(e.what()), want);
    }
  };
  expect_usage(
      [&] { (void)rig.engine().fetch(0); },
      "OffloadEngine::fetch: layer 'l0' has no weights yet (set_master_weights or load first)");
  rig.init_weights();
  expect_usage([&] { (void)rig.engine().fetch(9); },
               "OffloadEngine::fetch: layer 9 out of range (4 layers)");
  (void)rig.engine().fetch(0);
  expect_usage([&] { (void)rig.engine().fetch(0); },
               "OffloadEngine::fetch: layer 'l0' is already fetched (release it first)");
  std::vector<float> g(5000, 0.0f);
  expect_usage([&] { rig.engine().set_gradients(0, adam::GradView::f32(g)); },
               "OffloadEngine::set_gradients: layer 'l0' is fetched (release it first)");
  expect_usage([&] { (void)rig.engine().step(); },
               "OffloadEngine::step: layer 'l0' is still fetched (release it first)");
  rig.engine().release(0);
  expect_usage([&] { rig.engine().release(0); },
               "OffloadEngine::release: layer 'l0' is not fetched");
  rig.engine().set_gradients(0, adam::GradView::f32(g));
  expect_usage([&] { rig.engine().set_gradients(0, adam::GradView::f32(g)); },
               "OffloadEngine::set_gradients: layer 'l0' already has gradients in this step");
  expect_usage([&] { (void)rig.engine().fetch(0); },
               "OffloadEngine::fetch: layer 'l0' has its gradients handed in for this step; fetch "
               "it after step()");
  expect_usage([&] { rig.engine().save(dir.subdir("x")); },
               "OffloadEngine::save inside a step (gradients were handed in; call step() first)");
  std::vector<float> short_g(3, 0.0f);
  expect_usage([&] { rig.engine().set_gradients(1, adam::GradView::f32(short_g)); },
               "OffloadEngine::set_gradients: layer 'l1' has 4103 elements, got 3 gradients");
  adam::GradView wide = adam::GradView::f32(g);
  wide.dtype = ElementType::kF64;
  expect_usage([&] { rig.engine().set_gradients(1, wide); },
               "OffloadEngine::set_gradients: gradients: element type fp64 is not a buffer type "
               "(fp32, bf16 or fp16)");
  (void)rig.engine().step();
  EXPECT_EQ(rig.fetch_bits(0), rig.expected_bits(0));
  EXPECT_EQ(rig.fetch_bits(1), rig.expected_bits(1));
}

// set_hyper with a non-finite or out-of-range value used to be accepted; the next step then
// failed inside the pipeline and, with the optimizer state in host memory (its only copy),
// left the engine failed. Refused at the call, it changes nothing: the next step gives exactly
// the masters of a run that never made the call.
TEST(OffloadEngine, RefusedSetHyperLeavesTheEngineUsableAndItsStateIntact) {
  for (Tiers tiers : {Tiers{OffloadDevice::kNone, OffloadDevice::kCpu},
                      Tiers{OffloadDevice::kCpu, OffloadDevice::kNvme}}) {
    SCOPED_TRACE(std::string(offload_device_name(tiers.second)));
    const auto reference = train(tiers, 2);
    test::TestDir dir;
    EngineRig rig;
    rig.make(test::engine_config(tiers.first, tiers.second, dir));
    rig.init_weights();
    rig.iteration(1);
    const adam::AdamParams before = rig.engine().hyper();
    const std::vector<std::pair<const char*, void (*)(adam::AdamParams&)>> bad = {
        {"lr", [](adam::AdamParams& h) { h.lr = INFINITY; }},
        {"lr", [](adam::AdamParams& h) { h.lr = NAN; }},
        {"lr", [](adam::AdamParams& h) { h.lr = -1e-3; }},
        {"beta1", [](adam::AdamParams& h) { h.beta1 = 1.0; }},
        {"beta2", [](adam::AdamParams& h) { h.beta2 = NAN; }},
        {"eps", [](adam::AdamParams& h) { h.eps = INFINITY; }},
        {"eps", [](adam::AdamParams& h) { h.eps = NAN; }},
        {"eps", [](adam::AdamParams& h) { h.eps = 0; }},
        {"weight_decay", [](adam::AdamParams& h) { h.weight_decay = INFINITY; }},
        {"weight_decay", [](adam::AdamParams& h) { h.weight_decay = NAN; }},
        {"grad_scale", [](adam::AdamParams& h) { h.grad_scale = INFINITY; }},
        {"grad_scale", [](adam::AdamParams& h) { h.grad_scale = 0; }},
    };
    for (const auto& [field, spoil] : bad) {
      adam::AdamParams h = before;
      spoil(h);
      try {
        rig.engine().set_hyper(h);
        ADD_FAILURE() << "set_hyper accepted a bad " << field;
      } catch (const UsageError& e) {
        EXPECT_EQ(std::string(e.what()).rfind(
                      std::string("OffloadedOptimizer: ") + field + " must be ", 0),
                  0u)
            << e.what();
      }
      EXPECT_EQ(rig.engine().hyper().lr, before.lr);
      EXPECT_EQ(rig.engine().hyper().eps, before.eps);
    }
    rig.iteration(2);
    EXPECT_EQ(rig.engine().stats().last_step.step, 2u);
    EXPECT_EQ(master_diff(rig.masters(), reference), "");
  }
}

// ---- Hyper-parameters per layer -------------------------------------------------------------

adam::AdamParams config_hyper() {
  test::TestDir dir;
  return test::engine_config(OffloadDevice::kCpu, OffloadDevice::kCpu, dir).optimizer.hyper;
}

// engine_layers() as a trainer declares them: l1 with a stronger decay, l2 (a norm) without.
std::vector<LayerSpec> layers_with_own_hyper() {
  auto layers = test::engine_layers();
  adam::AdamParams l1 = config_hyper();
  l1.weight_decay = 0.1;
  layers[1].hyper = l1;
  adam::AdamParams l2 = config_hyper();
  l2.weight_decay = 0;
  layers[2].hyper = l2;
  return layers;
}

bool same_hyper(const adam::AdamParams& a, const adam::AdamParams& b) {
  return a.lr == b.lr && a.beta1 == b.beta1 && a.beta2 == b.beta2 && a.eps == b.eps &&
         a.weight_decay == b.weight_decay && a.grad_scale == b.grad_scale &&
         a.bias_correction == b.bias_correction && a.mode == b.mode;
}

TEST(OffloadEngine, EachLayerStepsWithItsOwnHyperParameters) {
  const auto layers = layers_with_own_hyper();
  auto own = [&](std::size_t l, std::uint64_t) { return layers[l].hyper.value_or(config_hyper()); };
  const auto want = test::plain_masters(layers, own, kSteps);
  // The sets matter: one set for every layer gives other masters.
  ASSERT_NE(master_diff(want, test::plain_masters(
                                  layers, [](std::size_t, std::uint64_t) { return config_hyper(); },
                                  kSteps)),
            "");
  for (Tiers tiers : {Tiers{OffloadDevice::kNone, OffloadDevice::kCpu},
                      Tiers{OffloadDevice::kNvme, OffloadDevice::kNvme}}) {
    SCOPED_TRACE(std::string(offload_device_name(tiers.first)) + "/" +
                 std::string(offload_device_name(tiers.second)));
    test::TestDir dir;
    EngineRig rig;
    rig.make(test::engine_config(tiers.first, tiers.second, dir), layers);
    EXPECT_TRUE(same_hyper(rig.engine().hyper(), config_hyper()));
    for (std::size_t l = 0; l < layers.size(); ++l) {
      EXPECT_TRUE(same_hyper(rig.engine().hyper(l), own(l, 1))) << "layer " << l;
    }
    rig.init_weights();
    for (std::uint64_t t = 1; t <= kSteps; ++t) rig.iteration(t);
    EXPECT_EQ(master_diff(rig.masters(), want), "");
  }
}

TEST(OffloadEngine, SetHyperOfOneLayerChangesOnlyThatLayer) {
  const auto layers = test::engine_layers();
  test::TestDir dir;
  EngineRig rig;
  rig.make(test::engine_config(OffloadDevice::kCpu, OffloadDevice::kNvme, dir));
  rig.init_weights();
  rig.iteration(1);
  adam::AdamParams norm = config_hyper();
  norm.weight_decay = 0;
  norm.lr = 2e-2;
  rig.engine().set_hyper(2, norm);
  EXPECT_TRUE(same_hyper(rig.engine().hyper(2), norm));
  for (std::size_t l : {0, 1, 3}) {
    EXPECT_TRUE(same_hyper(rig.engine().hyper(l), config_hyper())) << "layer " << l;
  }
  EXPECT_TRUE(same_hyper(rig.engine().hyper(), config_hyper()));

  // Refused: an unknown layer, a bad value (naming the layer and the field). Neither changes
  // anything: the masters below are those of a run that never made the calls.
  auto expect_usage = [](auto&& f, const std::string& want) {
    try {
      f();
      ADD_FAILURE() << "no throw: " << want;
    } catch (const UsageError& e) {
      EXPECT_EQ(std::string(e.what()).rfind(want, 0), 0u) << e.what();
    }
  };
  expect_usage([&] { rig.engine().set_hyper(4, norm); },
               "OffloadEngine::set_hyper: layer 4 out of range (4 layers)");
  expect_usage([&] { (void)rig.engine().hyper(4); },
               "OffloadEngine::hyper: layer 4 out of range (4 layers)");
  adam::AdamParams bad = norm;
  bad.eps = 0;
  expect_usage([&] { rig.engine().set_hyper(1, bad); },
               "OffloadEngine::set_hyper: layer 'l1': eps must be ");
  EXPECT_TRUE(same_hyper(rig.engine().hyper(1), config_hyper()));

  rig.iteration(2);
  rig.iteration(3);
  EXPECT_EQ(master_diff(rig.masters(), test::plain_masters(
                                           layers,
                                           [&](std::size_t l, std::uint64_t t) {
                                             return l == 2 && t >= 2 ? norm : config_hyper();
                                           },
                                           3)),
            "");

  // Inside a step (gradients handed in) the sets are fixed.
  std::vector<float> g(layers[0].numel, 1e-3f);
  rig.engine().set_gradients(0, adam::GradView::f32(g));
  expect_usage([&] { rig.engine().set_hyper(0, norm); },
               "OffloadEngine::set_hyper inside a step (call step() first)");
  EXPECT_TRUE(same_hyper(rig.engine().hyper(0), config_hyper()));
  (void)rig.engine().step();
}

TEST(OffloadEngine, ABadLayerHyperIsRefusedAtConstructionNamingTheLayer) {
  test::TestDir dir;
  auto layers = test::engine_layers();
  adam::AdamParams h = config_hyper();
  h.lr = -1;
  layers[3].hyper = h;
  EngineRig rig;
  try {
    rig.make(test::engine_config(OffloadDevice::kNvme, OffloadDevice::kNvme, dir), layers);
    ADD_FAILURE() << "constructed with lr -1 for a layer";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()),
              "OffloadEngine: layer 'l3' hyper: lr must be in [0, 3.4028235e+38], got -1");
  }
  // Before any file: the NVMe directories are still empty.
  for (const char* sub : {"param", "opt"}) {
    EXPECT_TRUE(std::filesystem::is_empty(dir.subdir(sub))) << sub;
  }
}

TEST(OffloadEngine, SaveLoadKeepsEachLayersHyperParametersAndResumesBitwise) {
  const auto layers = layers_with_own_hyper();
  adam::AdamParams l0 = config_hyper();
  l0.lr = 0.1234567;  // a value with a long binary expansion survives exactly
  l0.mode = adam::AdamMode::kAdam;
  test::TestDir dir;
  const std::string ckpt = dir.subdir("ckpt");
  std::vector<std::vector<float>> uninterrupted;
  {
    EngineRig rig;
    rig.make(test::engine_config(OffloadDevice::kNvme, OffloadDevice::kCpu, dir), layers);
    rig.init_weights();
    rig.iteration(1);
    rig.engine().set_hyper(0, l0);
    rig.iteration(2);
    rig.engine().save(ckpt);
    rig.iteration(3);
    uninterrupted = rig.masters();
  }
  // Loaded into an engine built without sets of its own and another learning rate: the
  // checkpoint's sets replace its.
  test::TestDir dir2;
  EngineConfig c = test::engine_config(OffloadDevice::kNvme, OffloadDevice::kCpu, dir2);
  c.optimizer.hyper.lr = 0.5;
  EngineRig rig;
  rig.make(c);
  rig.engine().load(ckpt);
  EXPECT_TRUE(same_hyper(rig.engine().hyper(), config_hyper()));
  EXPECT_TRUE(same_hyper(rig.engine().hyper(0), l0));
  EXPECT_TRUE(same_hyper(rig.engine().hyper(1), *layers[1].hyper));
  EXPECT_TRUE(same_hyper(rig.engine().hyper(2), *layers[2].hyper));
  EXPECT_TRUE(same_hyper(rig.engine().hyper(3), config_hyper()));
  rig.iteration(3);
  EXPECT_EQ(master_diff(rig.masters(), uninterrupted), "");
  EXPECT_EQ(master_diff(uninterrupted, test::plain_masters(
                                           layers,
                                           [&](std::size_t l, std::uint64_t t) {
                                             return l == 0 && t >= 2
                                                        ? l0
                                                        : layers[l].hyper.value_or(config_hyper());
                                           },
                                           3)),
            "");
}

// "" + "/LATEST" is a path at the root of the file system: an empty directory is misuse.
TEST(OffloadEngine, EmptyCheckpointDirectoryIsRefused) {
  test::TestDir dir;
  EngineRig rig;
  rig.make(test::engine_config(OffloadDevice::kNone, OffloadDevice::kCpu, dir));
  rig.init_weights();
  for (const bool save : {true, false}) {
    try {
      save ? rig.engine().save("") : rig.engine().load("");
      ADD_FAILURE() << (save ? "save" : "load") << "(\"\") was accepted";
    } catch (const UsageError& e) {
      EXPECT_EQ(std::string(e.what()), std::string("OffloadEngine::") + (save ? "save" : "load") +
                                           ": the checkpoint directory is empty (\"\"); give a "
                                           "directory");
    }
  }
  rig.iteration(1);  // still usable
  EXPECT_EQ(rig.engine().stats().steps, 1u);
}

// The drive-slowdown notice (zinf.rate_notice_*). The drive is the fault plan's: every piece
// waits kPieceDelay, so a step's rate is set by those waits and not by the test machine's disk
// (a shared disk once took 10x longer for three steps in a row and the watch, rightly, spoke);
// from step 4 to 7 the optimizer's writes wait 10 times longer. The reference is the median of
// the first 3 steps. Counts, never timings, are asserted: exactly one slowdown notice naming
// the directory, one recovery notice once the slow writes stop (the watch is silent after
// it), and none at all without them.
namespace {

constexpr auto kPieceDelay = std::chrono::milliseconds(8);

// A delay of kPieceDelay on every read and write piece.
swap::FaultRule every_piece_waits() {
  swap::FaultRule wait;
  wait.kind = swap::FaultKind::kDelay;
  wait.times = ~std::uint64_t{0};
  wait.delay = kPieceDelay;
  return wait;
}

// The lines of the notice about `what`: "writes", "reads", or "" for both.
std::vector<std::string> rate_notices(const std::vector<std::string>& lines,
                                      const std::string& what) {
  std::vector<std::string> out;
  for (const auto& l : lines) {
    if (l.find("OffloadEngine: NVMe optimizer " + what) != std::string::npos) out.push_back(l);
  }
  return out;
}

// Optimizer write pieces issued by set_master_weights for every layer and by each step: the
// first is `init`, each step `per_step` (the same layout every step).
struct WriteCounts {
  std::uint64_t init = 0;
  std::uint64_t per_step = 0;
};

WriteCounts count_optimizer_writes(const EngineConfig& c) {
  swap::FaultRule count;  // a delay of 0 on every write: counts them, changes nothing
  count.kind = swap::FaultKind::kDelay;
  count.op = swap::IoOp::kWrite;
  count.times = ~std::uint64_t{0};
  auto plan = std::make_shared<swap::FaultPlan>(std::vector<swap::FaultRule>{count});
  EngineRig rig;
  rig.make(c, {.param = nullptr, .optimizer = plan});
  rig.init_weights();
  WriteCounts w;
  w.init = plan->fired(0);
  rig.iteration(1, false);
  const std::uint64_t one = plan->fired(0);
  rig.iteration(2, false);
  w.per_step = plan->fired(0) - one;
  EXPECT_EQ(one - w.init, w.per_step) << "steps write different numbers of pieces";
  return w;
}

}  // namespace

TEST(OffloadEngine, SlowDriveGivesOneNoticeAndOneOnRecovery) {
  test::TestDir dir;
  EngineConfig c = test::engine_config(OffloadDevice::kCpu, OffloadDevice::kNvme, dir);
  // A quarter of the reference, not the default half: a shared test machine's healthy steps
  // vary by more than 2x now and then, never three in a row by 4x.
  c.zinf.rate_notice_share = 0.25;
  c.zinf.rate_notice_steps = 3;
  const WriteCounts w = count_optimizer_writes(c);
  ASSERT_GT(w.per_step, 0u);

  swap::FaultRule slow;
  slow.kind = swap::FaultKind::kDelay;
  slow.op = swap::IoOp::kWrite;
  slow.delay = 10 * kPieceDelay;
  slow.first_match = w.init + 3 * w.per_step;  // steps 4, 5, 6, 7 are slow
  slow.times = 4 * w.per_step;
  // The first rule that fires decides a piece: the slow one, else the wait every piece has.
  auto plan =
      std::make_shared<swap::FaultPlan>(std::vector<swap::FaultRule>{slow, every_piece_waits()});
  test::LogCapture log;
  EngineRig rig;
  rig.make(c, {.param = nullptr, .optimizer = plan});
  rig.init_weights();
  // 13 healthy steps after the slow ones: the recovery needs 3 in a row at or above the share,
  // and a loaded machine may spoil a few.
  for (std::uint64_t t = 1; t <= 20; ++t) rig.iteration(t);
  EXPECT_EQ(plan->fired(0), 4 * w.per_step);
  // Reads may be noticed too (they queue behind the slowed writes, as on a drive busy
  // flushing its cache); the writes are what this asserts.
  const auto notices = rate_notices(log.lines(), "writes");
  ASSERT_EQ(notices.size(), 2u) << ::testing::PrintToString(log.lines());
  const std::string where = c.offload_optimizer.nvme_path;
  EXPECT_EQ(notices[0].rfind(
                "notice: OffloadEngine: NVMe optimizer writes to " + where + " slowed down: ", 0),
            0u)
      << notices[0];
  EXPECT_NE(notices[0].find(" GB/s in the last 3 steps, below 25% of "), std::string::npos)
      << notices[0];
  EXPECT_NE(notices[0].find(" GB/s (median of the first steps); the drive's write cache may be "
                            "full or it is throttling (hot)"),
            std::string::npos)
      << notices[0];
  EXPECT_EQ(notices[1].rfind(
                "notice: OffloadEngine: NVMe optimizer writes to " + where + " recovered: ", 0),
            0u)
      << notices[1];
}

TEST(OffloadEngine, HealthyDriveGivesNoRateNotice) {
  test::TestDir dir;
  EngineConfig c = test::engine_config(OffloadDevice::kCpu, OffloadDevice::kNvme, dir);
  c.zinf.rate_notice_share = 0.25;
  auto plan = std::make_shared<swap::FaultPlan>(std::vector<swap::FaultRule>{every_piece_waits()});
  test::LogCapture log;
  EngineRig rig;
  rig.make(c, {.param = nullptr, .optimizer = plan});
  rig.init_weights();
  for (std::uint64_t t = 1; t <= 10; ++t) rig.iteration(t);
  EXPECT_GT(plan->fired(0), 0u);
  EXPECT_TRUE(rate_notices(log.lines(), "").empty()) << ::testing::PrintToString(log.lines());
}

// Drive wear (zinf.tbw_tb): one start-up notice from the layers (12 bytes per element of
// optimizer state: 12 x 13499 = 161,988 bytes a step; 1 TB / 161,988 B = 6,173,296.8 steps, 1%
// every 61,733), and one after step 4 with what steps 2-4 wrote (the padded records, as the
// stats count them) at the measured rate. Their days depend on the time, so only the text
// around them is asserted.
TEST(OffloadEngine, WearNoticesFromTheRatedEndurance) {
  test::TestDir dir;
  EngineConfig c = test::engine_config(OffloadDevice::kCpu, OffloadDevice::kNvme, dir);
  c.zinf.tbw_tb = 1;
  test::LogCapture log;
  EngineRig rig;
  rig.make(c);
  rig.init_weights();
  std::vector<std::string> wear;
  auto wear_lines = [&] {
    wear.clear();
    for (const auto& l : log.lines()) {
      if (l.find("OffloadEngine: drive wear: ") != std::string::npos) wear.push_back(l);
    }
  };
  wear_lines();
  const std::string where = c.offload_optimizer.nvme_path;
  ASSERT_EQ(wear.size(), 1u) << ::testing::PrintToString(log.lines());
  EXPECT_EQ(wear[0], "notice: OffloadEngine: drive wear: each step writes about 0.000162 GB to " +
                         where +
                         "; the rated 1 TB of endurance lasts 6173297 steps (1% every 61733 "
                         "steps); days at the step rate follow after the first steps");
  rig.iteration(1);
  const std::uint64_t after_first = rig.engine().stats().optimizer_bytes_written;
  for (std::uint64_t t = 2; t <= 4; ++t) rig.iteration(t);
  const std::uint64_t per_step = (rig.engine().stats().optimizer_bytes_written - after_first) / 3;
  for (std::uint64_t t = 5; t <= 6; ++t) rig.iteration(t);
  wear_lines();
  ASSERT_EQ(wear.size(), 2u) << ::testing::PrintToString(log.lines());
  char gb[32];
  std::snprintf(gb, sizeof gb, "%.3g", static_cast<double>(per_step) / 1e9);
  EXPECT_EQ(wear[1].rfind("notice: OffloadEngine: drive wear: " + std::string(gb) +
                              " GB written per step to " + where + " at ",
                          0),
            0u)
      << wear[1];
  EXPECT_NE(wear[1].find(" s per step (steps 2-4), "), std::string::npos) << wear[1];
  EXPECT_NE(wear[1].find(" TB a day: the rated 1 TB lasts "), std::string::npos) << wear[1];
  EXPECT_NE(wear[1].find(" days of training (1% every "), std::string::npos) << wear[1];

  // Without tbw_tb, or with nothing on NVMe, there is no wear notice.
  test::LogCapture quiet;
  EngineRig none;
  c.zinf.tbw_tb = 0;
  none.make(c);
  none.init_weights();
  for (std::uint64_t t = 1; t <= 5; ++t) none.iteration(t);
  EngineRig cpu;
  EngineConfig cc = test::engine_config(OffloadDevice::kCpu, OffloadDevice::kCpu, dir);
  cc.zinf.tbw_tb = 1;
  cpu.make(cc);
  cpu.init_weights();
  for (std::uint64_t t = 1; t <= 5; ++t) cpu.iteration(t);
  for (const auto& l : quiet.lines()) EXPECT_EQ(l.find("drive wear"), std::string::npos) << l;
}

}  // namespace
}  // namespace zinf::offload
