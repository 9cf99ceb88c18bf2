// SPDX-License-Identifier: Apache-2.0
// OffloadedOptimizer checkpoints: the state streamed record by record between the tier and
// one checkpoint file through the ring (never the whole state in memory), a text manifest
// with a CRC32C per record, fsync of files and directories, an atomic switch of the `LATEST`
// pointer, and one owner per checkpoint directory.
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

#include "optimizer_impl.h"
#include "zinf/common/error.h"
#include "zinf/common/random_id.h"
#include "zinf/common/log.h"
#include "zinf/swap/buffer_pool.h"
#include "zinf/swap/crc32c.h"
#include "zinf/swap/dir.h"
#include "zinf/swap/file.h"

namespace zinf::optim {
namespace {

namespace fs = std::filesystem;

constexpr const char* kMagic = "zinf-optimizer-checkpoint";
// 2 adds a "hyper" line per group after the group lines; 1 (one set for every group, the
// header's) still loads. 3 adds a "state_precision" line after sub_group_elements; it is
// written only for compact moments (bf16, int8), so an fp32 checkpoint stays format 2, byte
// for byte what earlier versions wrote and read, and an earlier reader refuses a compact one
// by its version instead of misreading its records.
constexpr int kFormatVersion = 2;
constexpr int kCompactFormatVersion = 3;
constexpr const char* kLatest = "LATEST";
constexpr const char* kStateFile = "state.bin";
constexpr const char* kManifestFile = "manifest";
// LATEST holds one version name; a manifest a line per record (tens of bytes each).
constexpr std::uint64_t kMaxLatestBytes = 4096;
constexpr std::uint64_t kMaxManifestBytes = std::uint64_t{64} << 20;
constexpr std::string_view kTmpSuffix = ".tmp";
// In each version beside state.bin and manifest (both optional on load: versions saved before
// them have neither): the run that saved it, and the caller's set_checkpoint_file texts. Each
// is its text and a "crc32c <hex>" line.
constexpr const char* kRunFile = "run";
constexpr std::uint64_t kMaxCheckpointFileBytes = 64 << 10;

std::string hexfloat(double v) {
  char b[64];
  std::snprintf(b, sizeof b, "%a", v);
  return b;
}

std::string hex32(std::uint32_t v) {
  char b[16];
  std::snprintf(b, sizeof b, "%08" PRIx32, v);
  return b;
}

std::uint32_t text_crc(const std::string& s) {
  return swap::crc32c(std::as_bytes(std::span<const char>(s.data(), s.size())));
}

IoError corrupt(const std::string& path, const std::string& what,
                std::uint64_t offset = Status::kUnset, std::uint64_t length = Status::kUnset) {
  return IoError(Status::error(ErrorCode::kCorrupt, what)
                     .with_operation("checkpoint load")
                     .with_path(path)
                     .with_range(offset, length));
}

// A data file attached to the engine for the duration of a save or load.
class Attached {
 public:
  Attached(swap::IoEngine& engine, swap::File& file) : engine_(engine), id_(engine.attach(file)) {}
  ~Attached() { engine_.detach(id_); }
  Attached(const Attached&) = delete;
  Attached& operator=(const Attached&) = delete;
  swap::FileId id() const { return id_; }

