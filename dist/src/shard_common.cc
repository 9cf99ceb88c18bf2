// SPDX-License-Identifier: Apache-2.0
#include "shard_common.h"

#include <algorithm>
#include <bit>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include "zinf/common/error.h"
#include "zinf/common/random_id.h"
#include "zinf/common/log.h"
#include "zinf/common/status.h"
#include "zinf/swap/dir.h"

namespace zinf::dist::detail {
namespace {

constexpr std::string_view kManifest = "zinf-sharded";
constexpr std::uint64_t kMaxManifestBytes = 1 << 20;
// The largest world size a resharding load accepts from a manifest.
constexpr int kMaxSavedWorld = 1 << 16;

// What a rank's folder says of the job that saved it: the format, world size, rank, entries.
std::string rank_manifest(const ShardManifest& m, int world, int rank) {
  std::string text =
      m.format + "\nworld_size " + std::to_string(world) + "\nrank " + std::to_string(rank) + "\n";
  for (const auto& [name, numel] : m.entries) {
    text += m.entry + " " + name + " " + std::to_string(numel) + "\n";
  }
  return text;
}

// The global one names every rank's folder instead of one rank.
std::string global_manifest(const ShardManifest& m, int world) {
  std::string text = m.format + "\nworld_size " + std::to_string(world) + "\n";
  for (int r = 0; r < world; ++r) text += "rank_dir rank" + std::to_string(r) + "\n";
  for (const auto& [name, numel] : m.entries) {
    text += m.entry + " " + name + " " + std::to_string(numel) + "\n";
  }
  return text;
}

// The lines naming a save, after the layout lines of either manifest.
std::string identity_lines(const SaveIdentity& save) {
  return "save " + save.id + "\nstep " + std::to_string(save.step) + "\n";
}

// The value of `key` in a manifest's "key value" lines, or "" if there is none.
std::string manifest_value(const std::string& text, const std::string& key) {
  std::size_t at = 0;
  while (at < text.size()) {
    const std::size_t end = std::min(text.find('\n', at), text.size());
    const std::string line = text.substr(at, end - at);
    if (line.rfind(key + " ", 0) == 0) return line.substr(key.size() + 1);
    at = end + 1;
  }
  return "";
}

// Splits a manifest into its layout lines (everything before its "save" line) and the save it
// names; nullopt if it names none or names it in any other form than save_sharded writes:
// "save <32 hex digits>", "step <decimal>", then `more` lines of the given keys, in order.
struct Parsed {
  std::string layout;
  SaveIdentity save;
  std::vector<std::string> more;
};
std::optional<Parsed> parse_identity(const std::string& text,
                                     std::span<const std::string_view> more = {}) {
  const std::size_t at = text.rfind("\nsave ");
  if (at == std::string::npos) return std::nullopt;
  Parsed p;
  p.layout = text.substr(0, at + 1);
  std::size_t pos = at + 1;
  auto line = [&](std::string_view key) -> std::optional<std::string> {
    const std::size_t end = text.find('\n', pos);
    if (end == std::string::npos || text.compare(pos, key.size(), key) != 0 ||
        text.size() <= pos + key.size() || text[pos + key.size()] != ' ') {
      return std::nullopt;
    }
    std::string value = text.substr(pos + key.size() + 1, end - pos - key.size() - 1);
    pos = end + 1;
    return value;
  };
  const auto id = line("save");
  const auto step = line("step");
  if (!id || !step || id->size() != 32 ||
      id->find_first_not_of("0123456789abcdef") != std::string::npos) {
    return std::nullopt;
  }
  const char* end = step->data() + step->size();
  const auto [ptr, ec] = std::from_chars(step->data(), end, p.save.step);
  if (step->empty() || ec != std::errc() || ptr != end) return std::nullopt;
  p.save.id = *id;
  for (const std::string_view key : more) {
    auto value = line(key);
    if (!value || value->empty()) return std::nullopt;
    p.more.push_back(std::move(*value));
  }
  if (pos != text.size()) return std::nullopt;
  return p;
}

// "save <id> step <n>", for messages.
std::string describe(const SaveIdentity& save) {
  return "save " + save.id + " step " + std::to_string(save.step);
}

// The optimizer's LATEST in a rank folder (optim/src/optimizer_checkpoint.cc's layout): the
// name of the state version the folder's checkpoint consists of, which the rank manifest
// records, so that a state committed after its manifest (a save killed in between) is seen.
constexpr std::string_view kLatest = "LATEST";
std::string latest_version(const swap::Dir& folder) {
  std::string name = swap::read_small_file(folder, kLatest, 4096);
  while (!name.empty() && (name.back() == '\n' || name.back() == '\r')) name.pop_back();
  return name;
}

// A rank's manifest of the committed save while a later save is not committed yet: its
// `zinf-sharded` already names the later one (save_sharded, step 2).
constexpr std::string_view kPrevious = "zinf-sharded.previous";
constexpr std::string_view kLatestKey[] = {"latest"};

// The rank manifest `name` in `folder`, nullopt if there is none (any other failure throws).
std::optional<std::string> read_rank_manifest(const swap::Dir& folder, std::string_view name) {
  try {
    return swap::read_small_file(folder, name, kMaxManifestBytes);
  } catch (const IoError& e) {
    if (e.code() != ErrorCode::kNotFound) throw;
    return std::nullopt;
  }
}

// The save the commit record in `dir` names now: "" for none (no record yet, or one that names
// no save, which no load accepts). A record that cannot be read is an error: the save could
// not keep what it names.
std::string committed_save_id(const std::string& dir) {
  std::string text;
  try {
    text = swap::read_small_file(swap::Dir::open(dir), kManifest, kMaxManifestBytes);
  } catch (const IoError& e) {
    if (e.code() != ErrorCode::kNotFound) throw;
    return "";
  }
  const auto parsed = parse_identity(text);
  return parsed ? parsed->save.id : "";
}

// Keeps this rank's manifest of save `committed` (the one the commit record names) as
// kPrevious before a new save replaces kManifest: copied there durably if kManifest is it;
// left as it is if kPrevious is it already (a later save failed or was killed since).
void keep_committed_manifest(const swap::Dir& folder, const std::string& committed) {
  if (committed.empty()) return;
  for (const std::string_view name : {kManifest, kPrevious}) {
    const std::optional<std::string> text = read_rank_manifest(folder, name);
    if (!text) continue;
    const std::optional<Parsed> parsed = parse_identity(*text, kLatestKey);
    if (!parsed || parsed->save.id != committed) continue;
    if (name == kManifest) swap::replace_file_durably(folder, kPrevious, *text);
    return;
  }
}

// Subdirectory `name` of `parent`, created (0700) if missing, never through a link (IoError
// naming it for a link or a non-directory there). Several ranks may call it at once.
swap::Dir open_or_create_child(const swap::Dir& parent, const std::string& name) {
  bool exists = false;
  for (const std::string& entry : parent.list()) exists = exists || entry == name;
  if (exists) return parent.open_child(name);
  try {
    return parent.create_child(name);
  } catch (const IoError&) {
    return parent.open_child(name);  // another rank created it first
  }
}

constexpr std::string_view kScratchPrefix = "zinf-reshard-";

// Removes the scratch folders resharding loads killed before their end left under `parent`:
// those whose pid (in the name) is not a live process here and whose lock (the live load holds
// one on its folder) is free. Logs what it removed; a failure is logged and skipped.
void reclaim_scratch(const swap::Dir& parent, std::string_view who) {
  std::vector<std::string> names;
  try {
    names = parent.list();
  } catch (const std::exception& e) {
    log(LogLevel::kWarning, std::string(who) + ": " + e.what());
    return;
  }
  for (const std::string& name : names) {
    if (!name.starts_with(kScratchPrefix)) continue;
    const std::string rest = name.substr(kScratchPrefix.size());
    int pid = 0;
    const auto [ptr, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), pid);
    if (ec != std::errc() || pid <= 0 || ptr == rest.data() + rest.size() || *ptr != '-') continue;
    if (pid == ::getpid() || ::kill(pid, 0) == 0 || errno == EPERM) continue;  // alive
    try {
      const swap::Dir stale = parent.open_child(name);
      if (!stale.try_lock()) continue;  // a live load on another node sharing this folder
      parent.remove_tree(name);
      log(LogLevel::kNotice, std::string(who) + ": reclaimed " + parent.path_of(name) +
                                 ", left by a resharding load that was killed");
    } catch (const std::exception& e) {
      log(LogLevel::kWarning,
          std::string(who) + ": could not reclaim " + parent.path_of(name) + ": " + e.what());
    }
  }
}

}  // namespace

