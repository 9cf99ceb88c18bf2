// SPDX-License-Identifier: Apache-2.0
// ElementType and ReduceOp: the element type of every buffer zinf reads, writes or reduces
// (gradients, parameters, copy-outs, collectives), and how a collective reduces. Part of
// zinf::common.
//
// One enum serves the engine's layer specs, the config reader (param_dtype), the optimizer's
// copy-out, the CPU Adam kernels, the C API (zinf_dtype keeps the values of kF32, kBF16 and
// kF16), zinf::cuda's Communicator and zinf::dist's Collectives. A layer's or a gradient's
// buffer is fp32, bf16 or fp16; the wider types serve the collectives, and every function that
// takes a buffer type refuses them with a usage error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace zinf {

/// Element type of a buffer. bf16 and fp16 travel as raw uint16 bits (the library never needs
/// a C++ type for them).
enum class ElementType : std::uint8_t { kF32, kBF16, kF16, kF64, kI32, kI64, kU8 };

/// Returns "fp32", "bf16", "fp16", "fp64", "i32", "i64" or "u8" ("?" outside the enum).
constexpr std::string_view element_type_name(ElementType type) noexcept {
  switch (type) {
    case ElementType::kF32: return "fp32";
    case ElementType::kBF16: return "bf16";
    case ElementType::kF16: return "fp16";
    case ElementType::kF64: return "fp64";
    case ElementType::kI32: return "i32";
    case ElementType::kI64: return "i64";
    case ElementType::kU8: return "u8";
  }
  return "?";
}

/// Bytes per element: 4, 2, 2, 8, 4, 8, 1 (1 outside the enum).
constexpr std::size_t element_size(ElementType type) noexcept {
  switch (type) {
    case ElementType::kF32: return 4;
    case ElementType::kBF16: return 2;
    case ElementType::kF16: return 2;
    case ElementType::kF64: return 8;
    case ElementType::kI32: return 4;
    case ElementType::kI64: return 8;
    case ElementType::kU8: return 1;
  }
  return 1;
}

/// True for the types a parameter, gradient or copy-out buffer may have: fp32, bf16, fp16.
constexpr bool is_buffer_type(ElementType type) noexcept {
  return type == ElementType::kF32 || type == ElementType::kBF16 || type == ElementType::kF16;
}

/// Throws UsageError("<where>: element type fp64 is not a buffer type (fp32, bf16 or fp16)")
/// unless is_buffer_type(type). `where` names the call and the argument, as errors do.
void check_buffer_type(ElementType type, std::string_view where);

/// Elementwise reduction. kAvg is the sum divided by the number of ranks.
enum class ReduceOp : std::uint8_t { kSum, kAvg, kMax, kMin };

/// Returns "sum", "avg", "max" or "min" ("?" outside the enum).
constexpr std::string_view reduce_op_name(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
  }
  return "?";
}

}  // namespace zinf
