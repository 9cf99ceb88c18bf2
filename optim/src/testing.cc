// SPDX-License-Identifier: Apache-2.0
// The test hooks of zinf/optim/testing.h: they reach the optimizer's private state through the
// friend class optimizer.h names.
#include "zinf/optim/testing.h"

#include <utility>

#include "optimizer_impl.h"

namespace zinf::optim::test_hooks {

class OptimizerAccess {
 public:
  static void set_checkpoint_hook(OffloadedOptimizer& optimizer, CheckpointHook hook) {
    optimizer.impl_->checkpoint_hook = std::move(hook);
  }
};

void set_checkpoint_hook(OffloadedOptimizer& optimizer, CheckpointHook hook) {
  OptimizerAccess::set_checkpoint_hook(optimizer, std::move(hook));
}

}  // namespace zinf::optim::test_hooks
