// SPDX-License-Identifier: Apache-2.0
// Helpers shared by the IoEngine tests: an aligned test buffer, the list of backends to run a
// suite against, and a base fixture that skips (with the reason) where a backend cannot start.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <memory>
#include <new>
#include <ostream>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "zinf/common/align.h"
#include "zinf/swap/io_engine.h"

namespace zinf::test {

/// A heap buffer aligned to `alignment` (default 4096), zero-filled.
class AlignedBuffer {
 public:
  explicit AlignedBuffer(std::size_t size, std::size_t alignment = 4096)
      : size_(size),
        data_(static_cast<std::byte*>(
            std::aligned_alloc(alignment, align_up(size, alignment) + alignment))) {
    if (data_ == nullptr) throw std::bad_alloc();
    std::fill(data_.get(), data_.get() + size_ + alignment, std::byte{0});
  }
  std::span<std::byte> span() const { return {data_.get(), size_}; }
  std::byte* data() const { return data_.get(); }
  std::size_t size() const { return size_; }

 private:
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  std::size_t size_;
  std::unique_ptr<std::byte, Free> data_;
};

/// Every backend a contract suite runs against; those that cannot start skip with the reason.
inline std::vector<swap::IoEngineKind> all_backends() {
  return {swap::IoEngineKind::kThreads, swap::IoEngineKind::kUring};
}

inline std::string backend_param_name(const ::testing::TestParamInfo<swap::IoEngineKind>& info) {
  return std::string(swap::io_engine_kind_name(info.param));
}

/// Returns "" if `kind` can start here, else why not (for GTEST_SKIP).
inline std::string backend_unavailable(swap::IoEngineKind kind) {
  if (kind != swap::IoEngineKind::kUring) return {};
  return swap::io_uring_unavailable_reason();
}

/// Base fixture of the suites instantiated over all_backends(): each test skips, naming its
/// backend and the reason, where that backend cannot start here. A subclass that overrides
/// SetUp() calls this one first and returns if IsSkipped().
class BackendTest : public ::testing::TestWithParam<swap::IoEngineKind> {
 protected:
  void SetUp() override {
    if (std::string why = backend_unavailable(GetParam()); !why.empty()) {
      GTEST_SKIP() << swap::io_engine_kind_name(GetParam()) << " unavailable: " << why;
    }
  }
};

}  // namespace zinf::test

namespace zinf::swap {
/// Names the backend in gtest output and ctest test names.
inline void PrintTo(IoEngineKind kind, std::ostream* os) { *os << io_engine_kind_name(kind); }
}  // namespace zinf::swap
