// SPDX-License-Identifier: Apache-2.0
// OffloadedOptimizer checkpoints: the state streamed record by record between the state store
// and one checkpoint file through the store's slots (never the whole state in memory), a text
// manifest with a CRC32C per record (checkpoint_format.cc), fsync of files and directories, an
// atomic switch of the `LATEST` pointer, and one owner per checkpoint directory. save_async is
// in optimizer_async_save.cc.
//
// On-disk scheme, chosen so that a kill at any point leaves a loadable checkpoint:
//   <dir>/LATEST            one line: the name of the current version directory
//   <dir>/<version>/        state.bin (records at aligned offsets) and manifest
// save() creates <dir>/<version>.tmp/ (mkdirat: never an existing entry), creates both files
// in it exclusively, fsyncs them and the directory, renames it to <dir>/<version>/ and fsyncs
// <dir>; then replaces LATEST (replace_file_durably: a fresh temporary renamed over it) and
// fsyncs <dir>. Only then are older versions of this optimizer and leftovers of interrupted
// saves removed. Until the LATEST rename, LATEST names the previous (complete) version; after
// it, the new one, which is complete and durable. load() follows LATEST only.
//
// The directory is a swap::Dir, opened once and locked for as long as this optimizer uses it,
// and every name in it is resolved without following links: zinf may run as root in a
// directory others can write to, and a planted link must never redirect a write. Version
// names carry 64 random bits, so nothing can be planted at them in advance.
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>

#include <fcntl.h>

#include <algorithm>
#include <cinttypes>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint_format.h"
#include "optimizer_impl.h"
#include "zinf/common/error.h"
#include "zinf/common/random_id.h"
#include "zinf/common/log.h"
#include "zinf/swap/buffer_pool.h"
#include "zinf/swap/crc32c.h"
#include "zinf/swap/dir.h"
#include "zinf/swap/file.h"

