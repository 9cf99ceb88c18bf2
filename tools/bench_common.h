// SPDX-License-Identifier: Apache-2.0
// What the `zinf bench ...` commands share: benchmark arrays on huge pages, the dtype option,
// the median, and the machine facts their JSON records.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "zinf/offload/cpu_adam.h"
#include "zinf/swap/dir.h"

namespace zinf::tools {

/// Host memory for one benchmark array: 2 MiB aligned and advised onto transparent huge pages,
/// so TLB misses do not blur the memory figure (applies to every kernel measured alike).
/// Throws zinf::Error naming `who` and the size if it cannot be allocated.
class HostArray {
 public:
  HostArray(std::size_t bytes, std::string_view who);
  template <typename T>
  std::span<T> as(std::size_t n) {
    return {static_cast<T*>(ptr_.get()), n};
  }

 private:
  struct Free {
    void operator()(void* p) const;
  };
  std::unique_ptr<void, Free> ptr_;
};

/// The benchmarks' data (bench adam, bench step): parameter i in [-1, 1]. With the gradients
/// below, every value stays a normal float through the steps, so no subnormal slow path is
/// measured.
float bench_param(std::size_t i);
/// Writes gradients 0..n-1 (around 1e-3) into `out` (n elements of `dtype`). bf16 is truncated
/// (any value near will do for timing); fp16 is 2^-10 with varying mantissa and sign.
void fill_bench_grads(void* out, std::size_t n, offload::DType dtype);
/// Parses fp32 | bf16 | fp16; UsageError naming `what` otherwise.
offload::DType parse_dtype(const std::string& text, const char* what);
/// Parses on | off; UsageError naming `what` otherwise.
bool parse_on_off(const std::string& text, const char* what);
/// The median (the mean of the middle two for an even count); 0 for none.
double median(std::vector<double> v);
/// The CPU's model name from /proc/cpuinfo, or "unknown".
std::string cpu_model();
/// The kernel release (uname -r), or "unknown".
std::string kernel_release();
/// Opens `dir` (a swap::Dir: the files a command makes there are created relative to this one
/// descriptor, never through a link) after checking that it exists, is a directory and accepts
/// a new file; UsageError (exit status 2) naming the directory otherwise. The write probe has
/// no name (open_unnamed_probe), so nothing planted in `dir` is touched and a killed run
/// leaves nothing behind.
swap::Dir check_dir(const std::string& dir);
/// Opens a new read-write file in `dir` that no name points to: O_TMPFILE, or where the file
/// system lacks it, a swap::unique_name() created exclusively (O_EXCL|O_NOFOLLOW) and unlinked
/// at once. `extra_flags` are added to the open (O_DIRECT for a probe). Returns the descriptor
/// or -errno. Quiet, unlike File::create_unnamed, which logs its fallback from O_DIRECT: for
/// probes whose failure is itself the answer.
int open_unnamed_probe(const swap::Dir& dir, int extra_flags);
/// Writes `text` as the file at `path`, a file the user named (--out, --report): to a fresh
/// temporary in the same directory, fsynced, then renamed over `path` (swap::
/// replace_file_durably). So a reader never sees half a file, a crash leaves the old one, and
/// a link at `path` is replaced by the file rather than followed (zinf may run as root in a
/// directory others can write to). Throws IoError naming the file.
void write_output_file(const std::string& path, std::string_view text);
/// The file system type of `dir` ("ext4", "xfs", "tmpfs", ... or its magic number in hex).
std::string fs_type_name(const std::string& dir);

}  // namespace zinf::tools