std::uint64_t shard_numel(std::uint64_t numel, int world) noexcept {
  const auto w = static_cast<std::uint64_t>(world);
  return (numel + w - 1) / w;
}

void average_into_slice(Collectives& comm, int stage, std::span<float> full, std::span<float> slice,
                        CollectiveTally& tally) {
  if (stage == 1) {
    all_reduce<float>(comm, full, ReduceOp::kAvg);
    copy_slice(full, comm.rank(), slice);
    tally.reduced(full.size_bytes(), comm.size());
  } else {
    reduce_scatter<float>(comm, full, slice, ReduceOp::kAvg);
    tally.scattered(full.size_bytes(), comm.size());
  }
}

void copy_slice(std::span<const float> full, int rank, std::span<float> shard) {
  const std::uint64_t begin = shard.size() * static_cast<std::uint64_t>(rank);
  const std::uint64_t end = std::min<std::uint64_t>(full.size(), begin + shard.size());
  std::fill(shard.begin(), shard.end(), 0.0f);  // the padding past numel stays 0
  if (begin < end) std::copy(full.begin() + begin, full.begin() + end, shard.begin());
}

void add_squares(std::span<const float> values, double totals[2]) {
  for (const float v : values) {
    if (!std::isfinite(v)) {
      totals[1] += 1;
    } else {
      totals[0] += static_cast<double>(v) * static_cast<double>(v);
    }
  }
}