namespace zinf::optim {

namespace fs = std::filesystem;

const std::string& OffloadedOptimizer::Impl::current_run() {
  if (run_id.empty()) run_id = random_id("a checkpoint's run id");
  return run_id;
}

std::string OffloadedOptimizer::Impl::superseded_run(const swap::Dir& root) const {
  return superseded_by_save(root, checkpoint_chain, run_id);
}

VersionWrite OffloadedOptimizer::Impl::begin_version(const CheckpointPlace& dir) {
  for (std::size_t g = 0; g < groups.size(); ++g) {
    if (!initialized[g]) {
      throw UsageError("OffloadedOptimizer::save: group '" + groups[g].name +
                       "' has no state yet (call set_params first)");
    }
  }
  const swap::Dir& root = open_checkpoint_dir(dir, /*create=*/true);

  VersionWrite v;
  // An unpredictable name: nothing can be planted at it (or inside it) in advance, and two
  // saves can never pick the same one. The prefix keeps is_version_name() and the step.
  char prefix[32];
  std::snprintf(prefix, sizeof prefix, "v%012" PRIu64 "-", steps_done);
  v.name = swap::unique_name(prefix);
  v.tmp = v.name + std::string(kTmpSuffix);
  try {
    v.vdir = root.create_child(v.tmp);
  } catch (...) {
    rethrow_naming_checkpoint(root);
  }
  try {
    checkpoint_phase("created", 0);
    v.files.emplace_back(kRunFile, "run " + current_run() + "\n");
    for (const auto& [file, text] : checkpoint_files) v.files.emplace_back(file, text);
    v.superseded = superseded_run(root);
    v.step = steps_done;
    v.hp = hyper;
    v.groups = groups;
    for (std::size_t g = 0; g < groups.size(); ++g) v.groups[g].hyper = group_hyper[g];
    for (const auto& r : records) {
      v.offsets.push_back(v.total);
      v.total += r.padded;
    }
    v.crcs.assign(records.size(), 0);
    v.file = reopen_buffered_if_misaligned(
        swap::File::create_exclusive(v.vdir, kStateFile,
                                     swap::FileOptions{.preallocate_bytes = v.total}),
        v.vdir, alignment, /*read_only=*/false);
  } catch (...) {
    abandon_version(v);
    rethrow_naming_checkpoint(root);  // e.g. its preallocation on a full drive
  }
  return v;
}

void OffloadedOptimizer::Impl::abandon_version(VersionWrite& v) noexcept {
  // A kill leaves the partial version for the next save to remove; this is the other path.
  try {
    if (v.file.is_open()) v.file.close().ignore("removed with its version");
    checkpoint_dir.remove_tree(v.tmp);
  } catch (const std::exception& e) {
    log(LogLevel::kWarning, std::string("checkpoint: cannot remove a failed save: ") + e.what());
  }
}

void OffloadedOptimizer::Impl::commit_version(VersionWrite& v,
                                              const std::function<void()>& between) {
  auto pause = [&] {
    if (between) between();
  };
  const swap::Dir& root = checkpoint_dir;
  Manifest m;
  m.step = v.step;
  m.hp = v.hp;
  m.sub_group_elements = options.sub_group_elements;
  m.precision = options.state_precision;
  m.groups = v.groups;
  for (std::size_t i = 0; i < records.size(); ++i) {
    const Record& r = records[i];
    m.records.push_back({r.group, r.sub, r.numel, v.offsets[i], r.padded, v.crcs[i]});
  }
  pause();
  throw_if_error(v.file.sync());
  throw_if_error(v.file.close());
  pause();
  for (const auto& [file, text] : v.files) {
    swap::create_file_durably(v.vdir, file, with_crc_line(text));
  }
  swap::create_file_durably(v.vdir, kManifestFile,
                            render(m, std::string(state_tier_name(options.tier))));
  v.vdir.sync();
  checkpoint_phase("synced", v.total);

  pause();
  root.rename(v.tmp, v.name);
  root.sync();
  checkpoint_phase("committed", v.total);

  pause();
  swap::replace_file_durably(root, kLatest, v.name + "\n");
  checkpoint_phase("latest", v.total);
  if (!v.superseded.empty()) {
    log(LogLevel::kWarning, "checkpoint: " + root.path() + " held " + v.superseded +
                                ", which this run (" + run_id +
                                ") neither saved nor loaded; LATEST now names this run's step " +
                                std::to_string(v.step) + ", and that version is kept");
  }
  pause();

  // The new version is current and durable: remove this optimizer's older versions (unless
  // the caller keeps them for its own commit) and what interrupted saves left.
  remove_versions_but(v.name, !v.keep_superseded, /*own_run=*/false);
  checkpoint_phase("done", v.total);
}

void OffloadedOptimizer::Impl::remove_versions_but(const std::string& current, bool chain,
                                                   bool own_run) {
  // Under the lock nobody else is writing here, so a .tmp version or a .zinf-tmp- file is a
  // dead process's. Versions of other runs stay. Failures here only cost space, so they are
  // logged.
  const swap::Dir& root = checkpoint_dir;
  std::vector<std::string> kept{current};
  if (!chain) {
    for (const std::string& n : checkpoint_chain) {
      if (n != current) kept.push_back(n);
    }
  }
  std::vector<std::string> names;
  try {
    names = root.list();
  } catch (const IoError& e) {
    log(LogLevel::kWarning, std::string("checkpoint: cannot list for cleanup: ") + e.what());
  }
  for (const std::string& n : names) {
    if (n == current) continue;
    const bool tmp_version = is_version_name(n) && n.ends_with(kTmpSuffix);
    const bool leftover = tmp_version || swap::is_zinf_temporary(n);
    const bool ours = chain && std::find(checkpoint_chain.begin(), checkpoint_chain.end(), n) !=
                                   checkpoint_chain.end();
    bool this_run = false;
    if (own_run && !leftover && !ours && is_version_name(n) && !run_id.empty()) {
      try {
        this_run = version_run(root.open_child(n)) == run_id;
      } catch (const std::exception& e) {
        // Not readable as a version of ours: not removed.
        log(LogLevel::kDebug, std::string("checkpoint: ") + e.what());
      }
    }
    if (!ours && !leftover && !this_run) continue;
    try {
      root.remove_tree(n);
      if (leftover || this_run) {
        log(LogLevel::kNotice, "checkpoint: reclaimed " + root.path_of(n) +
                                   (leftover ? ", left by an interrupted save"
                                             : ", a superseded version of this run"));
      }
    } catch (const std::exception& e) {
      log(LogLevel::kWarning,
          std::string("checkpoint: cannot remove ") + root.path_of(n) + ": " + e.what());
      if (ours || this_run) kept.push_back(n);  // tried again after the next save
    }
  }
  checkpoint_chain = std::move(kept);
}

void OffloadedOptimizer::Impl::remove_superseded_versions() {
  if (!checkpoint_dir.is_open()) return;
  std::string current;
  try {
    current = latest_version_name(checkpoint_dir);
  } catch (const std::exception& e) {
    // Without a current version nothing is superseded: removing would be guessing.
    log(LogLevel::kWarning, std::string("checkpoint: nothing removed: ") + e.what());
    return;
  }
  remove_versions_but(current, /*chain=*/true, /*own_run=*/true);
}

void OffloadedOptimizer::Impl::save(const CheckpointPlace& dir, SupersededVersions superseded) {
  VersionWrite v = begin_version(dir);
  v.keep_superseded = superseded == SupersededVersions::kKeep;
  try {
    Attached att(*engine, v.file);
    std::uint64_t written = 0;
    ring_pipeline(
        records.size(),
        [&](std::size_t i, std::size_t slot) -> std::optional<swap::IoTicket> {
          return store->read(slot, i);
        },
        [&](std::size_t i, std::size_t slot) -> std::optional<swap::IoTicket> {
          const Record& rec = records[i];
          std::byte* base = store->data(slot, i);
          v.crcs[i] = swap::crc32c(std::span<const std::byte>(base, rec.bytes));
          swap::IoRequest req{swap::IoOp::kWrite, att.id(), v.offsets[i],
                              std::span<std::byte>(base, rec.padded)};
          swap::IoTicket t = engine->submit(std::span<const swap::IoRequest>(&req, 1));
          written += rec.padded;
          checkpoint_phase("data", written);
          return t;
        });
  } catch (...) {
    abandon_version(v);
    rethrow_naming_checkpoint(checkpoint_dir);
  }
  try {
    commit_version(v);
  } catch (...) {
    // Before the rename the version is still the temporary one: remove it. After, it is
    // complete (a failure to switch LATEST leaves the previous one current) and stays for the
    // next save's cleanup.
    if (!renamed_into_place(checkpoint_dir, v.name)) abandon_version(v);
    rethrow_naming_checkpoint(checkpoint_dir);
  }
}

const swap::Dir& OffloadedOptimizer::Impl::open_checkpoint_dir(const CheckpointPlace& where,
                                                               bool create) {
  swap::Dir opened;
  if (where.dir) {
    // Open already: a descriptor of our own (and so a lock of our own), not its path.
    opened = where.dir->reopen();
  } else {
    const std::string& dir = *where.path;
    if (create) {
      // The path as the caller gave it, links in it followed: the caller chose it. Everything
      // inside goes through the descriptor opened next.
      std::error_code ec;
      fs::create_directories(dir, ec);
      if (ec) throw IoError(Status::from_errno(ec.value(), "create checkpoint directory", dir));
    }
    opened = swap::Dir::open(dir);
  }
  if (checkpoint_dir.is_open() && same_directory(opened, checkpoint_dir)) return checkpoint_dir;
  opened.lock_or_throw("checkpoints of an OffloadedOptimizer");
  // Moving on: the old directory's lock goes with its descriptor, and the versions there are
  // no longer ours to remove.
  checkpoint_dir = std::move(opened);
  checkpoint_chain.clear();
  return checkpoint_dir;
}

std::optional<std::string> OffloadedOptimizer::Impl::read_checkpoint_file(const swap::Dir& root,
                                                                          const std::string& name,
                                                                          std::string* path) const {
  const swap::Dir vdir = root.open_child(latest_version_name(root));
  if (path) *path = vdir.path_of(name);
  return read_version_file(vdir, name);
}

void OffloadedOptimizer::Impl::load(const CheckpointPlace& dir) {
  const swap::Dir& root = open_checkpoint_dir(dir, /*create=*/false);
  const std::string name = latest_version_name(root);
  const swap::Dir vdir = root.open_child(name);
  const std::string& vpath = vdir.path();
  const std::string manifest_path = vdir.path_of(kManifestFile);
  const Manifest m =
      parse(swap::read_small_file(vdir, kManifestFile, kMaxManifestBytes), manifest_path);
  const std::string saved_by = version_run(vdir);  // "": saved before versions recorded runs

  // The checkpoint must describe this optimizer's layout exactly.
  auto mismatch = [&](const std::string& why) {
    throw UsageError("OffloadedOptimizer::load: checkpoint " + vpath + " does not match: " + why);
  };
  if (m.groups.size() != groups.size()) {
    mismatch(std::to_string(m.groups.size()) + " groups, this optimizer has " +
             std::to_string(groups.size()));
  }
  for (std::size_t i = 0; i < groups.size(); ++i) {
    if (m.groups[i].name != groups[i].name || m.groups[i].numel != groups[i].numel) {
      mismatch("group " + std::to_string(i) + " is '" + m.groups[i].name + "' of " +
               std::to_string(m.groups[i].numel) + " elements, here '" + groups[i].name + "' of " +
               std::to_string(groups[i].numel));
    }
  }
  // Refused rather than converted: a conversion would change the moments the run continues
  // with (int8 to fp32 cannot restore what the codes dropped), which a resume must not do
  // silently; a user who wants it loads into an optimizer of the checkpoint's precision and
  // moves the state with read_state/set_state.
  if (m.precision != options.state_precision) {
    mismatch("state_precision " + std::string(adam::state_precision_name(m.precision)) + ", here " +
             std::string(adam::state_precision_name(options.state_precision)));
  }
  if (m.sub_group_elements != options.sub_group_elements) {
    mismatch("sub_group_elements " + std::to_string(m.sub_group_elements) + ", here " +
             std::to_string(options.sub_group_elements));
  }
  const std::string state_path = vdir.path_of(kStateFile);
  std::uint64_t offset = 0;
  if (m.records.size() != records.size()) throw corrupt(manifest_path, "wrong record count");
  for (std::size_t i = 0; i < records.size(); ++i) {
    const auto& a = m.records[i];
    const auto& b = records[i];
    if (a.group != b.group || a.sub != b.sub || a.numel != b.numel || a.padded != b.padded ||
        a.offset != offset) {
      throw corrupt(manifest_path, "record " + std::to_string(i) + " does not match the layout");
    }
    offset += b.padded;
  }
  validate_hyper(m.hp);
  for (const auto& g : m.groups) validate_hyper(*g.hyper, g.name);

  swap::File file = reopen_buffered_if_misaligned(
      swap::File::open_existing(vdir, kStateFile, swap::FileOptions{.read_only = true}), vdir,
      alignment, /*read_only=*/true);
  if (file.size() < offset) {
    throw corrupt(state_path, "file is " + std::to_string(file.size()) +
                                  " bytes, the manifest needs " + std::to_string(offset));
  }

  // From here on the state is being overwritten: any failure leaves it inconsistent.
  try {
    Attached att(*engine, file);
    ring_pipeline(
        records.size(),
        [&](std::size_t i, std::size_t slot) -> std::optional<swap::IoTicket> {
          const Record& rec = records[i];
          std::byte* base = store->data(slot, i);
          swap::IoRequest req{swap::IoOp::kRead, att.id(), m.records[i].offset,
                              std::span<std::byte>(base, rec.padded)};
          return engine->submit(std::span<const swap::IoRequest>(&req, 1));
        },
        [&](std::size_t i, std::size_t slot) -> std::optional<swap::IoTicket> {
          const Record& rec = records[i];
          std::byte* base = store->data(slot, i);
          const std::uint64_t bytes = rec.bytes;
          const std::uint32_t got = swap::crc32c(std::span<const std::byte>(base, bytes));
          if (got != m.records[i].crc) {
            throw corrupt(state_path,
                          "CRC32C mismatch in group '" + groups[rec.group].name + "' sub-group " +
                              std::to_string(rec.sub) + ": stored " + hex32(m.records[i].crc) +
                              ", computed " + hex32(got),
                          m.records[i].offset, bytes);
          }
          return store->write_back(slot, i);
        });
  } catch (const IoError& e) {
    fail(e.status());
    throw;
  } catch (const EngineFailed& e) {
    fail(e.cause());
    throw;
  }
  Status s = file.close();
  s.ignore("read-only file: nothing to flush");
  steps_done = m.step;
  hyper = m.hp;
  for (std::size_t g = 0; g < groups.size(); ++g) group_hyper[g] = *m.groups[g].hyper;
  initialized.assign(groups.size(), true);
  // The resumed run goes on as the run that saved it: its next save is no other run's.
  if (!saved_by.empty()) run_id = saved_by;
  log(LogLevel::kNotice, "checkpoint: loaded " + vpath + ": step " + std::to_string(m.step) +
                             " of run " +
                             (saved_by.empty() ? std::string("(not recorded)") : saved_by));
  // Superseded by this optimizer's next save, which removes it.
  if (std::find(checkpoint_chain.begin(), checkpoint_chain.end(), name) == checkpoint_chain.end()) {
    checkpoint_chain.push_back(name);
  }
}

}  // namespace zinf::optim
