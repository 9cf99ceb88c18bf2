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
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "optimizer_impl.h"
#include "zinf/common/error.h"
#include "zinf/common/log.h"
#include "zinf/swap/crc32c.h"
#include "zinf/swap/dir.h"
#include "zinf/swap/file.h"

namespace zinf::offload {
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

bool same_directory(const swap::Dir& a, const swap::Dir& b) {
  struct stat sa {
  }, sb{};
  return ::fstat(a.fd(), &sa) == 0 && ::fstat(b.fd(), &sb) == 0 && sa.st_dev == sb.st_dev &&
         sa.st_ino == sb.st_ino;
}

}  // namespace

void OffloadedOptimizer::Impl::save(const std::string& dir) {
  for (std::size_t g = 0; g < groups.size(); ++g) {
    if (!initialized[g]) {
      throw UsageError("OffloadedOptimizer::save: group '" + groups[g].name +
                       "' has no state yet (call set_params first)");
    }
  }
  auto hook = [&](std::string_view phase, std::uint64_t bytes) {
    if (checkpoint_hook) checkpoint_hook(phase, bytes);
  };
  const swap::Dir& root = open_checkpoint_dir(dir, /*create=*/true);

  // An unpredictable name: nothing can be planted at it (or inside it) in advance, and two
  // saves can never pick the same one. The prefix keeps is_version_name() and the step.
  char prefix[32];
  std::snprintf(prefix, sizeof prefix, "v%012" PRIu64 "-", steps_done);
  const std::string name = swap::unique_name(prefix);
  const std::string tmp = name + std::string(kTmpSuffix);
  swap::Dir vdir = root.create_child(tmp);
  // Removes the partial version on any failure (a kill leaves it for the next save to remove).
  struct RemoveTmp {
    const swap::Dir& root;
    std::string name;
    bool armed = true;
    ~RemoveTmp() {
      if (!armed) return;
      try {
        root.remove_tree(name);
      } catch (const std::exception& e) {
        log(LogLevel::kWarning,
            std::string("checkpoint: cannot remove a failed save: ") + e.what());
      }
    }
  } remove_tmp{root, tmp};
  hook("created", 0);

  Manifest m;
  m.step = steps_done;
  m.hp = hyper;
  m.sub_group_elements = options.sub_group_elements;
  m.precision = options.state_precision;
  m.groups = groups;
  for (std::size_t g = 0; g < groups.size(); ++g) m.groups[g].hyper = group_hyper[g];
  std::uint64_t offset = 0;
  for (const auto& r : records) {
    m.records.push_back({r.group, r.sub, r.numel, offset, r.padded, 0});
    offset += r.padded;
  }
  const std::uint64_t total = offset;

  swap::File file = reopen_buffered_if_misaligned(
      swap::File::create_exclusive(vdir, kStateFile, swap::FileOptions{.preallocate_bytes = total}),
      vdir, alignment, /*read_only=*/false);
  {
    Attached att(*engine, file);
    std::uint64_t written = 0;
    ring_pipeline(
        records.size(),
        [&](std::size_t i, swap::BufferLease& buf) -> swap::IoTicket {
          if (!nvme()) return {};
          return store->swap_in(records[i].key, buf.span());
        },
        [&](std::size_t i, swap::BufferLease& buf) -> swap::IoTicket {
          Record& rec = records[i];
          std::byte* base = nvme() ? buf.data() : rec.state.data();
          m.records[i].crc =
              swap::crc32c(std::span<const std::byte>(base, rec.bytes));
          swap::IoRequest req{swap::IoOp::kWrite, att.id(), m.records[i].offset,
                              std::span<std::byte>(base, rec.padded)};
          swap::IoTicket t = engine->submit(std::span<const swap::IoRequest>(&req, 1));
          written += rec.padded;
          hook("data", written);
          return t;
        });
  }
  throw_if_error(file.sync());
  throw_if_error(file.close());
  swap::create_file_durably(vdir, kManifestFile,
                            render(m, std::string(state_tier_name(options.tier))));
  vdir.sync();
  hook("synced", total);

  root.rename(tmp, name);
  remove_tmp.armed = false;
  root.sync();
  hook("committed", total);

  swap::replace_file_durably(root, kLatest, name + "\n");
  hook("latest", total);

  // The new version is current and durable: remove this optimizer's older versions and what
  // interrupted saves left. Under the lock nobody else is writing here, so a .tmp version or
  // a .zinf-tmp- file is a dead process's. Versions of other runs stay. Failures here only
  // cost space, so they are logged.
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
  hook("done", total);
}