void all_reduce_failures(Collectives& comm, std::string_view what, std::exception_ptr mine) {
  if (mine) {
    try {
      std::rethrow_exception(mine);
    } catch (const CollectiveError&) {
      throw;  // the group is unusable: another collective would only fail again
    } catch (...) {
      // This rank's own failure: the others learn of it below.
    }
  }
  std::vector<std::int32_t> failed(static_cast<std::size_t>(comm.size()), 0);
  failed[static_cast<std::size_t>(comm.rank())] = mine ? 1 : 0;
  try {
    all_reduce<std::int32_t>(comm, failed, ReduceOp::kSum);
  } catch (...) {
    // The group failed too (e.g. EngineFailed from a collectives object failed earlier):
    // this rank's own error says more.
    if (mine) std::rethrow_exception(mine);
    throw;
  }
  if (mine) std::rethrow_exception(mine);
  std::string ranks;
  int count = 0;
  for (int r = 0; r < comm.size(); ++r) {
    if (failed[static_cast<std::size_t>(r)] == 0) continue;
    ranks += (count++ == 0 ? "" : ", ") + std::to_string(r);
  }
  if (count > 0) {
    throw IoError(Status::error(ErrorCode::kIo,
                                std::to_string(count) + " of " + std::to_string(comm.size()) +
                                    " ranks failed (rank" + (count > 1 ? "s " : " ") + ranks +
                                    "); this rank (" + std::to_string(comm.rank()) + ") did not")
                      .with_operation(std::string(what)));
  }
}

