// SPDX-License-Identifier: Apache-2.0
// OffloadEngine under injected I/O faults: a failed parameter read surfaces at that layer's
// fetch with key, file, offset and length and a later fetch reads it again; a failed
// write-back (optimizer state or the parameter copy-out) makes step() throw it and every later
// call throw EngineFailed quoting it.
#include <cerrno>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engine_test_util.h"
#include "zinf/common/error.h"
#include "zinf/offload/engine.h"
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
  c.param_faults = plan_of(eio);  // the first read: layer 0's, on demand (tracing)
  rig.make(c);
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
    EXPECT_NE(text.find("swap_in of key 'l0': read failed: " + s.path() + " offset=" +
                        std::to_string(s.offset()) + " length=12288"),
              std::string::npos)
        << text;
  }
  EXPECT_EQ(c.param_faults->injected_errors(), 1u);
  // The engine is usable: the next fetch reads the layer again and gets every byte.
  EXPECT_EQ(rig.fetch_bits(0), rig.expected_bits(0));
  rig.iteration(1);
  rig.iteration(2);
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
  (param_plan ? c.param_faults : c.optimizer_faults) = plan;
  rig.make(c);
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
  (param_plan ? c.param_faults : c.optimizer_faults) = plan;
  rig.make(c);
  rig.init_weights();
  std::string first;
  try {
    rig.iteration(1, /*check=*/false);
    ADD_FAILURE() << "no throw";
  } catch (const IoError& e) {
    first = e.what();
    EXPECT_EQ(e.status().sys_errno(), EIO);
    EXPECT_GT(e.status().length(), 0u);
    const std::string dirpath = param_plan ? c.offload_param.nvme_path : c.offload_optimizer.nvme_path;
    EXPECT_EQ(e.status().path().rfind(dirpath + "/", 0), 0u) << e.status().path();
    EXPECT_NE(first.find("swap_out of key '"), std::string::npos) << first;
    EXPECT_NE(first.find(" offset=" + std::to_string(e.status().offset()) + " length="), std::string::npos)
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

TEST(OffloadEngineFault, FailedOptimizerWriteBackFailsTheEngine) { expect_write_back_failure(false); }

TEST(OffloadEngineFault, FailedParameterCopyOutFailsTheEngine) { expect_write_back_failure(true); }

}  // namespace
}  // namespace zinf::offload