const swap::Dir& OffloadedOptimizer::Impl::open_checkpoint_dir(const std::string& dir,
                                                               bool create) {
  if (create) {
    // The path as the caller gave it, links in it followed: the caller chose it. Everything
    // inside goes through the descriptor opened next.
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) throw IoError(Status::from_errno(ec.value(), "create checkpoint directory", dir));
  }
  swap::Dir opened = swap::Dir::open(dir);
  if (checkpoint_dir.is_open() && same_directory(opened, checkpoint_dir)) return checkpoint_dir;
  opened.lock_or_throw("checkpoints of an OffloadedOptimizer");
  // Moving on: the old directory's lock goes with its descriptor, and the versions there are
  // no longer ours to remove.
  checkpoint_dir = std::move(opened);
  checkpoint_chain.clear();
  return checkpoint_dir;
}

void OffloadedOptimizer::Impl::load(const std::string& dir) {
  const swap::Dir& root = open_checkpoint_dir(dir, /*create=*/false);
  const std::string latest_path = root.path_of(kLatest);
  std::string name = swap::read_small_file(root, kLatest, kMaxLatestBytes);
  while (!name.empty() && (name.back() == '\n' || name.back() == '\r')) name.pop_back();
  if (!is_version_name(name) || name.find('/') != std::string::npos || name.ends_with(kTmpSuffix)) {
    throw corrupt(latest_path, "LATEST does not name a version directory");
  }
  const swap::Dir vdir = root.open_child(name);
  const std::string& vpath = vdir.path();
  const std::string manifest_path = vdir.path_of(kManifestFile);
  const Manifest m =
      parse(swap::read_small_file(vdir, kManifestFile, kMaxManifestBytes), manifest_path);

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
    mismatch("state_precision " + std::string(adam::state_precision_name(m.precision)) +
             ", here " + std::string(adam::state_precision_name(options.state_precision)));
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
        [&](std::size_t i, swap::BufferLease& buf) -> swap::IoTicket {
          Record& rec = records[i];
          std::byte* base = nvme() ? buf.data() : rec.state.data();
          swap::IoRequest req{swap::IoOp::kRead, att.id(), m.records[i].offset,
                              std::span<std::byte>(base, rec.padded)};
          return engine->submit(std::span<const swap::IoRequest>(&req, 1));
        },
        [&](std::size_t i, swap::BufferLease& buf) -> swap::IoTicket {
          Record& rec = records[i];
          std::byte* base = nvme() ? buf.data() : rec.state.data();
          const std::uint64_t bytes = rec.bytes;
          const std::uint32_t got = swap::crc32c(std::span<const std::byte>(base, bytes));
          if (got != m.records[i].crc) {
            throw corrupt(state_path,
                          "CRC32C mismatch in group '" + groups[rec.group].name + "' sub-group " +
                              std::to_string(rec.sub) + ": stored " + hex32(m.records[i].crc) +
                              ", computed " + hex32(got),
                          m.records[i].offset, bytes);
          }
          if (!nvme()) return {};
          return store->swap_out(rec.key, buf.span());
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
  // Superseded by this optimizer's next save, which removes it.
  if (std::find(checkpoint_chain.begin(), checkpoint_chain.end(), name) == checkpoint_chain.end()) {
    checkpoint_chain.push_back(name);
  }
}

}  // namespace zinf::offload