void save_sharded(Collectives& comm, std::string_view who, const std::string& dir,
                  const ShardManifest& manifest, std::uint64_t step,
                  const std::function<void(const swap::Dir& rank_dir)>& save_rank,
                  const std::function<void()>& remove_superseded, const JobRun& run) {
  if (dir.empty()) throw UsageError(std::string(who) + ": the checkpoint directory is empty");
  // The save's id, drawn by rank 0 and the same on every rank, rank 0's run, which every rank
  // records, and the save rank 0's commit record names now (blank for none), whose folders
  // every rank keeps until this save is committed (a failure is all-reduced first, so that no
  // rank waits in the broadcast for ever).
  std::string head(96, ' ');
  on_every_rank(comm, who, [&] {
    if (comm.rank() != 0) return;
    const std::string mine = run.get();
    if (mine.size() != 32) throw IoError(Status::error(ErrorCode::kInternal, "bad run " + mine));
    std::string committed = committed_save_id(dir);
    committed.resize(32, ' ');
    head = random_id("a checkpoint's save id") + mine + committed;
  });
  comm.broadcast(std::as_writable_bytes(std::span<char>(head)), 0);
  const std::string id = head.substr(0, 32);
  std::string committed = head.substr(64);
  if (committed.front() == ' ') committed.clear();
  const SaveIdentity save{id, step};
  std::optional<swap::Dir> top;
  std::optional<swap::Dir> mine;
  // Phase 1: every rank's folder holds the new save, durably, beside the committed one.
  on_every_rank(comm, who, [&] {
    // `dir` is the caller's path, followed as given; the rank folder is opened once, never
    // through a link, and used through that descriptor only.
    std::filesystem::create_directories(dir);
    top.emplace(swap::Dir::open(dir));
    mine.emplace(open_or_create_child(*top, "rank" + std::to_string(comm.rank())));
    run.set(head.substr(32, 32));
    keep_committed_manifest(*mine, committed);
    save_rank(*mine);
    swap::replace_file_durably(*mine, kManifest,
                               rank_manifest(manifest, comm.size(), comm.rank()) +
                                   identity_lines(save) + "latest " + latest_version(*mine) + "\n");
  });
  // Every rank's folder is durable: the commit record makes them one checkpoint.
  on_every_rank(comm, who, [&] {
    if (comm.rank() != 0) return;
    swap::replace_file_durably(*top, kManifest,
                               global_manifest(manifest, comm.size()) + identity_lines(save));
  });
  // Phase 2: the commit record is durable (every rank has passed the all-reduce after it), so
  // what the previous save kept is superseded. A kill here leaves the new save loadable.
  try {
    (void)mine->remove_file(kPrevious);
    remove_superseded();
  } catch (const std::exception& e) {
    log(LogLevel::kWarning, std::string(who) + ": " + e.what() +
                                " (the previous save's files stay, costing only space)");
  }
}

SavedRank open_rank_folder(const swap::Dir& top, std::string_view who,
                           const ShardManifest& manifest, int world, int rank, bool own,
                           const SaveIdentity& committed) {
  swap::Dir folder = top.open_child("rank" + std::to_string(rank));  // never a link
  // The manifest of the committed save: kManifest, or kPrevious where a later save replaced
  // kManifest and was never committed. Neither: kManifest, which the checks below refuse.
  std::string name(kManifest);
  std::string text = swap::read_small_file(folder, kManifest, kMaxManifestBytes);
  std::optional<Parsed> parsed = parse_identity(text, kLatestKey);
  const auto is_committed = [&](const std::optional<Parsed>& p) {
    return p && p->save.id == committed.id && p->save.step == committed.step;
  };
  if (!is_committed(parsed)) {
    if (std::optional<std::string> previous = read_rank_manifest(folder, kPrevious)) {
      std::optional<Parsed> p = parse_identity(*previous, kLatestKey);
      if (is_committed(p)) {
        name = kPrevious;
        text = std::move(*previous);
        parsed = std::move(p);
      }
    }
  }
  const std::string layout = rank_manifest(manifest, world, rank);
  if (!text.starts_with(layout) || (parsed && parsed->layout != layout)) {
    throw UsageError(std::string(who) + ": " + folder.path_of(name) + " does not describe " +
                     (own ? std::string("this rank")
                          : "rank " + std::to_string(rank) + " of the " + std::to_string(world) +
                                " that saved it") +
                     " and these " + manifest.entry + "s (world size, rank, " + manifest.entry +
                     " names and sizes)");
  }
  const std::string torn = std::string(who) + ": checkpoint " + top.path() + " is torn: ";
  const std::string head = top.path() + " (committed) is " + describe(committed);
  if (!parsed) {
    throw UsageError(torn + folder.path_of(name) + " names no save (" + head + ")");
  }
  if (!is_committed(parsed)) {
    throw UsageError(torn + folder.path() + " belongs to " + describe(parsed->save) + ", " + head);
  }
  // The version must be there (a save keeps it until the next one is committed); LATEST may
  // name a later one that was never committed, which the load points back.
  std::string version = parsed->more[0];
  if (version.find('/') != std::string::npos || version == "." || version == "..") {
    throw UsageError(torn + folder.path_of(name) + " names no state version (" + head + ")");
  }
  try {
    (void)folder.open_child(version);
  } catch (const IoError& e) {
    if (e.code() != ErrorCode::kNotFound) throw;
    throw UsageError(torn + folder.path() + " has lost state " + version +
                     ", which its manifest of " + describe(parsed->save) + " names; " + head);
  }
  return {rank, std::move(folder), std::move(version)};
}

