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

#include "zinf/common/element_type.h"

namespace zinf::tools {

/// Where a benchmark puts its arrays (`zinf bench adam --layout`). What an element-wise kernel
/// sees of an array is its address mod 4 KiB (a load and an older store are first matched on
/// their low 12 bits) and whether it sits on huge pages, so one layout measures its luck.
enum class ArrayLayout : std::uint8_t {
  kAligned,    ///< 2 MiB aligned, THP advised: every array at offset 0 mod 2 MiB ("aligned")
  kAligned4K,  ///< the same on 4 KiB pages (MADV_NOHUGEPAGE) ("aligned-4k")
  /// 2 MiB aligned, THP advised, array k of a set moved by k * 1088 bytes ("staggered")
  kStaggered,
  /// posix_memalign(64) and no advice, as torch.empty's CPU allocator takes memory ("torch")
  kTorch,
};
/// Parses aligned | aligned-4k | staggered | torch; UsageError naming `what` otherwise.
ArrayLayout parse_array_layout(const std::string& text, const char* what);
/// The name parse_array_layout() reads.
std::string_view array_layout_name(ArrayLayout layout) noexcept;
/// Bytes by which array `index` of a set starts past its allocation's alignment: index * 1088
/// for kStaggered (the first four then lie at least 832 bytes apart mod 4 KiB, in either
/// direction), 0 otherwise.
std::size_t array_layout_offset(ArrayLayout layout, std::size_t index) noexcept;

/// Host memory for one benchmark array: by default 2 MiB aligned and advised onto transparent
/// huge pages, so TLB misses do not blur the memory figure (applies to every kernel measured
/// alike); `layout` and `index` (the array's place in its set) choose another placement (see
/// ArrayLayout). Throws zinf::Error naming `who` and the size if it cannot be allocated.
class HostArray {
 public:
  HostArray(std::size_t bytes, std::string_view who, ArrayLayout layout = ArrayLayout::kAligned,
            std::size_t index = 0);
  template <typename T>
  std::span<T> as(std::size_t n) {
    return {reinterpret_cast<T*>(static_cast<std::byte*>(ptr_.get()) + offset_), n};
  }

 private:
  struct Free {
    void operator()(void* p) const;
  };
  std::unique_ptr<void, Free> ptr_;
  std::size_t offset_ = 0;
};

/// The benchmarks' data (bench adam, bench step): parameter i in [-1, 1]. With the gradients
/// below, every value stays a normal float through the steps, so no subnormal slow path is
/// measured.
float bench_param(std::size_t i);
/// Writes gradients first..first+n-1 of one endless sequence (around 1e-3) into `out` (n
/// elements of `dtype`): `first` gives each rank of a job gradients of its own. bf16 is
/// truncated (any value near will do for timing); fp16 is 2^-10 with varying mantissa and sign.
void fill_bench_grads(void* out, std::size_t n, ElementType dtype, std::size_t first = 0);
/// Parses fp32 | bf16 | fp16; UsageError naming `what` otherwise.
ElementType parse_dtype(const std::string& text, const char* what);
/// Parses on | off; UsageError naming `what` otherwise.
bool parse_on_off(const std::string& text, const char* what);
/// Parses none | bf16 | fp16 (--copy-out: the low-precision parameters a step also writes);
/// nullopt for none, UsageError otherwise.
std::optional<ElementType> parse_copy_out(const std::string& text);
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
