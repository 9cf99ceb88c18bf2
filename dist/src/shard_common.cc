// SPDX-License-Identifier: Apache-2.0
#include "shard_common.h"

#include <algorithm>
#include <bit>
#include <charconv>
#include <cmath>
#include <filesystem>

#include "zinf/common/error.h"
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

}  // namespace

std::uint64_t shard_numel(std::uint64_t numel, int world) noexcept {
  const auto w = static_cast<std::uint64_t>(world);
  return (numel + w - 1) / w;
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
                  const ShardManifest& manifest,
                  const std::function<void(const std::string& rank_dir)>& save_rank) {
  if (dir.empty()) throw UsageError(std::string(who) + ": the checkpoint directory is empty");
  on_every_rank(comm, who, [&] {
    std::filesystem::create_directories(dir);
    const std::string mine = rank_directory(dir, comm.rank());
    save_rank(mine);
    swap::replace_file_durably(swap::Dir::open(mine), kManifest,
                               rank_manifest(manifest, comm.size(), comm.rank()));
  });
  on_every_rank(comm, who, [&] {
    if (comm.rank() != 0) return;
    swap::replace_file_durably(swap::Dir::open(dir), kManifest,
                               global_manifest(manifest, comm.size()));
  });
}

std::string open_rank_folder(const swap::Dir& top, std::string_view who,
                             const ShardManifest& manifest, int world, int rank, bool own) {
  const swap::Dir folder = top.open_child("rank" + std::to_string(rank));  // never a link
  if (swap::read_small_file(folder, kManifest, kMaxManifestBytes) !=
      rank_manifest(manifest, world, rank)) {
    throw UsageError(std::string(who) + ": " + folder.path_of(kManifest) + " does not describe " +
                     (own ? std::string("this rank")
                          : "rank " + std::to_string(rank) + " of the " + std::to_string(world) +
                                " that saved it") +
                     " and these " + manifest.entry + "s (world size, rank, " + manifest.entry +
                     " names and sizes)");
  }
  return folder.path();
}

void load_sharded(Collectives& comm, std::string_view who, const std::string& dir,
                  const ShardManifest& manifest,
                  const std::function<void(const std::string& rank_dir)>& load_rank,
                  const std::function<void(const std::string& dir, int saved_world)>& reshard) {
  if (dir.empty()) throw UsageError(std::string(who) + ": the checkpoint directory is empty");
  std::int32_t saved = 0;
  on_every_rank(comm, who, [&] {
    const swap::Dir top = swap::Dir::open(dir);
    const std::string global = swap::read_small_file(top, kManifest, kMaxManifestBytes);
    const std::string saved_world = manifest_value(global, "world_size");
    const bool same = saved_world == std::to_string(comm.size());
    if (!same && !reshard) {
      throw UsageError(std::string(who) + ": " + top.path_of(kManifest) + " was saved by " +
                       (saved_world.empty() ? "?" : saved_world) + " ranks; this job has " +
                       std::to_string(comm.size()) +
                       " (loading into another world size is not supported)");
    }
    if (same) {
      saved = comm.size();
      return;
    }
    // Another world size: the global manifest must be the one save_sharded writes for these
    // entries and that size, which also makes the size a number in range.
    int world = 0;
    const char* end = saved_world.data() + saved_world.size();
    const auto [ptr, ec] = std::from_chars(saved_world.data(), end, world);
    if (ec != std::errc() || ptr != end || world < 1 || world > kMaxSavedWorld ||
        global != global_manifest(manifest, world)) {
      throw UsageError(std::string(who) + ": " + top.path_of(kManifest) +
                       " does not describe a sharded checkpoint of these " + manifest.entry +
                       "s (world size, rank folders, " + manifest.entry + " names and sizes)");
    }
    saved = world;
  });
  // Every rank read the same file, unless the ranks see different file systems at `dir`. They
  // agree on the saved size before any of them loads: a rank that found its own world size
  // would otherwise load alone and leave, while one that found another waits in the
  // resharding's collectives for ever.
  std::int32_t range[2] = {saved, -saved};
  all_reduce<std::int32_t>(comm, range, ReduceOp::kMax);
  if (range[0] != -range[1]) {
    throw UsageError(std::string(who) + ": the ranks read different world sizes in " + dir + "/" +
                     std::string(kManifest) + " (" + std::to_string(-range[1]) + " to " +
                     std::to_string(range[0]) + "): is it the same file system on every node?");
  }
  if (saved == comm.size()) {
    on_every_rank(comm, who, [&] {
      load_rank(open_rank_folder(swap::Dir::open(dir), who, manifest, comm.size(), comm.rank(),
                                 /*own=*/true));
    });
    return;
  }
  reshard(dir, saved);
}