void load_sharded(Collectives& comm, std::string_view who, const std::string& dir,
                  const ShardManifest& manifest,
                  const std::function<void(const swap::Dir& rank_dir)>& load_rank,
                  const std::function<void(const std::string& dir, int saved_world,
                                           const std::vector<SavedRank>& folders)>& reshard) {
  if (dir.empty()) throw UsageError(std::string(who) + ": the checkpoint directory is empty");
  std::int32_t saved = 0;
  std::optional<swap::Dir> top;
  SaveIdentity committed;
  // The commit record is rank 0's. Ranks whose `dir` holds none read it from rank 0: a
  // checkpoint saved on node-local drives has it on rank 0's node only, and each rank's own
  // folder on its own node. A rank that holds one must hold the same bytes: another save at
  // the same path (a copy from another run, another file system) is refused on every rank.
  std::string own;
  bool has_own = false;
  on_every_rank(comm, who, [&] {
    top.emplace(swap::Dir::open(dir));
    try {
      own = swap::read_small_file(*top, kManifest, kMaxManifestBytes);
      has_own = true;
    } catch (const IoError& e) {
      if (comm.rank() == 0 || e.code() != ErrorCode::kNotFound) throw;
    }
  });
  std::uint64_t length = own.size();
  comm.broadcast(std::as_writable_bytes(std::span<std::uint64_t>(&length, 1)), 0);
  std::string global = comm.rank() == 0 ? own : std::string(length, '\0');
  comm.broadcast(std::as_writable_bytes(std::span<char>(global)), 0);
  // The lowest rank whose own commit record differs, told to every rank, so that all refuse
  // with the same words before any of them loads.
  std::int32_t differs = has_own && own != global ? comm.rank() : comm.size();
  all_reduce<std::int32_t>(comm, std::span<std::int32_t>(&differs, 1), ReduceOp::kMin);
  if (differs < comm.size()) {
    throw UsageError(std::string(who) + ": the ranks see different checkpoints at " + dir + ": " +
                     dir + "/" + std::string(kManifest) + " on rank " + std::to_string(differs) +
                     " is not rank 0's (is it the same file system on every node, or are the " +
                     "node-local copies from different saves?)");
  }
  on_every_rank(comm, who, [&] {
    const std::string saved_world = manifest_value(global, "world_size");
    const bool same = saved_world == std::to_string(comm.size());
    if (!same && !reshard) {
      throw UsageError(std::string(who) + ": " + top->path_of(kManifest) + " was saved by " +
                       (saved_world.empty() ? "?" : saved_world) + " ranks; this job has " +
                       std::to_string(comm.size()) +
                       " (loading into another world size is not supported)");
    }
    // The commit record must be the one save_sharded writes for these entries and that size
    // (which also makes the size a number in range), naming the save.
    int world = 0;
    const char* end = saved_world.data() + saved_world.size();
    const auto [ptr, ec] = std::from_chars(saved_world.data(), end, world);
    const std::optional<Parsed> parsed = parse_identity(global);
    if (ec != std::errc() || ptr != end || world < 1 || world > kMaxSavedWorld ||
        !global.starts_with(global_manifest(manifest, world)) ||
        (parsed && parsed->layout != global_manifest(manifest, world))) {
      throw UsageError(std::string(who) + ": " + top->path_of(kManifest) +
                       " does not describe a sharded checkpoint of these " + manifest.entry +
                       "s (world size, rank folders, " + manifest.entry + " names and sizes)");
    }
    if (!parsed) {
      throw UsageError(std::string(who) + ": " + top->path_of(kManifest) +
                       " names no committed save (a sharded checkpoint from before saves had an "
                       "identity, or a damaged one): it cannot be checked for a torn save");
    }
    committed = parsed->save;
    saved = world;
  });
  // Every folder this rank will read, opened once and checked against the committed save
  // before any rank loads anything.
  const bool same = saved == comm.size();
  std::vector<SavedRank> folders;
  on_every_rank(comm, who, [&] {
    for (int k = comm.rank(); k < saved; k += comm.size()) {
      folders.push_back(open_rank_folder(*top, who, manifest, saved, k, same, committed));
      if (same) break;
    }
  });
  // Where a save that was never committed (killed, or failed on another rank) had switched a
  // folder's LATEST to its own version, the committed version is current again: the
  // optimizer's load reads what LATEST names.
  const auto point_latest = [&] {
    for (const SavedRank& f : folders) {
      const std::string latest = latest_version(f.folder);
      if (latest == f.version) continue;
      swap::replace_file_durably(f.folder, kLatest, f.version + "\n");
      log(LogLevel::kNotice, std::string(who) + ": " + f.folder.path_of(kLatest) + " named " +
                                 latest + ", of a save that was never committed; it names " +
                                 f.version + " of the committed " + describe(committed) + " again");
    }
  };
  if (same) {
    on_every_rank(comm, who, [&] {
      point_latest();
      load_rank(folders.front().folder);
    });
    return;
  }
  on_every_rank(comm, who, point_latest);
  reshard(dir, saved, folders);
}

