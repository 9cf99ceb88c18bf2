// SPDX-License-Identifier: Apache-2.0
// StateStore: where OffloadedOptimizer keeps its records (the fp32 masters and Adam moments of
// each sub-group) between updates, and how a record reaches the buffer an update, set_params,
// read_state or a checkpoint works on. Two backends: cpu (state_store_cpu.cc: every record in
// pinned memory; a read completes at once and a slot is the record itself, so nothing is
// copied) and nvme (state_store_nvme.cc: the records in a SwapStore, read into and written back
// from a ring of pipeline_depth buffers). The optimizer orders the records, checks and counts;
// what differs by tier is behind this interface, the counterpart of the engine's ParamTier, so
// a change to one tier is read in one file. Private to zinf::optim.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "zinf/adam/compact_state.h"
#include "zinf/common/status.h"
#include "zinf/optim/optimizer.h"
#include "zinf/swap/buffer_pool.h"
#include "zinf/swap/file.h"
#include "zinf/swap/io_engine.h"
#include "zinf/swap/swap_store.h"

namespace zinf::optim {

/// Bytes of a record's state for `n` elements: the fp32 master parameters and Adam's m and v in
/// `precision` (12n for fp32). Sizes every record, its I/O and its checkpoint CRC, so the step
/// and the checkpoint agree by construction.
inline std::uint64_t record_state_bytes(adam::StatePrecision precision, std::uint64_t n) {
  return 4 * n + adam::moment_bytes(precision, n);
}

/// Where a record's arrays lie in its buffer: the fp32 parameters, then the moments as
/// adam::compact_moments_at lays them out. fp32 and bf16: [params | m | v]; int8:
/// [params | m scales | v scales | m codes | v codes].
struct RecordLayout {
  adam::StatePrecision precision;
  std::uint64_t numel;
  std::span<float> params(std::byte* base) const {
    return {reinterpret_cast<float*>(base), static_cast<std::size_t>(numel)};
  }
  adam::CompactMoments moments(std::byte* base) const {
    return adam::compact_moments_at(precision, static_cast<std::size_t>(numel), base + 4 * numel);
  }
};

/// One sub-group: elements [offset, offset + numel) of a group, stored as one record
/// (RecordLayout) of `bytes` = record_state_bytes() bytes padded to `padded` bytes.
struct Record {
  std::size_t group = 0;
  std::uint64_t sub = 0;
  std::uint64_t offset = 0;
  std::uint64_t numel = 0;
  std::uint64_t bytes = 0;
  std::uint64_t padded = 0;
  std::string key;  // its name in the nvme store's SwapStore, and in checksum errors
};

/// The records' sizes as the options and groups make them at an alignment: what a store's
/// share of the pinned budget is computed from, before any record exists.
struct RecordSizes {
  std::uint64_t sub = 0;               // elements of a full record
  std::uint64_t max_group_numel = 0;   // the largest group
  std::uint64_t max_record_bytes = 0;  // the largest padded record
  std::uint64_t state_bytes = 0;       // every padded record
  std::size_t count = 0;
};
RecordSizes record_sizes(const OptimizerOptions& options, const std::vector<ParamGroupSpec>& groups,
                         std::uint32_t alignment);

/// "12", "8" or "6.125": a record's bytes per element, for the budget's error message.
std::string bytes_per_element_text(adam::StatePrecision precision);

class StateStore;
struct StateStorePlan;

/// Everything a store is built from; references must outlive the store.
struct StateStoreContext {
  const StateStorePlan& plan;
  const OptimizerOptions& options;  // sub_group_elements already effective
  const std::vector<Record>& records;
  swap::IoEngine& engine;
  std::uint64_t max_record_bytes = 0;
  std::uint64_t state_bytes = 0;
};

/// What a store needs and holds, computed before anything is created (the nvme store probes
/// its directories' direct-I/O alignment, which leaves no file).
struct StateStorePlan {
  /// The alignment every record is padded to (and every buffer starts on).
  std::uint32_t alignment = 4096;
  /// Slots: the records a pipeline works on at once.
  std::size_t depth = 0;
  /// Pinned bytes the store takes from the optimizer's pool, and what they are for the
  /// budget's error ("the pipeline: depth 3 x ...").
  std::uint64_t pinned_bytes = 0;
  std::string pinned_what;
  /// Fault the pool in at construction: the nvme ring is reused every step.
  bool prefault = false;
  /// Builds the store the plan is for.
  std::unique_ptr<StateStore> (*make)(const StateStoreContext& context) = nullptr;
};

/// Checks what only the tier can check (UsageError: the nvme tier's pipeline_depth and
/// directories) and plans the store options.tier names; the one place that picks a backend.
/// `options.sub_group_elements` must be the effective one.
StateStorePlan plan_state_store(const OptimizerOptions& options,
                                const std::vector<ParamGroupSpec>& groups);

/// One record store. A slot (< depth()) is where a record is worked on: the caller gives a
/// slot to at most one record at a time and waits for a slot's read or write-back before it
/// reuses the slot. The I/O calls return nullopt where no I/O was needed (the record is in
/// place already), and then never call `done`; otherwise `done` runs exactly once, on an I/O
/// thread, before the ticket completes. Errors name the swap file, offset and length.
class StateStore {
 public:
  virtual ~StateStore() = default;

