// SPDX-License-Identifier: Apache-2.0
// The door check of the tensors of one Adam update or rollback as a binding hands them over
// (data pointer, dtype, sizes, strides, device; zinf's Python module gets them from torch
// tensors): what CpuAdam::step cannot see through its spans (layout, a size that was never
// passed, the dtype of memory it is told is fp32) is checked here once for every caller.
// Part of zinf::adam.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "zinf/adam/cpu_adam.h"
#include "zinf/common/element_type.h"

namespace zinf::adam {

/// One tensor as a binding describes it. Views: the caller keeps the spans' memory alive.
struct TensorArg {
  void* data = nullptr;  ///< written by an update where the tensor is params, a moment or out
  /// torch's dtype name, with or without "torch.": float32, bfloat16 and float16 are what an
  /// update takes (fp32, bf16, fp16 too); any other is refused by name (int64, float64 ...).
  std::string_view dtype;
  std::span<const std::int64_t> sizes;
  std::span<const std::int64_t> strides;  ///< in elements, one per size
  std::string_view device = "cpu";        ///< torch's device type
};

/// What check_update_tensors() found: the element count every tensor has, and their types
/// (`moments` is exp_avg's and exp_avg_sq's, kF32 where they were not given).
struct UpdateTensors {
  std::size_t numel = 0;
  ElementType params = ElementType::kF32;
  ElementType grads = ElementType::kF32;
  ElementType moments = ElementType::kF32;
  ElementType out = ElementType::kF32;
};

/// Checks the tensors of one update or rollback before anything reads or writes them: params,
/// grads, exp_avg and exp_avg_sq (both, or neither where the update makes them) and an
/// optional copy-out `out`. Throws UsageError "<where>: <argument> ..." naming the first bad
/// argument (params, grads, exp_avg, exp_avg_sq, out):
///  - its device is not "cpu";
///  - its dtype is not float32, bfloat16 or float16 (an int64 moment would be truncated);
///  - exp_avg and exp_avg_sq have different dtypes (the kernel reads both as one type);
///  - sizes and strides differ in length, or a size is negative;
///  - it is not contiguous: every dimension of more than one element has the stride of a
///    row-major tensor of its sizes (torch's is_contiguous()). The kernel reads memory in
///    order, so a transposed tensor would be read in the wrong order and an expanded one
///    (stride 0, one element of storage) would be written past its storage;
///  - its element count differs from params' (a 16-element exp_avg for 1M parameters would be
///    written 1M elements long);
///  - its data pointer is null with elements;
///  - two of them share a byte.
/// Blocks for nothing and touches no tensor's memory. Thread-safe.
UpdateTensors check_update_tensors(std::string_view where, const TensorArg& params,
                                   const TensorArg& grads, const TensorArg* exp_avg,
                                   const TensorArg* exp_avg_sq, const TensorArg* out = nullptr);

/// Runs one update of the tensors on `adam` (CpuAdam::step) after check_update_tensors()
/// accepted them, with each span as long as its own tensor: the door of every binding's
/// update. Beyond that check, the kernel's own: params float32 (the master a bf16/fp16
/// parameter is widened into; `out` then receives the rounded update), exp_avg and exp_avg_sq
/// float32 or bfloat16 (the kernel's bf16 codec). UsageError "<where>: ..." otherwise, before
/// any memory is touched, and the kernel's errors (hyper-parameters, step 0). Blocks until
/// every element is updated.
void step_tensors(CpuAdam& adam, std::string_view where, const AdamParams& hp,
                  const TensorArg& params, const TensorArg& grads, const TensorArg& exp_avg,
                  const TensorArg& exp_avg_sq, const TensorArg* out = nullptr);

}  // namespace zinf::adam
