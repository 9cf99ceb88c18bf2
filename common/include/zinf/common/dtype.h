// SPDX-License-Identifier: Apache-2.0
// DType: the element type of a tensor buffer that zinf reads or writes. Part of zinf::common.
//
// It lives here rather than with the CPU Adam kernel because it is not Adam's: the engine's
// layer specs, the config reader (param_dtype), the optimizer's store copy-out, the C API
// (zinf_dtype) and the tools all name buffer types with it, and a general type in a leaf
// layer's namespace would make every one of them spell an optimizer detail.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace zinf {

/// Element type of a gradient, parameter or copy-out buffer. bf16 and fp16 travel as raw
/// uint16 bits (the library never needs a C++ type for them).
enum class DType : std::uint8_t { kF32, kBF16, kF16 };

/// Returns "fp32", "bf16" or "fp16" ("?" for a value outside the enum).
constexpr std::string_view dtype_name(DType dtype) noexcept {
  switch (dtype) {
    case DType::kF32: return "fp32";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "fp16";
  }
  return "?";
}

/// Bytes per element: 4 for fp32, 2 for bf16 and fp16.
constexpr std::size_t dtype_size(DType dtype) noexcept { return dtype == DType::kF32 ? 4 : 2; }

}  // namespace zinf
