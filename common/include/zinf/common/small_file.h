// SPDX-License-Identifier: Apache-2.0
// Reading a small file a user names (a config, a tune report) whole, without the ways such a
// path can hang or exhaust the process: a FIFO (opening it would wait for a writer), a device
// or directory, a file of gigabytes. Part of zinf::common.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <string_view>

namespace zinf {

/// What kind of file a stat mode is, in words ("a FIFO", "a directory", "a character
/// device", ...), for errors.
std::string_view file_kind(mode_t mode) noexcept;

/// The bytes of the regular file at `path`, at most `max_bytes` of them. Opened non-blocking,
/// so a FIFO never blocks, and checked with fstat before anything is read. `what` names the
/// file in errors ("config", "--tune file"). Throws IoError (open/stat/read, with the real
/// errno and the path) or UsageError: "<path>: the <what> is a FIFO, not a regular file<remedy>"
/// and "<path>: the <what> is larger than the limit of N bytes (M MiB)". Thread-safe.
std::string read_small_regular_file(const std::string& path, std::uint64_t max_bytes,
                                    std::string_view what, std::string_view remedy = "");

}  // namespace zinf
