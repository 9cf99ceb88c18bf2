// SPDX-License-Identifier: Apache-2.0
#include "scratch.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>

#include "zinf/common/error.h"

namespace zinf::tools {

swap::Dir check_dir(const std::string& dir) {
  if (dir.empty()) throw UsageError("directory does not exist: (empty name)");
  swap::Dir d;
  try {
    d = swap::Dir::open(dir);
  } catch (const IoError& e) {
    switch (e.sys_errno()) {
      case ENOENT: throw UsageError("directory does not exist: " + dir);
      case ENOTDIR: throw UsageError("not a directory: " + dir);
      default: throw UsageError("cannot open directory " + dir + ": " + e.what());
    }
  }
  int err = 0;
  if (!open_unnamed_probe(d, 0, err).valid()) {
    throw UsageError("directory is not writable: " + dir + " (" + std::strerror(err) + ")");
  }
  return d;
}

void default_scratch_dir(std::vector<std::string>& dirs) {
  if (!dirs.empty()) return;
  dirs.push_back(kDefaultScratchDir);
  std::error_code ec;
  std::filesystem::create_directories(dirs[0], ec);
}

void check_scratch_dirs(std::vector<std::string>& dirs) {
  default_scratch_dir(dirs);
  for (const auto& d : dirs) check_dir(d);
}

UniqueFd open_unnamed_probe(const swap::Dir& dir, int extra_flags, int& error) {
  Status failure;
  UniqueFd fd = dir.open_unnamed(O_RDWR | O_CLOEXEC | extra_flags, dir.path(), failure);
  error = fd.valid() ? 0 : failure.sys_errno();
  return fd;
}

void write_output_file(const std::string& path, std::string_view text) {
  const std::size_t slash = path.rfind('/');
  const std::string parent = slash == std::string::npos ? "."
                             : slash == 0               ? "/"
                                                        : path.substr(0, slash);
  const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  if (name.empty() || name == "." || name == "..") {
    throw UsageError("invalid output file '" + path + "': expected a file name, not a directory");
  }
  swap::replace_file_durably(swap::Dir::open(parent), name, text);
}

}  // namespace zinf::tools
