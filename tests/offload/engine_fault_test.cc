// SPDX-License-Identifier: Apache-2.0
// OffloadEngine under injected I/O faults: a failed parameter read surfaces at that layer's
// fetch with key, file, offset and length and a later fetch reads it again; a failed
// write-back (optimizer state or the parameter copy-out) makes step() throw it and every later
// call throw EngineFailed quoting it. With the default config, a byte flipped in a swap file
// (optimizer state, or a layer's parameters) is refused as kCorrupt: no fetch returns it, no
// step trains on it, no checkpoint stores it.
#include <sys/wait.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "engine_test_util.h"
#include "support/child_process.h"
#include "support/corrupt_swap_file.h"
#include "support/tool_process.h"
#include "zinf/common/error.h"
#include "zinf/offload/engine.h"
#include "zinf/offload/testing.h"
#include "zinf/swap/crc32c.h"
#include "zinf/swap/fault_injection.h"

namespace zinf::offload {
namespace {

using test::EngineRig;

std::shared_ptr<swap::FaultPlan> plan_of(swap::FaultRule rule) {
  return std::make_shared<swap::FaultPlan>(std::vector<swap::FaultRule>{rule});
}

TEST(OffloadEngineFault, FailedParameterReadSurfacesAtFetchAndIsRetried) {
  test::TestDir dir;
  EngineRig rig;
  EngineConfig c = test::engine_config(OffloadDevice::kNvme, OffloadDevice::kCpu, dir);
  swap::FaultRule eio;
  eio.kind = swap::FaultKind::kError;
  eio.op = swap::IoOp::kRead;
  eio.err = EIO;
  auto plan = plan_of(eio);  // the first read: layer 0's, on demand (tracing)
  rig.make(c, {.param = plan, .optimizer = nullptr});
  rig.init_weights();
  try {
    (void)rig.engine().fetch(0);
    ADD_FAILURE() << "no throw";
  } catch (const IoError& e) {
    const Status& s = e.status();
    EXPECT_EQ(s.sys_errno(), EIO);
    EXPECT_EQ(s.path().rfind(c.offload_param.nvme_path + "/", 0), 0u) << s.path();
    EXPECT_EQ(s.length(), 12288u);  // 5000 x 2 bytes, padded to 4096
    const std::string text = e.what();
    EXPECT_NE(text.find("swap_in of key 'l0': read failed: " + s.path() +
                        " offset=" + std::to_string(s.offset()) + " length=12288"),
              std::string::npos)
        << text;
  }
  EXPECT_EQ(plan->injected_errors(), 1u);
  // The engine is usable: the next fetch reads the layer again and gets every byte.
  EXPECT_EQ(rig.fetch_bits(0), rig.expected_bits(0));
  rig.iteration(1);
  rig.iteration(2);
}

// `plan` in the parameter store's I/O engine, or in the optimizer's.
test_hooks::EngineFaults faults_on(bool param_plan, std::shared_ptr<swap::FaultPlan> plan) {
  test_hooks::EngineFaults faults;
  (param_plan ? faults.param : faults.optimizer) = std::move(plan);
  return faults;
}

// Counts the write pieces of setting the weights (rule that never changes anything), so that
// a second run can fail the first write after them: the step's first write-back.
std::uint64_t setup_writes(bool param_plan, OffloadDevice p, OffloadDevice o) {
  test::TestDir dir;
  EngineRig rig;
  EngineConfig c = test::engine_config(p, o, dir);
  swap::FaultRule count;
  count.kind = swap::FaultKind::kDelay;
  count.op = swap::IoOp::kWrite;
  count.times = 1u << 30;
  auto plan = plan_of(count);
  rig.make(c, faults_on(param_plan, plan));
  rig.init_weights();
  return plan->injected();
}

void expect_write_back_failure(bool param_plan) {
  const OffloadDevice p = OffloadDevice::kNvme;
  const OffloadDevice o = OffloadDevice::kNvme;
  const std::uint64_t skip = setup_writes(param_plan, p, o);
  test::TestDir dir;
  EngineRig rig;
  EngineConfig c = test::engine_config(p, o, dir);
  swap::FaultRule eio;
  eio.kind = swap::FaultKind::kError;
  eio.op = swap::IoOp::kWrite;
  eio.first_match = skip;
  eio.err = EIO;
  auto plan = plan_of(eio);
  rig.make(c, faults_on(param_plan, plan));
  rig.init_weights();
  std::string first;
  try {
    rig.iteration(1, /*check=*/false);
    ADD_FAILURE() << "no throw";
  } catch (const IoError& e) {
    first = e.what();
    EXPECT_EQ(e.status().sys_errno(), EIO);
    EXPECT_GT(e.status().length(), 0u);
    const std::string dirpath =
        param_plan ? c.offload_param.nvme_path : c.offload_optimizer.nvme_path;
    EXPECT_EQ(e.status().path().rfind(dirpath + "/", 0), 0u) << e.status().path();
    EXPECT_NE(first.find("swap_out of key '"), std::string::npos) << first;
    EXPECT_NE(first.find(" offset=" + std::to_string(e.status().offset()) + " length="),
              std::string::npos)
        << first;
  }
  EXPECT_EQ(plan->injected_errors(), 1u);
  ASSERT_FALSE(first.empty());
  auto expect_failed = [&](auto&& f) {
    try {
      f();
      ADD_FAILURE() << "no throw";
    } catch (const EngineFailed& e) {
      EXPECT_NE(std::string(e.what()).find(first), std::string::npos) << e.what();
    }
  };
  expect_failed([&] { (void)rig.engine().fetch(0); });
  expect_failed([&] { (void)rig.engine().step(); });
  std::vector<float> w(5000, 0.0f);
  expect_failed([&] { rig.engine().set_master_weights(0, w); });
  expect_failed([&] { rig.engine().save(dir.subdir("ckpt")); });
}

TEST(OffloadEngineFault, FailedOptimizerWriteBackFailsTheEngine) {
  expect_write_back_failure(false);
}

TEST(OffloadEngineFault, FailedParameterCopyOutFailsTheEngine) { expect_write_back_failure(true); }

// Checks that `e` is a swap store's corruption error caused by `flip` in the one file open
// under `dir`: kCorrupt, a path under `dir`, the stripe unit's offset and length, and the
// CRC32C written and read, both recomputed here from the file's bytes.
void expect_corrupt(const IoError& e, const std::string& dir, const test::FlippedByte& flip) {
  EXPECT_EQ(e.code(), ErrorCode::kCorrupt) << e.what();
  const Status& s = e.status();
  EXPECT_EQ(s.path().rfind(dir + "/", 0), 0u) << s.path();
  EXPECT_LE(s.offset(), flip.offset);
  ASSERT_LT(flip.offset, s.offset() + s.length()) << e.what();
  const std::vector<std::byte> read = test::read_swap_file(dir, s.offset(), s.length());
  std::vector<std::byte> written = read;
  written[flip.offset - s.offset()] = flip.before;
  char crcs[64];
  std::snprintf(crcs, sizeof crcs, "crc32c written 0x%08x, read 0x%08x", swap::crc32c(written),
                swap::crc32c(read));
  const std::string text = e.what();
  EXPECT_NE(text.find(" failed: " + s.path() + " offset=" + std::to_string(s.offset()) +
                      " length=" + std::to_string(s.length()) + ": checksum mismatch"),
            std::string::npos)
      << text;
  EXPECT_TRUE(text.ends_with(crcs)) << text << "\nexpected the end: " << crcs;
}

std::string latest(const std::string& ckpt) {
  std::ifstream in(ckpt + "/LATEST");
  std::string name;
  std::getline(in, name);
  return name;
}

// The default config verifies the optimizer state: after a byte of its swap file is flipped,
// save() refuses (kCorrupt) and LATEST still names the previous checkpoint, which loads back;
// the next step fails rather than train on it (the corrupt record is read after others were
// written back, so the engine is failed and refuses every later call quoting the corruption).
TEST(OffloadEngineFault, DefaultConfigRefusesAnOptimizerStateByteFlippedBetweenSteps) {
  test::TestDir dir;
  const std::string ckpt = dir.subdir("ckpt");
  EngineConfig c = test::engine_config(OffloadDevice::kCpu, OffloadDevice::kNvme, dir);
  EXPECT_TRUE(c.zinf.checksums) << "integrity is the default";
  std::vector<std::vector<float>> after1;
  {
    EngineRig rig;
    rig.make(c);
    rig.init_weights();
    rig.iteration(1);
    rig.engine().save(ckpt);
    after1 = rig.masters();
    const std::string good = latest(ckpt);
    rig.iteration(2);
    const float first_master = rig.masters()[0][0];
    // Byte 3 of the file: the exponent of layer l0's first master weight (its first record).
    const auto flip = test::flip_swap_file_byte(c.offload_optimizer.nvme_path, 3);
    std::uint32_t bits;
    std::memcpy(&bits, &first_master, 4);
    ASSERT_EQ(static_cast<std::uint32_t>(flip.before), bits >> 24) << "the flip missed the state";
    try {
      rig.engine().save(ckpt);
      ADD_FAILURE() << "a checkpoint was written from state that failed verification";
    } catch (const IoError& e) {
      expect_corrupt(e, c.offload_optimizer.nvme_path, flip);
    }
    EXPECT_EQ(latest(ckpt), good);
    std::string first;
    try {
      rig.iteration(3, /*check=*/false);
      ADD_FAILURE() << "step 3 trained on a corrupt swap file";
    } catch (const IoError& e) {
      first = e.what();
      expect_corrupt(e, c.offload_optimizer.nvme_path, flip);
    }
    ASSERT_FALSE(first.empty());
    for (int call = 0; call < 2; ++call) {
      try {
        if (call == 0) {
          (void)rig.engine().step();
        } else {
          rig.engine().save(ckpt);
        }
        ADD_FAILURE() << "call " << call << " ran on a failed engine";
      } catch (const EngineFailed& e) {
        EXPECT_EQ(e.cause().code(), ErrorCode::kCorrupt);
        EXPECT_NE(std::string(e.what()).find(first), std::string::npos) << e.what();
      }
    }
    EXPECT_EQ(latest(ckpt), good);
  }
  test::TestDir dir2;
  EngineRig rig;
  rig.make(test::engine_config(OffloadDevice::kCpu, OffloadDevice::kNvme, dir2));
  rig.engine().load(ckpt);
  EXPECT_EQ(rig.engine().stats().last_step.step, 0u);
  EXPECT_EQ(test::master_diff(rig.masters(), after1), "");
}

// The default config verifies the parameters: a byte flipped in the parameter swap file is
// refused at the layer's fetch (kCorrupt naming file, offset and both CRCs), every time, until
// the layer is rewritten.
TEST(OffloadEngineFault, DefaultConfigRefusesAParameterByteFlippedBeforeFetch) {
  test::TestDir dir;
  EngineRig rig;
  EngineConfig c = test::engine_config(OffloadDevice::kNvme, OffloadDevice::kCpu, dir);
  rig.make(c);
  rig.init_weights();
  const std::vector<std::uint16_t> want = rig.expected_bits(0);
  // Layer l0 is the file's first tensor: byte 1 is the sign and exponent of its first element.
  const auto flip = test::flip_swap_file_byte(c.offload_param.nvme_path, 1);
  ASSERT_EQ(static_cast<std::uint32_t>(flip.before), want[0] >> 8u) << "the flip missed layer l0";
  for (int attempt = 0; attempt < 2; ++attempt) {
    SCOPED_TRACE("attempt " + std::to_string(attempt));
    try {
      (void)rig.engine().fetch(0);
      ADD_FAILURE() << "a corrupt layer was fetched";
      rig.engine().release(0);
    } catch (const IoError& e) {
      expect_corrupt(e, c.offload_param.nvme_path, flip);
      EXPECT_NE(std::string(e.what()).find("swap_in of key 'l0' failed: "), std::string::npos)
          << e.what();
    }
  }
  // Rewriting the layer heals it; training goes on.
  std::vector<float> w(5000);
  rig.engine().read_master_weights(0, w);
  rig.engine().set_master_weights(0, w);
  EXPECT_EQ(rig.fetch_bits(0), want);
  rig.iteration(1);
  rig.iteration(2);
}

// The engine killed (SIGKILL, no chance to clean up) at random points of a run that trains and
// checkpoints every step: its NVMe directories hold nothing afterwards (the swap files have no
// name), and the checkpoint directory holds only what checkpoints are made of, loads into a
// new engine with exactly the masters of the steps it says, and is tidied by that engine's
// next save. The delays are seeded; ZINF_TEST_SEED replays them.
TEST(OffloadEngineFault, KilledAtRandomPointsLeavesOnlyALoadableCheckpoint) {
  const std::uint64_t seed = test::signal_test_seed();
  std::mt19937_64 rng(seed);
  for (int round = 0; round < 4; ++round) {
    const int delay_ms = std::uniform_int_distribution<int>(0, 120)(rng);
    SCOPED_TRACE("round " + std::to_string(round) + ", killed " + std::to_string(delay_ms) +
                 " ms after the first checkpoint (ZINF_TEST_SEED=" + std::to_string(seed) + ")");
    test::TestDir dir;
    const EngineConfig c = test::engine_config(OffloadDevice::kNvme, OffloadDevice::kNvme, dir);
    const std::string ckpt = dir.file("ckpt");
    test::Child child([&](const std::function<void()>& ready) {
      EngineRig rig;
      rig.make(c);
      rig.init_weights();
      for (std::uint64_t t = 1;; ++t) {
        rig.iteration(t, /*check=*/false);
        rig.engine().save(ckpt);
        if (t == 1) ready();
      }
    });
    ASSERT_TRUE(child.ready()) << "the child failed before its first checkpoint";
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    const int status = child.kill_and_reap();
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "status " << status;

    EXPECT_TRUE(std::filesystem::is_empty(c.offload_param.nvme_path));
    EXPECT_TRUE(std::filesystem::is_empty(c.offload_optimizer.nvme_path));
    // Only checkpoint material: LATEST, the layer table, version directories ("v..."), and at
    // most what the killed save left half written (".tmp" versions, ".zinf-tmp-" files).
    for (const auto& e : std::filesystem::directory_iterator(ckpt)) {
      const std::string n = e.path().filename().string();
      EXPECT_TRUE(n == "LATEST" || n == "zinf-engine-layers" || n.starts_with("v") ||
                  n.starts_with(".zinf-tmp-"))
          << "unexpected " << n;
    }
    EngineRig after;
    after.make(test::engine_config(OffloadDevice::kNvme, OffloadDevice::kNvme, dir));
    after.engine().load(ckpt);
    // The step a checkpoint holds is in its version's name, "v<12 digits>-...".
    std::string latest;
    std::ifstream(ckpt + "/LATEST") >> latest;
    ASSERT_GE(latest.size(), 13u) << latest;
    const std::uint64_t steps = std::stoull(latest.substr(1, 12));
    EXPECT_GE(steps, 1u);
    EngineRig ref;
    test::TestDir ref_dir;
    ref.make(test::engine_config(OffloadDevice::kNone, OffloadDevice::kNone, ref_dir));
    ref.init_weights();
    for (std::uint64_t t = 1; t <= steps; ++t) ref.iteration(t, /*check=*/false);
    EXPECT_EQ(test::master_diff(after.masters(), ref.masters()), "")
        << "after " << steps << " steps";
    after.engine().save(ckpt);
    for (const auto& e : std::filesystem::directory_iterator(ckpt)) {
      const std::string n = e.path().filename().string();
      EXPECT_FALSE(n.ends_with(".tmp") || n.starts_with(".zinf-tmp-")) << n << " was not reclaimed";
    }
  }
}

}  // namespace
}  // namespace zinf::offload
