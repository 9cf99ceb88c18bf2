// SPDX-License-Identifier: Apache-2.0
// The cpu state store: every record in the optimizer's pinned pool, where it is updated in
// place. A read completes at once and a slot is the record itself, so no byte is copied;
// there are no files, nothing to write back and no checksums to fold.
#include <memory>
#include <string>
#include <vector>

#include "state_store.h"

namespace zinf::optim {
namespace {

// Records worked on at once by set_params, read_state, save and load, and the step's window:
// with no I/O to overlap, a few are enough to keep the loops' order the ring's.
constexpr std::size_t kCpuWindow = 4;

class CpuStateStore final : public StateStore {
 public:
  explicit CpuStateStore(const StateStoreContext& context) : records_(context.records) {}

  void acquire(swap::BufferPool& pool) override {
    for (const Record& r : records_) state_.push_back(pool.acquire(r.padded));
  }
  std::size_t depth() const noexcept override { return kCpuWindow; }
  bool in_place() const noexcept override { return true; }
  std::byte* data(std::size_t, std::size_t record) override { return state_[record].data(); }
  std::optional<swap::IoTicket> read(std::size_t, std::size_t, swap::IoCallback,
                                     std::vector<std::uint32_t>*) override {
    return std::nullopt;
  }
  std::optional<swap::IoTicket> write_back(std::size_t, std::size_t, swap::IoCallback,
                                           std::span<const std::uint32_t>) override {
    return std::nullopt;
  }
  // Its state is only changed by a step, which waits for a record an asynchronous save holds,
  // so the save writes it from where it lives.
  Copy read_copy(std::size_t record, std::span<std::byte>) override {
    return {state_[record].data(), std::nullopt};
  }
  swap::SwapStore* swap_store() noexcept override { return nullptr; }
  bool clone_records(bool, const swap::File&, std::span<const std::uint64_t>,
                     std::vector<std::vector<std::uint32_t>>&, std::string& why,
                     const std::string&) override {
    why = "the state is in memory (kCpu), not in swap files";
    return false;
  }
  std::vector<std::string> file_paths() const override { return {}; }
  Status close() override { return Status::ok_status(); }

 private:
  const std::vector<Record>& records_;
  std::vector<swap::BufferLease> state_;  // per record: the record itself
};

std::unique_ptr<StateStore> make_cpu_state_store(const StateStoreContext& context) {
  return std::make_unique<CpuStateStore>(context);
}

}  // namespace

StateStorePlan plan_cpu_state_store(const OptimizerOptions& options,
                                    const std::vector<ParamGroupSpec>& groups) {
  StateStorePlan plan;
  plan.depth = kCpuWindow;
  const RecordSizes sizes = record_sizes(options, groups, plan.alignment);
  plan.pinned_bytes = sizes.state_bytes;
  plan.pinned_what = "the cpu-tier state: " + std::to_string(sizes.count) + " sub-groups of " +
                     bytes_per_element_text(options.state_precision) +
                     " bytes per element, each padded to " + std::to_string(plan.alignment) +
                     ", = " + std::to_string(plan.pinned_bytes) + " bytes";
  plan.make = make_cpu_state_store;
  return plan;
}

}  // namespace zinf::optim