void reshard(Collectives& comm, std::string_view who, const std::string& dir, int saved_world,
             const ShardManifest& manifest, const ReshardTarget& target) {
  const int me = comm.rank();
  const int world = comm.size();
  const std::size_t entries = target.groups.size();
  // Every saved rank's slices of the entries, and a reader's options over them.
  std::vector<offload::ParamGroupSpec> saved_groups = target.groups;
  for (auto& g : saved_groups) g.numel = shard_numel(g.numel, saved_world);
  offload::OptimizerOptions reader = target.options;
  reader.tier = offload::StateTier::kNvme;
  const bool own_folder =
      target.options.tier == offload::StateTier::kNvme && !target.options.directories.empty();
  // This rank's scratch folder, removed when the load ends (after the readers below, declared
  // after it, are gone with their swap files).
  struct Scratch {
    std::optional<swap::Dir> parent;
    std::string name;
    std::string who;
    ~Scratch() {
      if (!parent) return;
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
    std::unique_ptr<offload::OffloadedOptimizer> reader;
  };
  std::vector<Source> sources;
  std::optional<std::string> extra;
  on_every_rank(comm, who, [&] {
    if (me >= saved_world) return;  // more ranks than were saved: nothing to read here
    const swap::Dir top = swap::Dir::open(dir);
    scratch.parent.emplace(swap::Dir::open(own_folder
                                               ? target.options.directories.front()
                                               : std::filesystem::temp_directory_path().string()));
    scratch.name = swap::unique_name("zinf-reshard-");
    const swap::Dir area = scratch.parent->create_child(scratch.name);
    for (int k = me; k < saved_world; k += world) {
      const std::string folder = open_rank_folder(top, who, manifest, saved_world, k, false);
      offload::OptimizerOptions o = reader;
      o.directories = {area.create_child("rank" + std::to_string(k)).path()};
      o.pinned_budget_bytes = offload::optimizer_pinned_bytes_needed(o, saved_groups);
      auto opt = std::make_unique<offload::OffloadedOptimizer>(std::move(o), saved_groups);
      opt->load(folder);
      if (k == 0 && target.extra) extra = target.extra(folder);
      sources.push_back({k, std::move(opt)});
    }
  });
  // Step count, hyper-parameters and the extra state, from rank 0 (which read saved rank 0).
  std::vector<adam::AdamParams> hypers(entries + 1);
  std::uint64_t head[3] = {0, 0, 0};  // steps, has extra, extra's bytes
  if (me == 0) {
    const offload::OffloadedOptimizer& r = *sources.front().reader;
    head[0] = r.step_count();
    hypers[0] = r.hyper();
    for (std::size_t i = 0; i < entries; ++i) hypers[i + 1] = r.hyper(i);
    head[1] = extra ? 1 : 0;
    head[2] = extra ? extra->size() : 0;
  }
  comm.broadcast(std::as_writable_bytes(std::span<std::uint64_t>(head)), 0);
  comm.broadcast(std::as_writable_bytes(std::span<adam::AdamParams>(hypers)), 0);
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
  guarded([&] { target.progress(head[0], hypers, extra); });
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
  bool exists = false;
  for (const std::string& entry : parent.list()) exists = exists || entry == name;
  if (exists) {
    (void)parent.open_child(name);  // IoError for a link or a non-directory at that name
  } else {
    try {
      (void)parent.create_child(name);
    } catch (const IoError&) {
      (void)parent.open_child(name);  // another rank created it first
    }
  }
  return parent.path_of(name);
}

}  // namespace zinf::dist