void reshard(Collectives& comm, std::string_view who, int saved_world,
             const std::vector<SavedRank>& folders, const ReshardTarget& target) {
  const int me = comm.rank();
  const int world = comm.size();
  const std::size_t entries = target.groups.size();
  // Every saved rank's slices of the entries, and a reader's options over them.
  std::vector<optim::ParamGroupSpec> saved_groups = target.groups;
  for (auto& g : saved_groups) g.numel = shard_numel(g.numel, saved_world);
  optim::OptimizerOptions reader = target.options;
  reader.tier = optim::StateTier::kNvme;
  const bool own_folder =
      target.options.tier == optim::StateTier::kNvme && !target.options.directories.empty();
  // This rank's scratch folder, held locked while it exists (a later load reclaims only those
  // whose lock is free) and removed when the load ends (after the readers below, declared
  // after it, are gone with their swap files).
  struct Scratch {
    std::optional<swap::Dir> parent;
    std::optional<swap::Dir> area;
    std::string name;
    std::string who;
    ~Scratch() {
      if (!area) return;
      try {
        parent->remove_tree(name);
      } catch (const std::exception& e) {
        log(LogLevel::kWarning,
            who + ": could not remove " + parent->path_of(name) + ": " + e.what());
      }
    }
  } scratch;
  scratch.who = std::string(who);
  struct Source {
    int rank;  // the saved rank it holds
    std::unique_ptr<optim::OffloadedOptimizer> reader;
  };
  std::vector<Source> sources;
  std::optional<std::string> extra;
  on_every_rank(comm, who, [&] {
    if (folders.empty()) return;  // more ranks than were saved: nothing to read here
    scratch.parent.emplace(swap::Dir::open(own_folder
                                               ? target.options.directories.front()
                                               : std::filesystem::temp_directory_path().string()));
    reclaim_scratch(*scratch.parent, who);
    scratch.name = swap::unique_name(kScratchPrefix);
    scratch.area.emplace(scratch.parent->create_child(scratch.name));
    (void)scratch.area->try_lock();  // a fresh folder of ours: nobody else holds it
    for (const SavedRank& saved : folders) {
      optim::OptimizerOptions o = reader;
      o.directories = {scratch.area->create_child("rank" + std::to_string(saved.rank)).path()};
      o.pinned_budget_bytes = optim::optimizer_pinned_bytes_needed(o, saved_groups);
      auto opt = std::make_unique<optim::OffloadedOptimizer>(std::move(o), saved_groups);
      opt->load(saved.folder);
      if (saved.rank == 0 && target.extra) extra = target.extra(saved.folder);
      sources.push_back({saved.rank, std::move(opt)});
    }
  });
  // Step count, hyper-parameters and the extra state, from rank 0 (which read saved rank 0).
  std::vector<adam::AdamParams> hypers(entries + 1);
  std::uint64_t head[3] = {0, 0, 0};  // steps, has extra, extra's bytes
  std::string run(32, '0');           // the run that saved it (saved rank 0's)
  if (me == 0) {
    run = sources.front().reader->checkpoint_run();
    const optim::OffloadedOptimizer& r = *sources.front().reader;
    head[0] = r.step_count();
    hypers[0] = r.hyper();
    for (std::size_t i = 0; i < entries; ++i) hypers[i + 1] = r.hyper(i);
    head[1] = extra ? 1 : 0;
    head[2] = extra ? extra->size() : 0;
  }
  comm.broadcast(std::as_writable_bytes(std::span<std::uint64_t>(head)), 0);
  comm.broadcast(std::as_writable_bytes(std::span<adam::AdamParams>(hypers)), 0);
  comm.broadcast(std::as_writable_bytes(std::span<char>(run)), 0);
  if (head[1] != 0) {
    std::string text = me == 0 ? *extra : std::string(head[2], '\0');
    comm.broadcast(std::as_writable_bytes(std::span<char>(text)), 0);
    extra = std::move(text);
  }

  std::exception_ptr failed;  // this rank's first failure; it still takes part in every exchange
  auto guarded = [&](auto&& body) {
    if (failed) return;
    try {
      body();
    } catch (...) {
      failed = std::current_exception();
    }
  };
  guarded([&] {
    target.progress(head[0], hypers, extra);
    if (target.run) target.run(run);
  });
  std::vector<float> old_p, old_m, old_v;
  std::vector<std::int32_t> send, mine;
  std::vector<float> p, m, v;
  for (std::size_t e = 0; e < entries; ++e) {
    const std::uint64_t n = target.groups[e].numel;
    const std::uint64_t s_old = saved_groups[e].numel;
    const std::uint64_t s_new = target.shard[e];
    // Rank r's block: its params, m and v slices, one after the other.
    send.assign(3 * s_new * static_cast<std::uint64_t>(world), 0);
    mine.assign(3 * s_new, 0);
    guarded([&] {
      for (const Source& src : sources) {
        old_p.resize(s_old);
        old_m.resize(s_old);
        old_v.resize(s_old);
        src.reader->read_state(e, old_p, old_m, old_v);
        const std::uint64_t first = s_old * static_cast<std::uint64_t>(src.rank);
        const std::uint64_t last = std::min(n, first + s_old);  // the padding is not moved
        const std::vector<float>* arrays[3] = {&old_p, &old_m, &old_v};
        for (std::uint64_t i = first; i < last; ++i) {
          const std::uint64_t r = i / s_new;
          const std::uint64_t at = r * 3 * s_new + (i - r * s_new);
          for (std::uint64_t a = 0; a < 3; ++a) {
            send[at + a * s_new] = std::bit_cast<std::int32_t>((*arrays[a])[i - first]);
          }
        }
      }
    });
    reduce_scatter<std::int32_t>(comm, send, mine, ReduceOp::kSum);
    guarded([&] {
      p.resize(s_new);
      m.resize(s_new);
      v.resize(s_new);
      for (std::uint64_t i = 0; i < s_new; ++i) {
        p[i] = std::bit_cast<float>(mine[i]);
        m[i] = std::bit_cast<float>(mine[s_new + i]);
        v[i] = std::bit_cast<float>(mine[2 * s_new + i]);
      }
      target.put(e, p, m, v);
    });
  }
  all_reduce_failures(comm, who, failed);
}

}  // namespace zinf::dist::detail

