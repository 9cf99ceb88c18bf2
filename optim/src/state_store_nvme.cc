// SPDX-License-Identifier: Apache-2.0
// The nvme state store: the records in a SwapStore over the options' directories (one key per
// record), read into and written back from a ring of pipeline_depth pinned buffers. With swap
// checksums the step folds the records' verification into its update (swap_in_unchecked and
// swap_out_summed), and an asynchronous save may clone the stored blocks (FICLONERANGE).
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "state_store.h"
#include "zinf/common/align.h"
#include "zinf/common/error.h"

namespace zinf::optim {
namespace {

class NvmeStateStore final : public StateStore {
 public:
  // The store's files first: a disk too small for the state is reported (IoError kNoSpace)
  // before the optimizer maps any memory (acquire).
  explicit NvmeStateStore(const StateStoreContext& context)
      : records_(context.records), engine_(context.engine), depth_(context.plan.depth) {
    const OptimizerOptions& options = context.options;
    const std::uint32_t alignment = context.plan.alignment;
    swap::SwapStoreOptions so;
    so.directories = options.directories;
    so.capacity_bytes = context.state_bytes;
    so.checksums = options.swap_checksums;
    so.direct_io = options.direct_io;
    if (options.swap_checksums) {
      // Ranges are whole tensors here, so any stripe works; keep the 1 MiB default unless a
      // record is smaller than a stripe (then checksums cover the record).
      so.stripe_bytes = static_cast<std::uint32_t>(
          std::min<std::uint64_t>(so.stripe_bytes, align_up(context.max_record_bytes, alignment)));
    }
    store_ = std::make_unique<swap::SwapStore>(so, engine_);
    if (store_->alignment() > alignment) {
      throw Error("OffloadedOptimizer: swap store alignment " +
                  std::to_string(store_->alignment()) +
                  " exceeds the probed direct-I/O alignment " + std::to_string(alignment));
    }
    if (options.precondition) store_->precondition();
    for (const auto& r : records_) store_->allocate(r.key, r.bytes);
    max_record_bytes_ = context.max_record_bytes;
  }

  void acquire(swap::BufferPool& pool) override {
    for (std::size_t i = 0; i < depth_; ++i) ring_.push_back(pool.acquire(max_record_bytes_));
    std::span<std::byte> arena = pool.arena();
    (void)engine_.register_buffers(std::span<const std::span<std::byte>>(&arena, 1));
  }
  std::size_t depth() const noexcept override { return depth_; }
  bool in_place() const noexcept override { return false; }
  std::byte* data(std::size_t slot, std::size_t) override { return ring_[slot].data(); }

  std::optional<swap::IoTicket> read(std::size_t slot, std::size_t record, swap::IoCallback done,
                                     std::vector<std::uint32_t>* unit_sums) override {
    const std::string& key = records_[record].key;
    if (!unit_sums) return store_->swap_in(key, ring_[slot].span(), std::move(done));
    unit_sums->resize(store_->unit_count(key));
    return store_->swap_in_unchecked(key, ring_[slot].span(), *unit_sums, std::move(done));
  }
  std::optional<swap::IoTicket> write_back(std::size_t slot, std::size_t record,
                                           swap::IoCallback done,
                                           std::span<const std::uint32_t> sums) override {
    const std::string& key = records_[record].key;
    if (sums.empty()) return store_->swap_out(key, ring_[slot].span(), std::move(done));
    return store_->swap_out_summed(key, ring_[slot].span(), sums, std::move(done));
  }
  // A checked read: with swap checksums a corrupt record fails at its wait, unsaved.
  Copy read_copy(std::size_t record, std::span<std::byte> scratch) override {
    return {scratch.data(), store_->swap_in(records_[record].key, scratch)};
  }
  swap::SwapStore* swap_store() noexcept override { return store_.get(); }
  bool clone_records(bool wanted, const swap::File& file, std::span<const std::uint64_t> offsets,
                     std::vector<std::vector<std::uint32_t>>& sums, std::string& why,
                     const std::string& dest) override;
  std::vector<std::string> file_paths() const override { return store_->file_paths(); }
  Status close() override { return store_->close(); }

