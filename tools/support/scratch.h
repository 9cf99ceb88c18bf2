// SPDX-License-Identifier: Apache-2.0
// The directories the commands make scratch files in, and the files the user names for output:
// opened once, never through a link, with nothing left behind. Apart from bench_common so that
// `zinf bench adam`, which makes no file, does not link the I/O layers.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "zinf/common/unique_fd.h"
#include "zinf/swap/dir.h"

namespace zinf::tools {

/// Where the commands make their files when no --dir is given.
inline constexpr const char* kDefaultScratchDir = "./zinf-scratch";

/// With no --dir given (`dirs` empty): kDefaultScratchDir, created if missing. A failure to
/// create it is not an error here: check_dir then names the directory.
void default_scratch_dir(std::vector<std::string>& dirs);
/// default_scratch_dir, then check_dir on each directory: the --dir of bench io, bench
/// prefetch and stress.
void check_scratch_dirs(std::vector<std::string>& dirs);

/// Opens `dir` (a swap::Dir: the files a command makes there are created relative to this one
/// descriptor, never through a link) after checking that it exists, is a directory and accepts
/// a new file; UsageError (exit status 2) naming the directory otherwise. The write probe has
/// no name (open_unnamed_probe), so nothing planted in `dir` is touched and a killed run
/// leaves nothing behind.
swap::Dir check_dir(const std::string& dir);
/// Opens a new read-write file in `dir` that no name points to (swap::Dir::open_unnamed), with
/// `extra_flags` added (O_DIRECT for a probe). Returns it, or an empty UniqueFd with `error`
/// set to the errno. Quiet, unlike File::create_unnamed, which logs its fallback from
/// O_DIRECT: for probes whose failure is itself the answer.
UniqueFd open_unnamed_probe(const swap::Dir& dir, int extra_flags, int& error);
/// Writes `text` as the file at `path`, a file the user named (--out, --report): to a fresh
/// temporary in the same directory, fsynced, then renamed over `path` (swap::
/// replace_file_durably). So a reader never sees half a file, a crash leaves the old one, and
/// a link at `path` is replaced by the file rather than followed (zinf may run as root in a
/// directory others can write to). Throws IoError naming the file.
void write_output_file(const std::string& path, std::string_view text);

}  // namespace zinf::tools