namespace zinf::dist {

std::string rank_directory(const std::string& dir, int rank) {
  const std::string name = "rank" + std::to_string(rank);
  const swap::Dir parent = swap::Dir::open(dir);
  (void)detail::open_or_create_child(parent, name);
  return parent.path_of(name);
}

}  // namespace zinf::dist

namespace zinf::dist {

struct RankFolders::Impl {
  std::vector<std::pair<swap::Dir, std::string>> folders;  // parent, name
};

RankFolders::RankFolders() : impl_(std::make_unique<Impl>()) {}

std::string RankFolders::add(const std::string& dir, int rank) {
  const std::string name = "rank" + std::to_string(rank);
  swap::Dir parent = swap::Dir::open(dir);
  (void)detail::open_or_create_child(parent, name);
  std::string path = parent.path_of(name);
  impl_->folders.emplace_back(std::move(parent), name);
  return path;
}

RankFolders::~RankFolders() {
  // rmdir of an empty folder only (ENOTEMPTY otherwise): whatever is in it stays. Never a
  // link's target: unlinkat refuses a link with AT_REMOVEDIR (ENOTDIR).
  for (auto it = impl_->folders.rbegin(); it != impl_->folders.rend(); ++it) {
    const auto& [parent, name] = *it;
    if (::unlinkat(parent.fd(), name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOTEMPTY &&
        errno != EEXIST && errno != ENOENT) {
      log(LogLevel::kDebug, "could not remove the empty rank folder " + parent.path_of(name) +
                                ": " + std::strerror(errno));
    }
  }
}

}  // namespace zinf::dist
