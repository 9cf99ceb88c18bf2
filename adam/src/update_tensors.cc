// SPDX-License-Identifier: Apache-2.0
// check_update_tensors: the layout, type, size and overlap check of an update's tensors.
#include "zinf/adam/update_tensors.h"

#include <array>
#include <optional>
#include <string>

#include "zinf/adam/compact_state.h"
#include "zinf/common/error.h"

namespace zinf::adam {
namespace {

std::optional<ElementType> parse_torch_dtype(std::string_view name) {
  if (name.starts_with("torch.")) name.remove_prefix(6);
  if (name == "float32" || name == "float" || name == "fp32") return ElementType::kF32;
  if (name == "bfloat16" || name == "bf16") return ElementType::kBF16;
  if (name == "float16" || name == "half" || name == "fp16") return ElementType::kF16;
  return std::nullopt;
}

std::string list_text(std::span<const std::int64_t> values) {
  std::string s = "[";
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (i != 0) s += ", ";
    s += std::to_string(values[i]);
  }
  return s + "]";
}

struct Checked {
  const char* name = nullptr;
  const void* data = nullptr;
  std::size_t numel = 0;
  ElementType type = ElementType::kF32;
};

// One tensor on its own: device, dtype, shape, contiguity, null data.
Checked check_one(const std::string& where, const char* name, const TensorArg& t) {
  const std::string prefix = where + ": " + name;
  if (t.device != "cpu") {
    throw UsageError(prefix + " is on device '" + std::string(t.device) + "', must be 'cpu'");
  }
  const std::optional<ElementType> type = parse_torch_dtype(t.dtype);
  if (!type) {
    throw UsageError(prefix + " is " + std::string(t.dtype) +
                     ", must be float32, bfloat16 or float16");
  }
  if (t.sizes.size() != t.strides.size()) {
    throw UsageError(prefix + " has " + std::to_string(t.sizes.size()) + " sizes and " +
                     std::to_string(t.strides.size()) + " strides");
  }
  // The count is kept below 2^63 so that neither it nor the strides' products below overflow
  // (sizes come from the caller: a wrapped product could match params' count).
  std::int64_t count = 1;
  for (const std::int64_t s : t.sizes) {
    if (s < 0) throw UsageError(prefix + " has a negative size " + list_text(t.sizes));
    if (__builtin_mul_overflow(count, s, &count)) {
      throw UsageError(prefix + " has more elements than can be addressed " + list_text(t.sizes));
    }
  }
  const auto numel = static_cast<std::size_t>(count);
  // Row-major from the last dimension; a dimension of one element may have any stride (as
  // torch's is_contiguous), and an empty tensor has no layout to get wrong.
  std::int64_t expected = 1;
  for (std::size_t d = t.sizes.size(); numel != 0 && d-- > 0;) {
    if (t.sizes[d] != 1 && t.strides[d] != expected) {
      throw UsageError(prefix + " is not contiguous (sizes " + list_text(t.sizes) + ", strides " +
                       list_text(t.strides) +
                       "): the kernel reads memory in order, so an expanded (stride 0) or "
                       "transposed tensor must be made contiguous first (.contiguous())");
    }
    expected *= t.sizes[d];
  }
  if (t.data == nullptr && numel != 0) {
    throw UsageError(prefix + " is null with " + std::to_string(numel) + " elements");
  }
  return {name, t.data, numel, *type};
}

}  // namespace

UpdateTensors check_update_tensors(std::string_view where_view, const TensorArg& params,
                                   const TensorArg& grads, const TensorArg* exp_avg,
                                   const TensorArg* exp_avg_sq, const TensorArg* out) {
  const std::string where(where_view);
  if ((exp_avg == nullptr) != (exp_avg_sq == nullptr)) {
    throw UsageError(where + ": exp_avg and exp_avg_sq come together (one was not given)");
  }
  std::array<Checked, 5> all{};
  std::size_t count = 0;
  all[count++] = check_one(where, "params", params);
  all[count++] = check_one(where, "grads", grads);
  if (exp_avg != nullptr) {
    all[count++] = check_one(where, "exp_avg", *exp_avg);
    all[count++] = check_one(where, "exp_avg_sq", *exp_avg_sq);
  }
  if (out != nullptr) all[count++] = check_one(where, "out", *out);

  const std::size_t n = all[0].numel;
  for (std::size_t i = 1; i < count; ++i) {
    if (all[i].numel != n) {
      throw UsageError(where + ": " + all[i].name + " has " + std::to_string(all[i].numel) +
                       " elements, params has " + std::to_string(n));
    }
  }
  UpdateTensors r;
  r.numel = n;
  r.params = all[0].type;
  r.grads = all[1].type;
  if (exp_avg != nullptr) {
    if (all[2].type != all[3].type) {
      throw UsageError(where + ": exp_avg is " + std::string(element_type_name(all[2].type)) +
                       " and exp_avg_sq " + std::string(element_type_name(all[3].type)) +
                       ": the moments must have one dtype");
    }
    r.moments = all[2].type;
  }
  if (out != nullptr) r.out = all[count - 1].type;
  // Byte ranges, each from its own dtype: a parameter that is also its gradient or moment
  // would be read after the kernel wrote it.
  for (std::size_t i = 0; i < count; ++i) {
    for (std::size_t j = i + 1; j < count; ++j) {
      const auto a = reinterpret_cast<std::uintptr_t>(all[i].data);
      const auto b = reinterpret_cast<std::uintptr_t>(all[j].data);
      const std::size_t a_bytes = n * element_size(all[i].type);
      const std::size_t b_bytes = n * element_size(all[j].type);
      if (a_bytes != 0 && b_bytes != 0 && a < b + b_bytes && b < a + a_bytes) {
        throw UsageError(where + ": " + all[i].name + " and " + all[j].name + " overlap");
      }
    }
  }
  return r;
}

void step_tensors(CpuAdam& adam, std::string_view where, const AdamParams& hp,
                  const TensorArg& params, const TensorArg& grads, const TensorArg& exp_avg,
                  const TensorArg& exp_avg_sq, const TensorArg* out) {
  const UpdateTensors t = check_update_tensors(where, params, grads, &exp_avg, &exp_avg_sq, out);
  if (t.params != ElementType::kF32) {
    throw UsageError(std::string(where) + ": params is " +
                     std::string(element_type_name(t.params)) +
                     ", the kernel updates float32 (widen it into an fp32 master and pass the "
                     "parameter as out)");
  }
  if (t.moments == ElementType::kF16) {
    throw UsageError(std::string(where) +
                     ": exp_avg and exp_avg_sq are fp16, the kernel keeps float32 or bfloat16 "
                     "moments (update float32 copies)");
  }
  CompactMoments cm;
  cm.precision = t.moments == ElementType::kBF16 ? StatePrecision::kBF16 : StatePrecision::kF32;
  cm.size = t.numel;
  cm.m = exp_avg.data;
  cm.v = exp_avg_sq.data;
  const GradView g{grads.data, t.numel, t.grads};
  CopyOut o = CopyOut::none();
  if (out != nullptr) o = {out->data, t.numel, t.out, true};
  adam.step(hp, {static_cast<float*>(params.data), t.numel}, cm, g, o);
}

}  // namespace zinf::adam
