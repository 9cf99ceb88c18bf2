// SPDX-License-Identifier: Apache-2.0
// The checkpoint's on-disk format (optimizer_checkpoint.cc describes the scheme): the text
// manifest with its CRC32C, the small files of a version with their CRC line, the names of
// versions, and the reading of LATEST.
#include "checkpoint_format.h"

#include <sys/stat.h>

#include <fcntl.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "zinf/common/error.h"
#include "zinf/swap/crc32c.h"

namespace zinf::optim {
namespace {

constexpr const char* kMagic = "zinf-optimizer-checkpoint";
// 2 adds a "hyper" line per group after the group lines; 1 (one set for every group, the
// header's) still loads. 3 adds a "state_precision" line after sub_group_elements; it is
// written only for compact moments (bf16, int8), so an fp32 checkpoint stays format 2, byte
// for byte what earlier versions wrote and read, and an earlier reader refuses a compact one
// by its version instead of misreading its records.
constexpr int kFormatVersion = 2;
constexpr int kCompactFormatVersion = 3;
// LATEST holds one version name.
constexpr std::uint64_t kMaxLatestBytes = 4096;
constexpr std::uint64_t kMaxCheckpointFileBytes = 64 << 10;

std::string hexfloat(double v) {
  char b[64];
  std::snprintf(b, sizeof b, "%a", v);
  return b;
}

std::uint32_t text_crc(const std::string& s) {
  return swap::crc32c(std::as_bytes(std::span<const char>(s.data(), s.size())));
}

std::string mode_name(adam::AdamMode mode) {
  return mode == adam::AdamMode::kAdamW ? "adamw" : "adam";
}

}  // namespace

std::string hex32(std::uint32_t v) {
  char b[16];
  std::snprintf(b, sizeof b, "%08" PRIx32, v);
  return b;
}

IoError corrupt(const std::string& path, const std::string& what, std::uint64_t offset,
                std::uint64_t length) {
  return IoError(Status::error(ErrorCode::kCorrupt, what)
                     .with_operation("checkpoint load")
                     .with_path(path)
                     .with_range(offset, length));
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

}  // namespace zinf::optim
