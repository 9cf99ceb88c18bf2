// SPDX-License-Identifier: Apache-2.0
// Corrupts a swap file behind zinf's back, as a failing drive or a stray write would: finds
// the file through this process's open descriptors (/proc/self/fd) rather than by name, so it
// works whether the store names its files or keeps them anonymous (O_TMPFILE, or unlinked
// after creation: the link then reads "<dir>/<name> (deleted)").
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace zinf::test {

/// One regular file this process has open under a directory.
struct OpenFile {
  int fd = -1;         ///< one of the descriptors open on it
  std::string target;  ///< what /proc/self/fd/<fd> links to
};

/// The distinct regular files (by device and inode) that this process has open under `dir`,
/// each with one of its descriptors. Throws std::runtime_error if /proc/self/fd is unreadable.
std::vector<OpenFile> open_files_under(const std::string& dir);

/// A byte changed by flip_swap_file_byte.
struct FlippedByte {
  OpenFile file;
  std::uint64_t offset = 0;
  std::byte before{};
  std::byte after{};
};

/// XORs the byte at `offset` of the one file open under `dir` with `mask` and makes it durable
/// (fdatasync), through a fresh buffered descriptor (the store's may be O_DIRECT, which allows
/// no 1-byte write). Throws std::runtime_error naming `dir` unless exactly one file is open
/// under it (give the store's own directory), or if the read or write fails.
FlippedByte flip_swap_file_byte(const std::string& dir, std::uint64_t offset,
                                std::byte mask = std::byte{0xff});

/// Reads `length` bytes at `offset` of the one file open under `dir` (rules as above).
std::vector<std::byte> read_swap_file(const std::string& dir, std::uint64_t offset,
                                      std::size_t length);

}  // namespace zinf::test
