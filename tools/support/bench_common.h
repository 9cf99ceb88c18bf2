// SPDX-License-Identifier: Apache-2.0
// What the commands share: benchmark arrays on huge pages, option values (dtype, on/off,
// --numel, --copy-out), timing and the median, and the machine facts their JSON records.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "zinf/common/dtype.h"

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
/// Writes gradients first..first+n-1 of one endless sequence (around 1e-3) into `out` (n
/// elements of `dtype`): `first` gives each rank of a job gradients of its own. bf16 is
/// truncated (any value near will do for timing); fp16 is 2^-10 with varying mantissa and sign.
void fill_bench_grads(void* out, std::size_t n, DType dtype, std::size_t first = 0);
/// Parses fp32 | bf16 | fp16; UsageError naming `what` otherwise.
DType parse_dtype(const std::string& text, const char* what);
/// Parses on | off; UsageError naming `what` otherwise.
bool parse_on_off(const std::string& text, const char* what);
/// Parses none | bf16 | fp16 (--copy-out: the low-precision parameters a step also writes);
/// nullopt for none, UsageError otherwise.
std::optional<DType> parse_copy_out(const std::string& text);
/// Checks --numel: 1 to 2^36 elements (~2 TB of state: far beyond any host, and every byte
/// count stays in range); UsageError otherwise.
void check_numel(std::uint64_t numel);
/// `v` as a uint32 for the option `what`; UsageError unless 1 <= v <= 2^32 - 1.
std::uint32_t to_u32(std::uint64_t v, const char* what);
/// The median (the mean of the middle two for an even count); 0 for none.
double median(std::vector<double> v);
/// The index of the median of `v` (the upper one of the middle two for an even count): the run
/// that stands for all, with its other figures. `v` must not be empty.
std::size_t median_index(const std::vector<double>& v);
/// Seconds since `start` on the steady clock.
double seconds_since(std::chrono::steady_clock::time_point start);
/// The CPU's model name from /proc/cpuinfo, or "unknown".
std::string cpu_model();
/// The kernel release (uname -r), or "unknown".
std::string kernel_release();
/// The file system type of `dir` ("ext4", "xfs", "tmpfs", ... or its magic number in hex).
std::string fs_type_name(const std::string& dir);

}  // namespace zinf::tools