 private:
  swap::IoEngine& engine_;
  swap::FileId id_;
};

struct ManifestRecord {
  std::size_t group = 0;
  std::uint64_t sub = 0;
  std::uint64_t numel = 0;
  std::uint64_t offset = 0;
  std::uint64_t padded = 0;
  std::uint32_t crc = 0;
};

struct Manifest {
  std::uint64_t step = 0;
  adam::AdamParams hp;  // the set for all groups (OffloadedOptimizer::hyper())
  std::uint64_t sub_group_elements = 0;
  adam::StatePrecision precision = adam::StatePrecision::kF32;
  std::vector<ParamGroupSpec> groups;  // with each group's set in ParamGroupSpec::hyper
  std::vector<ManifestRecord> records;
};

std::string mode_name(adam::AdamMode mode) {
  return mode == adam::AdamMode::kAdamW ? "adamw" : "adam";
}

std::string render(const Manifest& m, const std::string& tier) {
  std::ostringstream o;
  const bool compact = m.precision != adam::StatePrecision::kF32;
  o << kMagic << ' ' << (compact ? kCompactFormatVersion : kFormatVersion) << '\n';
  o << "tier " << tier << '\n';
  o << "step " << m.step << '\n';
  o << "lr " << hexfloat(m.hp.lr) << '\n';
  o << "beta1 " << hexfloat(m.hp.beta1) << '\n';
  o << "beta2 " << hexfloat(m.hp.beta2) << '\n';
  o << "eps " << hexfloat(m.hp.eps) << '\n';
  o << "weight_decay " << hexfloat(m.hp.weight_decay) << '\n';
  o << "grad_scale " << hexfloat(m.hp.grad_scale) << '\n';
  o << "bias_correction " << (m.hp.bias_correction ? 1 : 0) << '\n';
  o << "mode " << mode_name(m.hp.mode) << '\n';
  o << "sub_group_elements " << m.sub_group_elements << '\n';
  if (compact) o << "state_precision " << adam::state_precision_name(m.precision) << '\n';
  o << "groups " << m.groups.size() << '\n';
  for (std::size_t i = 0; i < m.groups.size(); ++i) {
    o << "group " << i << ' ' << m.groups[i].numel << ' ' << m.groups[i].name << '\n';
  }
  // The names run to the end of their lines, so each group's set has a line of its own, in
  // the header's order: lr beta1 beta2 eps weight_decay grad_scale bias_correction mode.
  for (std::size_t i = 0; i < m.groups.size(); ++i) {
    const adam::AdamParams& h = *m.groups[i].hyper;
    o << "hyper " << i << ' ' << hexfloat(h.lr) << ' ' << hexfloat(h.beta1) << ' '
      << hexfloat(h.beta2) << ' ' << hexfloat(h.eps) << ' ' << hexfloat(h.weight_decay) << ' '
      << hexfloat(h.grad_scale) << ' ' << (h.bias_correction ? 1 : 0) << ' ' << mode_name(h.mode)
      << '\n';
  }
  o << "records " << m.records.size() << '\n';
  for (const auto& r : m.records) {
    o << "record " << r.group << ' ' << r.sub << ' ' << r.numel << ' ' << r.offset << ' '
      << r.padded << ' ' << hex32(r.crc) << '\n';
  }
  std::string body = o.str();
  return body + "crc32c " + hex32(text_crc(body)) + '\n';
}

Manifest parse(const std::string& text, const std::string& path) {
  auto bad = [&](const std::string& why) { return corrupt(path, "bad manifest: " + why); };
  const auto crc_at = text.rfind("crc32c ");
  if (crc_at == std::string::npos) throw bad("no crc32c line");
  const std::string body = text.substr(0, crc_at);
  const std::uint32_t want =
      static_cast<std::uint32_t>(std::strtoul(text.c_str() + crc_at + 7, nullptr, 16));
  if (text_crc(body) != want) {
    throw bad("CRC32C mismatch (stored " + hex32(want) + ", computed " + hex32(text_crc(body)) +
              ")");
  }
  std::istringstream in(body);
  Manifest m;
  std::string word;
  int version = 0;
  if (!(in >> word >> version) || word != kMagic) throw bad("not a zinf optimizer checkpoint");
  if (version != 1 && version != kFormatVersion && version != kCompactFormatVersion) {
    throw bad("unsupported format version " + std::to_string(version));
  }
  auto expect = [&](const char* key) {
    if (!(in >> word) || word != key) throw bad(std::string("expected '") + key + "'");
  };
  auto number = [&](const std::string& key) {
    std::string v;
    in >> v;
    char* end = nullptr;
    const double d = std::strtod(v.c_str(), &end);
    if (v.empty() || *end != '\0') throw bad("bad value for " + key);
    return d;
  };
  auto real = [&](const char* key) {
    expect(key);
    return number(key);
  };
  auto mode = [&](const std::string& key) {
    in >> word;
    if (word != "adam" && word != "adamw") throw bad("bad " + key + " '" + word + "'");
    return word == "adamw" ? adam::AdamMode::kAdamW : adam::AdamMode::kAdam;
  };
  auto uint = [&](const char* key) {
    expect(key);
    std::uint64_t v = 0;
    if (!(in >> v)) throw bad(std::string("bad value for ") + key);
    return v;
  };
  expect("tier");
  in >> word;  // informational: a checkpoint loads into either tier
  m.step = uint("step");
  m.hp.lr = real("lr");
  m.hp.beta1 = real("beta1");
  m.hp.beta2 = real("beta2");
  m.hp.eps = real("eps");
  m.hp.weight_decay = real("weight_decay");
  m.hp.grad_scale = real("grad_scale");
  m.hp.bias_correction = uint("bias_correction") != 0;
  expect("mode");
  m.hp.mode = mode("mode");
  m.sub_group_elements = uint("sub_group_elements");
  if (version >= kCompactFormatVersion) {
    expect("state_precision");
    in >> word;
    if (word != "bf16" && word != "int8") throw bad("bad state_precision '" + word + "'");
    m.precision = adam::parse_state_precision(word, "state_precision");
  }
  const std::uint64_t ng = uint("groups");
  for (std::uint64_t i = 0; i < ng; ++i) {
    expect("group");
    std::uint64_t idx = 0;
    ParamGroupSpec g;
    if (!(in >> idx >> g.numel) || idx != i) throw bad("bad group line " + std::to_string(i));
    in.get();  // the space before the name, which runs to the end of the line
    std::getline(in, g.name);
    g.hyper = m.hp;  // format 1: the one set is every group's
    m.groups.push_back(std::move(g));
  }
  for (std::uint64_t i = 0; version >= 2 && i < ng; ++i) {
    const std::string what = "hyper line " + std::to_string(i);
    expect("hyper");
    std::uint64_t idx = 0;
    if (!(in >> idx) || idx != i) throw bad("bad " + what);
    adam::AdamParams& h = *m.groups[i].hyper;
    h.lr = number(what);
    h.beta1 = number(what);
    h.beta2 = number(what);
    h.eps = number(what);
    h.weight_decay = number(what);
    h.grad_scale = number(what);
    std::uint64_t bias_correction = 0;
    if (!(in >> bias_correction)) throw bad("bad " + what);
    h.bias_correction = bias_correction != 0;
    h.mode = mode(what);
  }
  const std::uint64_t nr = uint("records");
  for (std::uint64_t i = 0; i < nr; ++i) {
    expect("record");
    ManifestRecord r;
    std::string crc;
    if (!(in >> r.group >> r.sub >> r.numel >> r.offset >> r.padded >> crc)) {
      throw bad("bad record line " + std::to_string(i));
    }
    r.crc = static_cast<std::uint32_t>(std::strtoul(crc.c_str(), nullptr, 16));
    m.records.push_back(r);
  }
  return m;
}

// A small file of a version: its text and a line with the text's CRC32C.
std::string with_crc_line(const std::string& text) {
  return text + "crc32c " + hex32(text_crc(text)) + "\n";
}

// The text of with_crc_line's file `path` (IoError kCorrupt naming it if the line is missing
// or does not match).
std::string without_crc_line(const std::string& file, const std::string& path) {
  const auto at = file.rfind("crc32c ");
  if (at == std::string::npos || !file.ends_with("\n")) {
    throw corrupt(path, "bad checkpoint file: no crc32c line");
  }
  std::string text = file.substr(0, at);
  const std::string stored = file.substr(at + 7, file.size() - at - 8);
  if (stored != hex32(text_crc(text))) {
    throw corrupt(path, "bad checkpoint file: CRC32C mismatch (stored " + stored + ", computed " +
                            hex32(text_crc(text)) + ")");
  }
  return text;
}

// True for names save() gives version directories ("v" + 12 digits + "-..."), with or without
// ".tmp": only those (and replace_file_durably's temporaries) are ever removed from a
// checkpoint directory.
bool is_version_name(const std::string& n) {
  if (n.size() < 14 || n[0] != 'v' || n[13] != '-') return false;
  for (std::size_t i = 1; i <= 12; ++i) {
    if (n[i] < '0' || n[i] > '9') return false;
  }
  return true;
}

// Opens the state file of a version for reading or (save) writing again, buffered if its
// direct-I/O alignment is stricter than the records' (they are aligned to the store's only).
swap::File reopen_buffered_if_misaligned(swap::File file, const swap::Dir& vdir,
                                         std::uint32_t record_alignment, bool read_only) {
  if (file.alignment() <= record_alignment) return file;
  Status s = file.close();
  s.ignore("reopened at once without O_DIRECT");
  return swap::File::open_existing(vdir, kStateFile,
                                   swap::FileOptions{.read_only = read_only, .direct = false});
}

// A failed save's Status with the checkpoint directory the caller named in front of it: the
// file, offset and length that failed belong to the version being written (a temporary name,
// "<dir>/v<step>-<pid>-<hex>.tmp/state.bin"), which the caller never named. E.g. "save of
// checkpoint /ck: write failed: /ck/v...tmp/state.bin offset=0 length=4096: No space left on
// device (ENOSPC)". Code, errno, path and range stay as they were.
Status naming_checkpoint(Status s, const std::string& dir) {
  const std::string op = s.operation().empty() ? std::string("write") : s.operation();
  return std::move(s).with_operation("save of checkpoint " + dir + ": " + op);
}

// Rethrows the exception being handled, an IoError with naming_checkpoint's text.
[[noreturn]] void rethrow_naming_checkpoint(const swap::Dir& root) {
  try {
    throw;
  } catch (const IoError& e) {
    throw IoError(naming_checkpoint(e.status(), root.path()));
  }
}

bool same_directory(const swap::Dir& a, const swap::Dir& b) {
  struct stat sa {
  }, sb{};
  return ::fstat(a.fd(), &sa) == 0 && ::fstat(b.fd(), &sb) == 0 && sa.st_dev == sb.st_dev &&
         sa.st_ino == sb.st_ino;
}

// True once version `name` was renamed into place: a failure after that leaves it complete
// (the previous one stays current until LATEST names it), so it is not removed.
bool renamed_into_place(const swap::Dir& root, const std::string& name) {
  struct stat st {};
  return ::fstatat(root.fd(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0;
}

// The version directory LATEST names in `root` (IoError kNotFound naming LATEST if there is
// none, kCorrupt if it names no version).
std::string latest_version_name(const swap::Dir& root) {
  std::string name = swap::read_small_file(root, kLatest, kMaxLatestBytes);
  while (!name.empty() && (name.back() == '\n' || name.back() == '\r')) name.pop_back();
  if (!is_version_name(name) || name.find('/') != std::string::npos || name.ends_with(kTmpSuffix)) {
    throw corrupt(root.path_of(kLatest), "LATEST does not name a version directory");
  }
  return name;
}

// File `name` of version directory `vdir` as with_crc_line wrote it, or nullopt if it has none.
std::optional<std::string> read_version_file(const swap::Dir& vdir, const std::string& name) {
  std::string file;
  try {
    file = swap::read_small_file(vdir, name, kMaxCheckpointFileBytes);
  } catch (const IoError& e) {
    if (e.code() == ErrorCode::kNotFound) return std::nullopt;
    throw;
  }
  return without_crc_line(file, vdir.path_of(name));
}

// The run a version's kRunFile names ("run <id>" line), or "" where it has none.
std::string version_run(const swap::Dir& vdir) {
  const std::optional<std::string> text = read_version_file(vdir, kRunFile);
  if (!text || !text->starts_with("run ") || !text->ends_with("\n")) return "";
  return text->substr(4, text->size() - 5);
}

// What a save into `root` supersedes that is not the saving run's own: "step N of run <id>
// (<version path>)" where LATEST names a version of another run that `chain` (the versions
// this optimizer saved or loaded) does not hold, "" otherwise (no LATEST, or one of ours).
// Best effort: what cannot be read is no other run's checkpoint to warn of.
std::string superseded_by_save(const swap::Dir& root, const std::vector<std::string>& chain,
                               const std::string& run) {
  try {
    const std::string name = latest_version_name(root);
    if (std::find(chain.begin(), chain.end(), name) != chain.end()) return "";
    const swap::Dir vdir = root.open_child(name);
    const std::string other = version_run(vdir);
    if (other == run) return "";
    // The step, from the version's name ("v" + 12 digits + "-...").
    const std::uint64_t step = std::strtoull(name.c_str() + 1, nullptr, 10);
    return "step " + std::to_string(step) + " of run " +
           (other.empty() ? std::string("(not recorded)") : other) + " (" + vdir.path() + ")";
  } catch (const std::exception&) {
    return "";
  }
}

}  // namespace

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

  // The new version is current and durable: remove this optimizer's older versions and what
  // interrupted saves left. Under the lock nobody else is writing here, so a .tmp version or
  // a .zinf-tmp- file is a dead process's. Versions of other runs stay. Failures here only
  // cost space, so they are logged.
  const std::string& name = v.name;
  std::vector<std::string> kept{name};
  std::vector<std::string> names;
  try {
    names = root.list();
  } catch (const IoError& e) {
    log(LogLevel::kWarning, std::string("checkpoint: cannot list for cleanup: ") + e.what());
  }
  for (const std::string& n : names) {
    if (n == name) continue;
    const bool ours =
        std::find(checkpoint_chain.begin(), checkpoint_chain.end(), n) != checkpoint_chain.end();
    const bool leftover =
        (is_version_name(n) && n.ends_with(kTmpSuffix)) || swap::is_zinf_temporary(n);
    if (!ours && !leftover) continue;
    try {
      root.remove_tree(n);
      if (leftover) {
        log(LogLevel::kNotice,
            "checkpoint: reclaimed " + root.path_of(n) + ", left by an interrupted save");
      }
    } catch (const std::exception& e) {
      log(LogLevel::kWarning,
          std::string("checkpoint: cannot remove ") + root.path_of(n) + ": " + e.what());
      if (ours) kept.push_back(n);  // tried again after the next save
    }
  }
  checkpoint_chain = std::move(kept);
  checkpoint_phase("done", v.total);
}

void OffloadedOptimizer::Impl::save(const CheckpointPlace& dir) {
  VersionWrite v = begin_version(dir);
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

// ---------------------------------------------------------------------------------------------
// Asynchronous save
//
// save_async() captures the step, hyper-parameters and layout at once (begin_version) and
// leaves the records' bytes where they are; a saver thread then writes record after record
// into the new version's state file, and commits it as save() does. The steps that follow may
// run meanwhile: right before a step updates a record the saver has not written yet, the step
// pipeline (protect_snapshot) copies the record's bytes as they are — the snapshot's — into one
// of eight buffers of the save's own and hands them to the saver, which writes them first; a
// record the saver is reading or writing at that moment is waited for. So each record is
// written with its bytes at the save's step, whatever the steps after it do, and a step is
// held up by at most one record's copy (or the saver's records in flight, or a wait for a free
// copy buffer).
//
// Between steps the saver streams the records still in place with kOwnBuffers of them in
// flight: it reads the next record while it writes the one before, so the drive serves a read
// and a write at once rather than one after the other. It commits (syncs the state file, the
// manifest, LATEST, then removes the superseded version) only between steps too: on ext4
// behind a virtual disk that took 0.25-0.7 s, and a step it overlapped took 3-4x its time
// (`zinf bench step --checkpoint-every`), most of what the save cost the steps.
//
// Reflink: where save_async() could clone every record's blocks from the swap files into the
// state file (clone_records), the state file already is the snapshot, fixed by copy-on-write
// whatever the steps write to the swap files afterwards. The saver then only reads it back
// record by record, checks it against the swap store's unit checksums taken at the clone
// (so corrupt bytes are never saved, as on the streaming path) and computes the manifest's
// CRCs; steps copy nothing and never wait for the save.

class OffloadedOptimizer::Impl::AsyncSave {
 public:
  // Eight: with two, a step that reached the records ahead of the save waited for the save's
  // writes record by record (`zinf bench step --checkpoint-every`: 1.6 s of waits in 10 steps
  // at 32M elements); with eight it did not wait at all there.
  enum class State : std::uint8_t { kPending, kSaving, kCopied, kDone };

  static constexpr std::size_t kCopyBuffers = 8;
  // The saver's own reads, after the copy buffers: two, so that one record is read while the
  // one read before it is written. The save holds kBuffers records of host memory in all.
  static constexpr std::size_t kOwnBuffers = 2;
  static constexpr std::size_t kBuffers = kCopyBuffers + kOwnBuffers;

  // `pool` holds kBuffers records (Impl::save_pool, kept from one save to the next: a fresh
  // mapping per save cost its page faults in the first step after each save_async).
  // `cloned_sums`: the records were cloned into v's state file (clone_records), with these
  // unit checksums; empty: stream them.
  AsyncSave(Impl& opt, VersionWrite v, swap::BufferPool& pool,
            std::vector<std::vector<std::uint32_t>> cloned_sums)
      : opt_(opt),
        v_(std::move(v)),
        state_(opt.records.size(), State::kPending),
        last_close_(opt.last_step_end),
        last_idle_(opt.last_between_steps),
        cloned_(!cloned_sums.empty()),
        cloned_sums_(std::move(cloned_sums)) {
    for (std::size_t b = 0; b < kBuffers; ++b)
      buffers_.push_back(pool.acquire(opt.max_record_bytes));
    free_.assign(kCopyBuffers, true);
    thread_ = std::thread([this] { run(); });
  }
  ~AsyncSave() { (void)wait(); }
  AsyncSave(const AsyncSave&) = delete;
  AsyncSave& operator=(const AsyncSave&) = delete;

  // Joins the saver; its error (or OK). Controlling thread only.
  Status wait() {
    if (thread_.joinable()) thread_.join();
    return error_;
  }
  bool finished() const {
    std::lock_guard g(mu_);
    return finished_;
  }
  // A step opened or closed. While one is open the save writes only the copies steps hand it,
  // and reads and writes the records still in place between steps: the step's own reads and
  // write-backs then have the drive (and the shared I/O engine's queue) to themselves, and
  // the save uses the time a trainer spends in forward and backward.
  void set_step_open(bool open) {
    std::lock_guard g(mu_);
    const auto now = OptClock::now();
    if (open && last_close_ != OptClock::time_point{}) last_idle_ = now - last_close_;
    if (!open) {
      ++closes_;
      last_close_ = now;
    }
    step_open_ = open;
    cv_.notify_all();
  }

  void protect(std::size_t r, const std::byte* base, const std::vector<std::uint32_t>* expected,
               double& waited, std::uint64_t& copied) {
    if (cloned_) return;  // the clone holds the snapshot: the step may overwrite the record
    std::unique_lock lk(mu_);
    const auto t0 = OptClock::now();
    auto ready = [&] {
      if (finished_ || state_[r] == State::kDone || state_[r] == State::kCopied) return true;
      return state_[r] == State::kPending && free_slot() >= 0;
    };
    if (!ready()) {
      cv_.wait(lk, ready);
      waited += std::chrono::duration<double>(OptClock::now() - t0).count();
    }
    if (finished_ || state_[r] != State::kPending) return;
    const int b = free_slot();
    free_[static_cast<std::size_t>(b)] = false;
    state_[r] = State::kCopied;
    lk.unlock();
    const Record& rec = opt_.records[r];
    std::memcpy(buffers_[static_cast<std::size_t>(b)].data(), base, rec.padded);
    copied += rec.padded;
    lk.lock();
    queue_.push_back(
        {r, static_cast<std::size_t>(b), expected ? *expected : std::vector<std::uint32_t>{}});
    cv_.notify_all();
  }

 private:
  struct Copied {
    std::size_t record;
    std::size_t buffer;
    std::vector<std::uint32_t> expected;  // the store's unit CRCs (folded checksums), or none
  };
  // A record the saver reads into one of its own buffers and then writes from it.
  struct InFlight {
    std::size_t record;
    std::size_t buffer;
    std::byte* data;    // the record's bytes: in the buffer, or where the store keeps it
    swap::IoTicket io;  // the read, then the write
    bool writing = false;
  };

  int free_slot() const {
    for (std::size_t b = 0; b < free_.size(); ++b) {
      if (free_[b]) return static_cast<int>(b);
    }
    return -1;
  }

  // Notes record r's CRC and submits its write from `base` at its offset; written() once the
  // ticket completed.
  swap::IoTicket submit_write(swap::FileId id, std::size_t r, std::byte* base) {
    const Record& rec = opt_.records[r];
    v_.crcs[r] = swap::crc32c(std::span<const std::byte>(base, rec.bytes));
    swap::IoRequest req{swap::IoOp::kWrite, id, v_.offsets[r],
                        std::span<std::byte>(base, rec.padded)};
    return opt_.engine->submit(std::span<const swap::IoRequest>(&req, 1));
  }
  void written(std::size_t r) {
    written_ += opt_.records[r].padded;
    opt_.checkpoint_phase("data", written_);
  }
  void write_record(swap::FileId id, std::size_t r, std::byte* base) {
    submit_write(id, r, base).wait();
    written(r);
  }

  // Returns when a sync of the commit should start: at once while no step is open and the
  // time between steps has just begun (or was never seen: no steps), else at the next step's
  // close. A sync started late between steps ran into the next step: on ext4 behind a virtual
  // disk the state file's fsync took 0.3-0.45 s, and started 0.2 s into 0.3 s between steps it
  // stretched the next step from 0.17 s to 0.53 s. Bounded: if no step closes within twice
  // the last time between steps, it starts once none is open (the steps stopped, or no longer
  // pause); steps back to back (no moment without one) let it start at the first close.
  void wait_between_steps() {
    std::unique_lock lk(mu_);
    const std::uint64_t seen = closes_;
    auto open_over = [&] { return !step_open_ || closes_ != seen; };
    if (step_open_) {
      cv_.wait(lk, open_over);
      return;
    }
    if (last_idle_ <= OptClock::duration::zero()) return;
    if (OptClock::now() - last_close_ < last_idle_ / 2) return;
    if (cv_.wait_until(lk, last_close_ + 2 * last_idle_, [&] { return closes_ != seen; })) return;
    cv_.wait(lk, open_over);
  }

  // A copy made from a ring buffer before the update verified it: check it against the
  // store's unit CRCs here, so that corrupt bytes are never saved.
  void verify_copy(const Copied& c) const {
    verify_units(c.record, buffers_[c.buffer].data(), c.expected);
  }

  // Checks record r's padded bytes at `base` against its swap stripe units' CRCs (none:
  // nothing to check).
  void verify_units(std::size_t r, const std::byte* base,
                    const std::vector<std::uint32_t>& expected) const {
    if (expected.empty()) return;
    const Record& rec = opt_.records[r];
    swap::SwapStore& sw = *opt_.store->swap_store();  // unit sums come from a swap store
    const std::uint64_t unit = sw.stripe_bytes();
    for (std::size_t u = 0; u < expected.size(); ++u) {
      const std::uint64_t begin = u * unit;
      const std::uint64_t len = std::min<std::uint64_t>(unit, rec.padded - begin);
      const std::uint32_t got = swap::crc32c(std::span<const std::byte>(base + begin, len));
      if (got != expected[u]) {
        throw IoError(sw.checksum_error(rec.key, u, expected[u], got));
      }
    }
  }

  // The reflink path: the state file holds every record already; read each back (between
  // steps, as the streaming path reads the swap store: the steps keep the drive), check it
  // and note its CRC.
  void check_clones(swap::FileId id) {
    std::byte* base = buffers_[kCopyBuffers].data();
    for (std::size_t r = 0; r < state_.size(); ++r) {
      {
        std::unique_lock lk(mu_);
        cv_.wait(lk, [&] { return !step_open_; });
      }
      const Record& rec = opt_.records[r];
      swap::IoRequest req{swap::IoOp::kRead, id, v_.offsets[r],
                          std::span<std::byte>(base, rec.padded)};
      opt_.engine->submit(std::span<const swap::IoRequest>(&req, 1)).wait();
      verify_units(r, base, cloned_sums_[r]);
      v_.crcs[r] = swap::crc32c(std::span<const std::byte>(base, rec.bytes));
      written_ += rec.padded;
      opt_.checkpoint_phase("data", written_);
    }
  }

  // The streaming path. From the last record down: a step updates records from the first up,
  // so the two meet once instead of the step finding, record after record, the one the save
  // is writing; and the records the step reaches first it copies, which saves their reads.
  // The steps' copies go first (they hold the copy buffers the next step may need); records
  // still in place are read only between steps, up to kOwnBuffers in flight.
  void stream_records(swap::FileId id) {
    std::deque<InFlight> own;  // oldest first
    std::vector<std::size_t> own_free;
    for (std::size_t b = kCopyBuffers; b < kBuffers; ++b) own_free.push_back(b);
    std::size_t left = state_.size();  // records at or after it are not pending
    try {
      for (;;) {
        std::unique_lock lk(mu_);
        while (left > 0 && state_[left - 1] != State::kPending) --left;
        if (queue_.empty() && left == 0 && own.empty()) {
          // Every record is copied or done: wait for the copies still queued to be written.
          if (std::all_of(state_.begin(), state_.end(),
                          [](State st) { return st == State::kDone; })) {
            break;
          }
          cv_.wait(lk, [&] { return !queue_.empty(); });
        }
        if (!queue_.empty()) {
          Copied c = std::move(queue_.front());
          queue_.pop_front();
          lk.unlock();
          verify_copy(c);
          write_record(id, c.record, buffers_[c.buffer].data());
          lk.lock();
          state_[c.record] = State::kDone;
          free_[c.buffer] = true;
          cv_.notify_all();
          continue;
        }
        if (left > 0 && !step_open_ && !own_free.empty()) {
          const std::size_t r = left - 1;
          state_[r] = State::kSaving;
          lk.unlock();
          const std::size_t b = own_free.back();
          own_free.pop_back();
          // The store reads it into the buffer (checked: with swap checksums a corrupt
          // record fails at its wait, unsaved), or it is in memory and written from there.
          StateStore::Copy got = opt_.store->read_copy(r, buffers_[b].span());
          if (got.io) {
            own.push_back({r, b, got.data, std::move(*got.io), false});
          } else {
            own.push_back({r, b, got.data, submit_write(id, r, got.data), true});
          }
          continue;
        }
        if (!own.empty()) {
          lk.unlock();
          InFlight& f = own.front();
          f.io.wait();
          if (!f.writing) {
            f.io = submit_write(id, f.record, f.data);
            f.writing = true;
            continue;
          }
          written(f.record);
          own_free.push_back(f.buffer);
          const std::size_t r = f.record;
          own.pop_front();
          lk.lock();
          state_[r] = State::kDone;
          cv_.notify_all();
          continue;
        }
        // Records are pending but a step is open: wait for its copies or its end.
        cv_.wait(lk, [&] { return !queue_.empty() || !step_open_; });
      }
    } catch (...) {
      // The buffers and the state file outlive this call, not the I/O still in flight on them.
      for (InFlight& f : own) f.io.wait_status().ignore("the save failed already");
      throw;
    }
  }

  void run() {
    try {
      if (cloned_) {
        Attached att(*opt_.engine, v_.file);
        check_clones(att.id());
      } else {
        Attached att(*opt_.engine, v_.file);
        stream_records(att.id());
      }
      // Each of the commit's syncs (and the removal of the version it supersedes) starts
      // between steps, so that a step overlaps at most one of them.
      opt_.commit_version(v_, [this] { wait_between_steps(); });
    } catch (...) {
      error_ = naming_checkpoint(status_from_current_exception(), opt_.checkpoint_dir.path());
      if (!renamed_into_place(opt_.checkpoint_dir, v_.name)) opt_.abandon_version(v_);
    }
    std::lock_guard g(mu_);
    finished_ = true;  // the steps no longer wait for records of this save
    cv_.notify_all();
  }

  Impl& opt_;
  VersionWrite v_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<State> state_;  // guarded by mu_
  std::deque<Copied> queue_;  // guarded by mu_
  std::vector<bool> free_;    // guarded by mu_: copy buffers not holding a queued copy
  bool finished_ = false;     // guarded by mu_
  bool step_open_ = false;    // guarded by mu_
  // Guarded by mu_, for wait_between_steps: set_step_open(false) calls, the last one's time
  // (at first, the end of the step before the save), and the time from a close to the open
  // after it (at first, the optimizer's last).
  std::uint64_t closes_ = 0;
  OptClock::time_point last_close_;
  OptClock::duration last_idle_;
  const bool cloned_;                                          // the reflink path: see check_clones
  const std::vector<std::vector<std::uint32_t>> cloned_sums_;  // per record, at the clone
  std::vector<swap::BufferLease> buffers_;
  std::uint64_t written_ = 0;  // saver thread only
  Status error_;               // set by the saver before it ends; read after join
  std::thread thread_;         // last: started once everything above exists
};

void OffloadedOptimizer::Impl::protect_snapshot(AsyncSave& save, std::size_t record,
                                                const std::byte* base,
                                                const std::vector<std::uint32_t>* expected,
                                                double& waited, std::uint64_t& copied) {
  save.protect(record, base, expected, waited, copied);
}

void OffloadedOptimizer::Impl::snapshot_step(AsyncSave& save, bool open) {
  save.set_step_open(open);
}

void OffloadedOptimizer::Impl::save_async(const CheckpointPlace& dir) {
  wait_save();  // the previous one's error, if any, is thrown here and nothing new starts
  if (!save_pool) {
    save_pool = std::make_unique<swap::BufferPool>(
        swap::BufferPoolOptions{.budget_bytes = AsyncSave::kBuffers * max_record_bytes,
                                .alignment = std::max<std::uint32_t>(alignment, 4096)});
  }
  VersionWrite v = begin_version(dir);
  std::vector<std::vector<std::uint32_t>> sums;
  std::string why;
  bool cloned = false;
  try {
    cloned = store->clone_records(options.checkpoint_reflink, v.file, v.offsets, sums, why,
                                  checkpoint_dir.path());
    if (cloned) checkpoint_phase("cloned", v.total);
  } catch (...) {
    abandon_version(v);
    rethrow_naming_checkpoint(checkpoint_dir);
  }
  // A notice when the path (or the reason to stream) changes, not at every save: a run saving
  // every few steps would otherwise repeat the same line all along.
  if (cloned) {
    const bool again = last_snapshot == SaveSnapshot::kReflink;
    log(again ? LogLevel::kInfo : LogLevel::kNotice,
        "checkpoint: snapshot by reflink (" + std::to_string(records.size()) + " records, " +
            std::to_string(v.total) + " bytes) into " + v.vdir.path());
    last_stream_reason.clear();
  } else {
    sums.clear();
    const bool again = last_snapshot == SaveSnapshot::kStreamed && why == last_stream_reason;
    log(again ? LogLevel::kDebug : LogLevel::kNotice,
        "checkpoint: streamed, not snapshot by reflink: " + why);
    last_stream_reason = why;
  }
  last_snapshot = cloned ? SaveSnapshot::kReflink : SaveSnapshot::kStreamed;
  async_save = std::make_shared<AsyncSave>(*this, std::move(v), *save_pool, std::move(sums));
}

bool OffloadedOptimizer::Impl::save_running() const {
  return async_save && !async_save->finished();
}

void OffloadedOptimizer::Impl::wait_save() {
  if (!async_save) return;
  // Called inside a step, the save must not wait for that step to close: it goes on at once.
  async_save->set_step_open(false);
  const Status s = async_save->wait();
  async_save.reset();
  throw_if_error(s);
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