 private:
  const std::vector<Record>& records_;
  swap::IoEngine& engine_;
  const std::size_t depth_;
  std::uint64_t max_record_bytes_ = 0;
  std::unique_ptr<swap::SwapStore> store_;
  std::vector<swap::BufferLease> ring_;  // after the store: released first
};

bool NvmeStateStore::clone_records(bool wanted, const swap::File& file,
                                   std::span<const std::uint64_t> offsets,
                                   std::vector<std::vector<std::uint32_t>>& sums, std::string& why,
                                   const std::string& dest) {
  if (!wanted) {
    why = "OptimizerOptions::checkpoint_reflink is off";
    return false;
  }
  // FICLONERANGE takes offsets and lengths in whole blocks of the file system; the store's
  // are multiples of its alignment (at least 4096), which covers the usual 4 KiB blocks, but
  // a file system with larger blocks is checked rather than assumed.
  struct stat st {};
  if (::fstat(file.fd(), &st) != 0) {
    why = std::string("fstat of the state file: ") + std::strerror(errno);
    return false;
  }
  const std::uint64_t block = st.st_blksize > 0 ? static_cast<std::uint64_t>(st.st_blksize) : 1;
  sums.clear();
  sums.reserve(records_.size());
  for (std::size_t i = 0; i < records_.size(); ++i) {
    const Record& rec = records_[i];
    swap::StoredTensor where;
    try {
      where = store_->locate(rec.key);
    } catch (const std::exception& e) {
      why = "cannot locate record '" + rec.key + "': " + e.what();
      return false;
    }
    if (where.padded != rec.padded) {
      why = "record '" + rec.key + "' is stored as " + std::to_string(where.padded) +
            " bytes, the checkpoint's record is " + std::to_string(rec.padded);
      return false;
    }
    for (const swap::StoredPiece& p : where.pieces) {
      const std::uint64_t at = offsets[i] + p.tensor_offset;
      if (p.file_offset % block != 0 || p.length % block != 0 || at % block != 0) {
        why = "record '" + rec.key + "' is not aligned to the file system's " +
              std::to_string(block) + "-byte blocks";
        return false;
      }
      file_clone_range range{};
      range.src_fd = store_->file_descriptor(p.file);
      range.src_offset = p.file_offset;
      range.src_length = p.length;
      range.dest_offset = at;
      if (::ioctl(file.fd(), FICLONERANGE, &range) != 0) {
        const int err = errno;
        why = "FICLONERANGE from " + store_->file_paths()[p.file] + " to " + dest + ": " +
              std::strerror(err);
        return false;
      }
    }
    sums.push_back(std::move(where.unit_sums));
  }
  return true;
}

std::unique_ptr<StateStore> make_nvme_state_store(const StateStoreContext& context) {
  return std::make_unique<NvmeStateStore>(context);
}

}  // namespace

StateStorePlan plan_nvme_state_store(const OptimizerOptions& options,
                                     const std::vector<ParamGroupSpec>& groups) {
  if (options.pipeline_depth < 3) {
    throw UsageError(
        "OffloadedOptimizer: pipeline_depth must be at least 3 (read ahead, "
        "update, write back), got " +
        std::to_string(options.pipeline_depth));
  }
  if (options.directories.empty()) {
    throw UsageError("OffloadedOptimizer: the nvme tier needs at least one directory");
  }
  StateStorePlan plan;
  for (const auto& d : options.directories) {
    plan.alignment = std::max(plan.alignment, swap::probe_direct_io_alignment(d));
  }
  plan.depth = options.pipeline_depth;
  plan.prefault = true;  // the ring is reused every step: faulted in now, not in the first step
  const RecordSizes sizes = record_sizes(options, groups, plan.alignment);
  plan.pinned_bytes = std::uint64_t{options.pipeline_depth} * sizes.max_record_bytes;
  plan.pinned_what = "the pipeline: depth " + std::to_string(options.pipeline_depth) + " x " +
                     std::to_string(sizes.max_record_bytes) + "-byte sub-group buffers (" +
                     std::to_string(std::min(sizes.sub, sizes.max_group_numel)) + " elements x " +
                     bytes_per_element_text(options.state_precision) + " bytes, padded to " +
                     std::to_string(plan.alignment) + ") = " + std::to_string(plan.pinned_bytes) +
                     " bytes";
  plan.make = make_nvme_state_store;
  return plan;
}

}  // namespace zinf::optim
