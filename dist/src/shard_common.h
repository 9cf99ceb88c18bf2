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
#include "zinf/optim/optimizer.h"
#include "zinf/swap/dir.h"

namespace zinf::dist::detail {

/// Elements per rank of an `numel`-element tensor padded with zeros to a multiple of `world`.
std::uint64_t shard_numel(std::uint64_t numel, int world) noexcept;

/// Rank `rank`'s slice of `full`, padded with zeros past its end (`shard` elements).
void copy_slice(std::span<const float> full, int rank, std::span<float> shard);

/// The gradient and parameter collectives of one step on this rank, as StepStats reports them:
/// the bytes a ring algorithm moves into each of `world` ranks, (world - 1) / world of the
/// buffer (exact: every buffer counted is padded to a multiple of world), twice that for an
/// all-reduce (a reduce-scatter then an all-gather). `zinf plan` counts the same way.
struct CollectiveTally {
  std::uint64_t all_gather = 0;
  std::uint64_t reduce_scatter = 0;
  std::uint64_t all_reduce = 0;

  /// An all-gather into `full_bytes`, a reduce-scatter of `full_bytes`, an all-reduce of
  /// `bytes`.
  void gathered(std::uint64_t full_bytes, int world) noexcept {
    all_gather += ring(full_bytes, world);
  }
  void scattered(std::uint64_t full_bytes, int world) noexcept {
    reduce_scatter += ring(full_bytes, world);
  }
  void reduced(std::uint64_t bytes, int world) noexcept { all_reduce += 2 * ring(bytes, world); }
  /// Writes the counts into `stats` and starts the next step's from 0.
  void report(optim::StepStats& stats) noexcept {
    stats.allgather_bytes = all_gather;
    stats.reduce_scatter_bytes = reduce_scatter;
    stats.all_reduce_bytes = all_reduce;
    *this = CollectiveTally{};
  }

