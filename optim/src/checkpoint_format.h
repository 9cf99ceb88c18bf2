// SPDX-License-Identifier: Apache-2.0
// The checkpoint's on-disk format and the helpers its writers and reader share
// (checkpoint_format.cc): save and load (optimizer_checkpoint.cc) and the asynchronous save
// (optimizer_async_save.cc). Private to zinf::optim.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "zinf/adam/cpu_adam.h"
#include "zinf/common/error.h"
#include "zinf/common/status.h"
#include "zinf/optim/optimizer.h"
#include "zinf/swap/dir.h"
#include "zinf/swap/file.h"
#include "zinf/swap/io_engine.h"

namespace zinf::optim {

inline constexpr const char* kLatest = "LATEST";
inline constexpr const char* kStateFile = "state.bin";
inline constexpr const char* kManifestFile = "manifest";
// A manifest holds a line per record (tens of bytes each).
inline constexpr std::uint64_t kMaxManifestBytes = std::uint64_t{64} << 20;
inline constexpr std::string_view kTmpSuffix = ".tmp";
// In each version beside state.bin and manifest (both optional on load: versions saved before
// them have neither): the run that saved it, and the caller's set_checkpoint_file texts. Each
// is its text and a "crc32c <hex>" line.
inline constexpr const char* kRunFile = "run";

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

/// "%08x" of `v`: how CRCs are written in manifests and errors.
std::string hex32(std::uint32_t v);
/// IoError kCorrupt of a checkpoint load, naming `path` and the range, if any.
IoError corrupt(const std::string& path, const std::string& what,
                std::uint64_t offset = Status::kUnset, std::uint64_t length = Status::kUnset);
/// The manifest's text (its last line the CRC32C of the others), and its reading (IoError
/// kCorrupt naming `path` for anything it does not accept). `tier` is informational.
std::string render(const Manifest& m, const std::string& tier);
Manifest parse(const std::string& text, const std::string& path);
/// A small file of a version: its text and a CRC line, and back (kCorrupt naming `path`).
std::string with_crc_line(const std::string& text);
std::string without_crc_line(const std::string& file, const std::string& path);
/// True for the names save() gives version directories, with or without kTmpSuffix.
bool is_version_name(const std::string& n);
/// A version's state file, reopened without O_DIRECT if its alignment is stricter than the
/// records'.
swap::File reopen_buffered_if_misaligned(swap::File file, const swap::Dir& vdir,
                                         std::uint32_t record_alignment, bool read_only);
/// A failed save's Status with the checkpoint directory `dir` in front of its operation, and
/// the exception being handled rethrown so (IoError only; others as they are).
Status naming_checkpoint(Status s, const std::string& dir);
[[noreturn]] void rethrow_naming_checkpoint(const swap::Dir& root);
bool same_directory(const swap::Dir& a, const swap::Dir& b);
/// True once version `name` was renamed into place in `root`.
bool renamed_into_place(const swap::Dir& root, const std::string& name);
/// The version LATEST names (kNotFound without LATEST, kCorrupt if it names no version).
std::string latest_version_name(const swap::Dir& root);
/// File `name` of a version as with_crc_line wrote it, nullopt if it has none; and the run
/// its kRunFile names ("" for none).
std::optional<std::string> read_version_file(const swap::Dir& vdir, const std::string& name);
std::string version_run(const swap::Dir& vdir);
/// What a save into `root` supersedes of another run ("step N of run <id> (<path>)"), "" if
/// nothing (see checkpoint_format.cc).
std::string superseded_by_save(const swap::Dir& root, const std::vector<std::string>& chain,
                               const std::string& run);

}  // namespace zinf::optim
