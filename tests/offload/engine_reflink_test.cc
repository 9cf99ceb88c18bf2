// SPDX-License-Identifier: Apache-2.0
// OffloadEngine::save_async by reflink: with both tiers on NVMe, the engine's snapshot is a clone
// of the optimizer's records (optim's reflink_checkpoint_test covers the clone itself). Needs
// ZINF_TEST_REFLINK_DIR (scripts/test.sh: a loop-mounted XFS image); skips without it.
#include <string>

#include <gtest/gtest.h>

#include "engine_test_util.h"
#include "optimizer_test_util.h"
#include "support/test_dir.h"

namespace zinf::offload {
namespace {

using test::EngineRig;
using test::expect_same_checkpoint;
using test::read_file;

// The engine (both tiers on NVMe): its save_async snapshots by reflink, says so, and writes
// the bytes save() writes; "zinf": {"checkpoint_reflink": false} streams instead.
TEST(EngineReflink, SnapshotsByReflinkUnlessConfiguredNotTo) {
  std::string why;
  const std::string parent = test::reflink_test_dir(why);
  if (parent.empty()) GTEST_SKIP() << why;
  for (const bool reflink : {true, false}) {
    SCOPED_TRACE(reflink ? "checkpoint_reflink" : "checkpoint_reflink false");
    test::TestDir dir(parent);
    const std::string sync_dir = dir.subdir("sync");
    const std::string async_dir = dir.subdir("async");
    {
      test::EngineRig rig;
      EngineConfig c = test::engine_config(OffloadDevice::kNvme, OffloadDevice::kNvme, dir);
      c.zinf.checkpoint_reflink = reflink;
      rig.make(c);
      rig.init_weights();
      rig.iteration(1);
      rig.iteration(2);
      EXPECT_EQ(rig.engine().last_save_snapshot(), SaveSnapshot::kNone);
      rig.engine().save(sync_dir);
      rig.engine().save_async(async_dir);
      EXPECT_EQ(rig.engine().last_save_snapshot(),
                reflink ? SaveSnapshot::kReflink : SaveSnapshot::kStreamed);
      rig.iteration(3);
      rig.iteration(4);
      rig.engine().wait_save();
    }
    EXPECT_EQ(read_file(async_dir + "/zinf-engine-layers"),
              read_file(sync_dir + "/zinf-engine-layers"));
    expect_same_checkpoint(async_dir, sync_dir);
  }
}

}  // namespace
}  // namespace zinf::offload