  /// Takes the store's buffers from `pool` (the plan's pinned_bytes), once, after the store's
  /// files exist: a drive too small for the state fails before any memory is mapped.
  virtual void acquire(swap::BufferPool& pool) = 0;
  /// The slots (the plan's depth).
  virtual std::size_t depth() const noexcept = 0;
  /// True where a slot is the record itself: an update changes the stored state at once.
  virtual bool in_place() const noexcept = 0;
  /// Record `record`'s padded bytes while it is in `slot`.
  virtual std::byte* data(std::size_t slot, std::size_t record) = 0;
  /// Starts bringing `record` into `slot`. With `unit_sums` (folded checksums, see swap_store)
  /// the read is not verified: the record's stored unit CRCs are put there for the caller.
  virtual std::optional<swap::IoTicket> read(std::size_t slot, std::size_t record,
                                             swap::IoCallback done = {},
                                             std::vector<std::uint32_t>* unit_sums = nullptr) = 0;
  /// Starts storing `record` from `slot`; `sums`, if not empty, are its unit CRCs as the
  /// update computed them (stored as given).
  virtual std::optional<swap::IoTicket> write_back(std::size_t slot, std::size_t record,
                                                   swap::IoCallback done = {},
                                                   std::span<const std::uint32_t> sums = {}) = 0;
  /// Record `record`'s bytes for a reader outside the step (an asynchronous save): where it
  /// lies in memory already, that place and nullopt; else a verified read into `scratch`,
  /// whose data it returns with the read's ticket.
  struct Copy {
    std::byte* data = nullptr;
    std::optional<swap::IoTicket> io;
  };
  virtual Copy read_copy(std::size_t record, std::span<std::byte> scratch) = 0;
  /// The SwapStore the records live in, or null (cpu). With checksums, the step folds their
  /// verification into the update (unit sizes, padding, checksum_error come from it).
  virtual swap::SwapStore* swap_store() noexcept = 0;
  /// Clones every record's stored blocks into `file` (at `offsets`, FICLONERANGE) and puts
  /// each record's unit checksums in `sums`, where `wanted`. False, with the reason in `why`,
  /// if the store cannot or any clone fails (the file then holds some clones, which
  /// streaming overwrites). `dest` names the checkpoint directory in the reason.
  virtual bool clone_records(bool wanted, const swap::File& file,
                             std::span<const std::uint64_t> offsets,
                             std::vector<std::vector<std::uint32_t>>& sums, std::string& why,
                             const std::string& dest) = 0;
  /// The store's files (none for cpu).
  virtual std::vector<std::string> file_paths() const = 0;
  /// Closes the store's files; the first failure.
  virtual Status close() = 0;
};

// The backends, one file each (state_store_*.cc).
StateStorePlan plan_cpu_state_store(const OptimizerOptions& options,
                                    const std::vector<ParamGroupSpec>& groups);
StateStorePlan plan_nvme_state_store(const OptimizerOptions& options,
                                     const std::vector<ParamGroupSpec>& groups);

}  // namespace zinf::optim
