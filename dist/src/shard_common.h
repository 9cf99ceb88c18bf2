// SPDX-License-Identifier: Apache-2.0
// What the sharded optimizer and the sharded engine share, so that one piece of code serves
// both: the padded slice arithmetic, the rank<R> folders, the failure flags every rank
// all-reduces after a step of its own that could fail, and the checkpoint manifests (a rank's
// and the global one). Internal to zinf::dist.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "zinf/dist/collectives.h"
#include "zinf/dist/rank_directory.h"
#include "zinf/offload/optimizer.h"
#include "zinf/swap/dir.h"

namespace zinf::dist::detail {

/// Elements per rank of an `numel`-element tensor padded with zeros to a multiple of `world`.
std::uint64_t shard_numel(std::uint64_t numel, int world) noexcept;

/// Rank `rank`'s slice of `full`, padded with zeros past its end (`shard` elements).
void copy_slice(std::span<const float> full, int rank, std::span<float> shard);

/// Sum of the squares of the finite values of `values` into totals[0] (double: exact far
/// longer than fp32) and the count of values that are not finite into totals[1].
void add_squares(std::span<const float> values, double totals[2]);

/// All-reduces one failure flag per rank after an operation each rank ran on its own, so that
/// every rank throws if any did and no rank goes on alone into the next collective: this
/// rank's own error (`mine`), or IoError "<what> failed: K of N ranks failed (rank R, ...);
/// this rank (Q) did not". A CollectiveError in `mine` (the group is then unusable) is
/// rethrown without the all-reduce; if the all-reduce itself fails, `mine` (if any) is thrown.
void all_reduce_failures(Collectives& comm, std::string_view what, std::exception_ptr mine);

/// Runs `body` and all_reduce_failures whether it threw.
template <class Body>
void on_every_rank(Collectives& comm, std::string_view what, Body&& body) {
  std::exception_ptr mine;
  try {
    body();
  } catch (...) {
    mine = std::current_exception();
  }
  all_reduce_failures(comm, what, mine);
}

/// What a sharded checkpoint's manifests say of the object that saved it: the format line
/// ("zinf-sharded-optimizer 1"), the word for an entry ("group", "layer") and its entries'
/// names and full element counts.
struct ShardManifest {
  std::string format;
  std::string entry;
  std::vector<std::pair<std::string, std::uint64_t>> entries;
};

/// The manifest of `items` (ParamGroupSpec or LayerSpec: their name and numel).
template <class Items>
ShardManifest manifest_of(std::string format, std::string entry, const Items& items) {
  ShardManifest m{std::move(format), std::move(entry), {}};
  for (const auto& item : items) m.entries.emplace_back(item.name, item.numel);
  return m;
}

/// Collective. Saves a sharded checkpoint in `dir` (created if missing): every rank runs
/// save_rank(`dir`/rank<R>) and writes its rank manifest there, then rank 0 writes the global
/// manifest `dir`/zinf-sharded naming the world size and every rank's folder. Every rank
/// throws if any failed (`who` names the operation, "ShardedOptimizer::save"). UsageError
/// "<who>: the checkpoint directory is empty" for an empty `dir`, before anything.
void save_sharded(Collectives& comm, std::string_view who, const std::string& dir,
                  const ShardManifest& manifest,
                  const std::function<void(const std::string& rank_dir)>& save_rank);

/// Collective. Loads what save_sharded wrote. Saved by this world size: each rank checks its
/// rank manifest (UsageError "<who>: <dir>/rank<R>/zinf-sharded does not describe this rank
/// and these <entry>s (...)") and runs load_rank(`dir`/rank<R>). Saved by another: without
/// `reshard`, UsageError "<who>: <dir>/zinf-sharded was saved by M ranks; this job has N
/// (loading into another world size is not supported)"; with it, the global manifest must name
/// these entries (else a UsageError saying so), the ranks agree on the saved size (an
/// all-reduce), and then every rank calls reshard(`dir`, M), which is collective and does its
/// own failure handling. Every rank throws if any failed before that. An empty `dir` as
/// save_sharded.
void load_sharded(Collectives& comm, std::string_view who, const std::string& dir,
                  const ShardManifest& manifest,
                  const std::function<void(const std::string& rank_dir)>& load_rank,
                  const std::function<void(const std::string& dir, int saved_world)>& reshard = {});

/// The folder of rank `rank` of a sharded checkpoint saved by `world` ranks, under `top`, once
/// its rank manifest is checked against `manifest` (UsageError naming it otherwise; `own`: the
/// message says "this rank" rather than "rank R of the W that saved it"). Never through a link.
std::string open_rank_folder(const swap::Dir& top, std::string_view who,
                             const ShardManifest& manifest, int world, int rank, bool own);

/// What a resharding load needs of the object it loads into (ShardedOptimizer, ShardedEngine);
/// its entries are the manifest's (groups or layers), in order.
struct ReshardTarget {
  /// The entries as groups of the object's optimizer: names, full element counts and
  /// hyper-parameters, in manifest order.
  std::vector<offload::ParamGroupSpec> groups;
  std::vector<std::uint64_t> shard;  ///< this rank's slice of each, in this world size
  /// The options of the object's own optimizer (this rank's folders). A saved rank is read by
  /// an optimizer of these options over the saved slices, on the nvme tier with its swap files
  /// in a scratch folder `zinf-reshard-<pid>-<random>` under the first of `directories` (the
  /// system's temporary directory for the cpu tier), and a pinned ring of its own.
  offload::OptimizerOptions options;
  /// On rank 0, from saved rank 0's folder: state beside the optimizer's to hand to every rank
  /// as text (the engine's loss scale), or nullopt. May be empty.
  std::function<std::optional<std::string>(const std::string& folder)> extra;
  /// On every rank: the saved step count, hyper-parameters ([0] the object's, [1 + i] entry
  /// i's) and what `extra` returned.
  std::function<void(std::uint64_t steps, std::span<const adam::AdamParams> hypers,
                     const std::optional<std::string>& extra)>
      progress;
  /// On every rank: entry i's new slice, `shard[i]` elements each (fp32 master, m, v).
  std::function<void(std::size_t entry, std::span<const float> params, std::span<const float> m,
                     std::span<const float> v)>
      put;
};

/// Collective: loads a checkpoint saved by `saved_world` ranks (load_sharded has checked its
/// global manifest) into `target`. Saved rank k is read by rank k mod size() alone (so each
/// saved folder is read once, and no two ranks take its lock), loaded into a reader (see
/// ReshardTarget::options) whose scratch folder is removed at the end; then entry by entry each rank writes what it read at
/// its place in the entry padded for this world size, as the floats' 32-bit patterns with zeros
/// elsewhere, and a reduce-scatter summing those integers hands every rank its new slice bit
/// for bit (each element comes from one rank; an integer sum with zeros keeps -0.0, which a
/// float sum would not). Step count, hyper-parameters and `extra` come from rank 0, which reads
/// saved rank 0. A rank that fails keeps taking part in every exchange, and at the end every
/// rank throws if any failed (all_reduce_failures); a failure before the exchange changes
/// nothing of the target.
void reshard(Collectives& comm, std::string_view who, const std::string& dir, int saved_world,
             const ShardManifest& manifest, const ReshardTarget& target);

}  // namespace zinf::dist::detail
