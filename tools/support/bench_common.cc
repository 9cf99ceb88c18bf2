// SPDX-License-Identifier: Apache-2.0
#include "bench_common.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/statfs.h>
#include <unistd.h>
#include <sys/utsname.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "zinf/common/error.h"

namespace zinf::tools {

ArrayLayout parse_array_layout(const std::string& text, const char* what) {
  for (ArrayLayout l : {ArrayLayout::kAligned, ArrayLayout::kAligned4K, ArrayLayout::kStaggered,
                        ArrayLayout::kTorch}) {
    if (text == array_layout_name(l)) return l;
  }
  throw UsageError(std::string("invalid ") + what + " '" + text +
                   "': expected aligned, aligned-4k, staggered or torch");
}

std::string_view array_layout_name(ArrayLayout layout) noexcept {
  switch (layout) {
    case ArrayLayout::kAligned: return "aligned";
    case ArrayLayout::kAligned4K: return "aligned-4k";
    case ArrayLayout::kStaggered: return "staggered";
    case ArrayLayout::kTorch: return "torch";
  }
  return "?";
}

std::size_t array_layout_offset(ArrayLayout layout, std::size_t index) noexcept {
  return layout == ArrayLayout::kStaggered ? index * 1088 : 0;
}

HostArray::HostArray(std::size_t bytes, std::string_view who, ArrayLayout layout, std::size_t index)
    : offset_(array_layout_offset(layout, index)) {
  const auto fail = [&](std::size_t size) {
    return Error(std::string(who) + ": cannot allocate " + std::to_string(size) + " bytes");
  };
  const std::size_t need = std::max<std::size_t>(bytes, 1) + offset_;
  if (layout == ArrayLayout::kTorch) {
    void* p = nullptr;
    if (::posix_memalign(&p, 64, need) != 0) throw fail(need);
    ptr_.reset(p);
    return;
  }
  constexpr std::size_t kAlign = std::size_t{2} << 20;
  const std::size_t rounded = (need + kAlign - 1) / kAlign * kAlign;
  ptr_.reset(std::aligned_alloc(kAlign, rounded));
  if (!ptr_) throw fail(rounded);
  // Advisory only: without THP the run is still valid, just with 4 KiB pages.
  (void)::madvise(ptr_.get(), rounded,
                  layout == ArrayLayout::kAligned4K ? MADV_NOHUGEPAGE : MADV_HUGEPAGE);
}

void HostArray::Free::operator()(void* p) const { std::free(p); }

namespace {
std::uint32_t bench_hash(std::size_t i) { return static_cast<std::uint32_t>(i * 2654435761u); }
}  // namespace

float bench_param(std::size_t i) {
  return static_cast<float>(bench_hash(i) % 2001u) / 1000.0f - 1.0f;
}

void fill_bench_grads(void* out, std::size_t n, ElementType dtype, std::size_t first) {
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t h = bench_hash(first + i);
    const float g = (static_cast<float>((h >> 11) % 2001u) / 1000.0f - 1.0f) * 1e-3f + 1e-5f;
    if (dtype == ElementType::kF32) {
      static_cast<float*>(out)[i] = g;
    } else {
      static_cast<std::uint16_t*>(out)[i] =
          dtype == ElementType::kBF16
              ? static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(g) >> 16)
              : static_cast<std::uint16_t>(0x1400u | (h & 0x83ffu));
    }
  }
}

ElementType parse_dtype(const std::string& text, const char* what) {
  if (text == "fp32") return ElementType::kF32;
  if (text == "bf16") return ElementType::kBF16;
  if (text == "fp16") return ElementType::kF16;
  throw UsageError(std::string("invalid ") + what + " '" + text + "': expected fp32, bf16 or fp16");
}

bool parse_on_off(const std::string& text, const char* what) {
  if (text == "on") return true;
  if (text == "off") return false;
  throw UsageError(std::string("invalid ") + what + " '" + text + "': expected on or off");
}

std::optional<ElementType> parse_copy_out(const std::string& text) {
  if (text == "none") return std::nullopt;
  const ElementType dtype = parse_dtype(text, "--copy-out");
  if (dtype == ElementType::kF32)
    throw UsageError("invalid --copy-out 'fp32': expected none, bf16 or fp16");
  return dtype;
}

void check_numel(std::uint64_t numel) {
  if (numel == 0 || numel > (std::uint64_t{1} << 36)) {
    throw UsageError("--numel " + std::to_string(numel) + " is out of range [1, 2^36]");
  }
}

std::uint32_t to_u32(std::uint64_t v, const char* what) {
  if (v == 0 || v > 0xffffffffull) {
    throw UsageError(std::string("invalid ") + what + ": must be between 1 and 4294967295");
  }
  return static_cast<std::uint32_t>(v);
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::size_t median_index(const std::vector<double>& v) {
  std::vector<std::size_t> order(v.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return v[a] < v[b]; });
  return order[order.size() / 2];
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(std::min(colon + 2, line.size()));
    }
  }
  return "unknown";
}

std::string kernel_release() {
  struct utsname u {};
  if (::uname(&u) != 0) return "unknown";
  return u.release;
}

std::string fs_type_name(const std::string& dir) {
  struct statfs s {};
  if (::statfs(dir.c_str(), &s) != 0) return "unknown";
  switch (static_cast<unsigned long>(s.f_type)) {
    case 0xEF53: return "ext4";
    case 0x58465342: return "xfs";
    case 0x9123683E: return "btrfs";
    case 0x01021994: return "tmpfs";
    case 0x2FC12FC1: return "zfs";
    case 0x65735546: return "fuse";
    case 0x6969: return "nfs";
    case 0x794c7630: return "overlayfs";
    default: {
      char buf[32];
      std::snprintf(buf, sizeof buf, "0x%lx", static_cast<unsigned long>(s.f_type));
      return buf;
    }
  }
}

}  // namespace zinf::tools