 private:
  static std::uint64_t ring(std::uint64_t bytes, int world) noexcept {
    const auto w = static_cast<std::uint64_t>(world);
    return bytes / w * (w - 1);
  }
};

/// Collective: the ranks' `full` (padded to a multiple of the world size) averaged into this
/// rank's `slice`: a reduce-scatter, or at ZeRO stage 1 an all-reduce of the whole (`full`
/// then holds the average) of which the slice is kept. Counted in `tally`.
void average_into_slice(Collectives& comm, int stage, std::span<float> full, std::span<float> slice,
                        CollectiveTally& tally);

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

/// The identity of one sharded save: a 128-bit id rank 0 draws (getrandom) and broadcasts,
/// as 32 hex digits, and the step count it was saved at. Every rank folder of that save and
/// the top-level commit record carry it; a load reads only folders of the committed one.
struct SaveIdentity {
  std::string id;
  std::uint64_t step = 0;
};

/// The job's run, which every rank's folder of a sharded save records (OffloadedOptimizer::
/// checkpoint_run): rank 0's (get), broadcast with the save's id and set on every rank before
/// it saves (set), so that a sharded job is one run in every folder.
struct JobRun {
  std::function<std::string()> get;
  std::function<void(const std::string&)> set;
};

/// Collective. Saves a sharded checkpoint in `dir` (created if missing) as one checkpoint, in
/// two phases, so that the previous checkpoint stays loadable until the new one is committed
/// by every rank:
/// 1. rank 0 draws the save's id and broadcasts it with the id of the save its commit record
///    names now (if any);
/// 2. every rank opens `dir`/rank<R> once (created 0700 if missing, never through a link);
///    if its rank manifest is of the committed save, it copies it durably to
///    `zinf-sharded.previous` (a copy of that save's already there stays); then it runs
///    save_rank on that descriptor, which commits its own files durably and switches its
///    LATEST but keeps the version it supersedes (OffloadedOptimizer::save with kKeep), and
///    replaces its rank manifest there (format, world size, rank, entries, and the save's id,
///    `step` and the name of the state version save_rank committed, read from its LATEST)
///    durably;
/// 3. the ranks all-reduce their failures: if any failed, every rank throws (`who` names the
///    operation, "ShardedOptimizer::save") and nothing more is written;
/// 4. rank 0 replaces the commit record `dir`/zinf-sharded (format, world size, every rank's
///    folder, entries, save id and step) atomically (temporary, fsync, rename, fsync of
///    `dir`), and its failure, if any, is thrown on every rank;
/// 5. only then (the failures' all-reduce of step 4 is the barrier) each rank removes its
///    `zinf-sharded.previous` and runs remove_superseded (the versions save_rank kept, and
///    those of this run a killed save left); a failure there only costs space and is logged.
/// The save exists only once step 4 is done. A kill or failure before leaves the previous
/// commit record, whose save every rank folder still holds (its manifest, or the copy, and
/// its version), and load_sharded loads that one; a kill during step 5 leaves the new one,
/// which every folder holds too. UsageError "<who>: the checkpoint directory is empty" for
/// an empty `dir`, before anything. Every rank's folder records rank 0's run (`run`).
void save_sharded(Collectives& comm, std::string_view who, const std::string& dir,
                  const ShardManifest& manifest, std::uint64_t step,
                  const std::function<void(const swap::Dir& rank_dir)>& save_rank,
                  const std::function<void()>& remove_superseded, const JobRun& run);

/// A saved rank's folder, open (never through a link) and checked against the committed save,
/// and the name of the state version of that save in it, which its LATEST names by the time
/// the folder is loaded.
struct SavedRank {
  int rank = 0;
  swap::Dir folder;
  std::string version;
};

/// Collective. Loads what save_sharded wrote. First the commit record: it must describe these
/// entries at its world size M and name a save (UsageError otherwise, "<who>: <dir>/
/// zinf-sharded does not describe a sharded checkpoint of these <entry>s ..."); M = this
/// world size, or another with `reshard` (without: UsageError "<who>: <dir>/zinf-sharded was
/// saved by M ranks; this job has N (loading into another world size is not supported)").
/// The ranks agree on M (an all-reduce). Then every rank opens and checks each saved folder
/// it will read (its own, or for another world size saved ranks k = rank, rank + N, ...):
/// its manifest of the committed save (`zinf-sharded`, or `zinf-sharded.previous` while a
/// later save was not committed) must describe that rank of M and these entries (UsageError
/// "... does not describe ..."), belong to the committed save and name a state version that
/// is there, else UsageError "<who>: checkpoint <dir> is torn: <dir>/rank<k> belongs to save
/// <id> step S, <dir> (committed) is save <id> step T" (or "... has lost state <version>,
/// which its manifest of save <id> step S names ..."). Any failure there is thrown on every
/// rank before anything is loaded. Then each rank points the LATEST of every folder it reads
/// at that version where a save that was not committed had switched it (durably, with a
/// notice), and runs load_rank(this rank's folder), or reshard(`dir`, M, the folders this
/// rank read), which is collective and does its own failure handling. An empty `dir` as
/// save_sharded.
void load_sharded(Collectives& comm, std::string_view who, const std::string& dir,
                  const ShardManifest& manifest,
                  const std::function<void(const swap::Dir& rank_dir)>& load_rank,
                  const std::function<void(const std::string& dir, int saved_world,
                                           const std::vector<SavedRank>& folders)>& reshard = {});

/// Rank `rank`'s folder of the sharded checkpoint `top`, saved by `world` ranks as save
/// `committed`, opened without following a link and checked as load_sharded describes
/// (`own`: the "does not describe" message says "this rank" rather than "rank R of the W
/// that saved it"), with the version of that save in it.
SavedRank open_rank_folder(const swap::Dir& top, std::string_view who,
                           const ShardManifest& manifest, int world, int rank, bool own,
                           const SaveIdentity& committed);

/// The rank<R> folders a sharded engine or optimizer keeps its swap files in
/// (zinf/dist/rank_directory.h).
using RankFolders = ::zinf::dist::RankFolders;

/// What a resharding load needs of the object it loads into (ShardedOptimizer, ShardedEngine);
/// its entries are the manifest's (groups or layers), in order.
struct ReshardTarget {
  /// The entries as groups of the object's optimizer: names, full element counts and
  /// hyper-parameters, in manifest order.
  std::vector<optim::ParamGroupSpec> groups;
  std::vector<std::uint64_t> shard;  ///< this rank's slice of each, in this world size
  /// The options of the object's own optimizer (this rank's folders). A saved rank is read by
  /// an optimizer of these options over the saved slices, on the nvme tier with its swap files
  /// in a scratch folder `zinf-reshard-<pid>-<random>` under the first of `directories` (the
  /// system's temporary directory for the cpu tier), and a pinned ring of its own.
  optim::OptimizerOptions options;
  /// On rank 0, from saved rank 0's folder: state beside the optimizer's to hand to every rank
  /// as text (the engine's loss scale), or nullopt. May be empty.
  std::function<std::optional<std::string>(const swap::Dir& folder)> extra;
  /// On every rank: the saved step count, hyper-parameters ([0] the object's, [1 + i] entry
  /// i's) and what `extra` returned.
  std::function<void(std::uint64_t steps, std::span<const adam::AdamParams> hypers,
                     const std::optional<std::string>& extra)>
      progress;
  /// On every rank: entry i's new slice, `shard[i]` elements each (fp32 master, m, v).
  std::function<void(std::size_t entry, std::span<const float> params, std::span<const float> m,
                     std::span<const float> v)>
      put;
  /// On every rank: the run that saved the checkpoint (saved rank 0's), to go on as it, as a
  /// load() does.
  std::function<void(const std::string& run)> run;
};

/// Collective: loads a checkpoint saved by `saved_world` ranks (load_sharded has checked its
/// commit record, and the saved folders this rank reads, `folders`: saved ranks k = rank,
/// rank + size(), ...) into `target`. Each saved folder is read by one rank alone (no two
/// ranks take its lock), loaded into a reader (see ReshardTarget::options) whose scratch
/// folder is removed at the end, and held locked meanwhile so that a later load can tell it
/// from one a killed load left (those are removed, with a notice, before this one makes its
/// own); then entry by entry each rank writes what it read at its place in the entry padded
/// for this world size, as the floats' 32-bit patterns with zeros elsewhere, and a
/// reduce-scatter summing those integers hands every rank its new slice bit for bit (each
/// element comes from one rank; an integer sum with zeros keeps -0.0, which a float sum would
/// not). Step count, hyper-parameters and `extra` come from rank 0, which reads saved rank 0.
/// A rank that fails keeps taking part in every exchange, and at the end every rank throws if
/// any failed (all_reduce_failures); a failure before the exchange changes nothing of the
/// target.
void reshard(Collectives& comm, std::string_view who, int saved_world,
             const std::vector<SavedRank>& folders, const ReshardTarget& target);

}  // namespace zinf::dist::detail
