// SPDX-License-Identifier: Apache-2.0
// CpuAdam over memory the caller owns (torch tensors, described by zinf.torch as (address,
// dtype, sizes, strides, device)): one update of one parameter through the adam layer's
// tensor door (check_update_tensors), the GIL released while the kernel runs.
#include <pybind11/stl.h>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "native.h"
#include "zinf/adam/cpu_adam.h"
#include "zinf/adam/update_tensors.h"
#include "zinf/common/error.h"

namespace zinf::python {
namespace {

// A tensor as zinf.torch.tensor_arg() hands it over: (data_ptr, str(dtype), shape, stride,
// device type).
using PyTensor = std::tuple<std::uintptr_t, std::string, std::vector<std::int64_t>,
                            std::vector<std::int64_t>, std::string>;

adam::TensorArg tensor_arg(const PyTensor& t) {
  return {reinterpret_cast<void*>(std::get<0>(t)), std::get<1>(t), std::get<2>(t), std::get<3>(t),
          std::get<4>(t)};
}

}  // namespace

ElementType parse_dtype(const std::string& name, const char* what) {
  if (name == "fp32" || name == "float32") return ElementType::kF32;
  if (name == "bf16" || name == "bfloat16") return ElementType::kBF16;
  if (name == "fp16" || name == "float16") return ElementType::kF16;
  throw UsageError(std::string(what) + ": dtype must be fp32, bf16 or fp16, got '" + name + "'");
}

adam::AdamParams make_hyper(double lr, double beta1, double beta2, double eps,
                            double weight_decay, bool bias_correction, bool adamw,
                            double grad_scale, std::uint64_t step) {
  adam::AdamParams hp;
  hp.lr = lr;
  hp.beta1 = beta1;
  hp.beta2 = beta2;
  hp.eps = eps;
  hp.weight_decay = weight_decay;
  hp.step = step;
  hp.bias_correction = bias_correction;
  hp.grad_scale = grad_scale;
  hp.mode = adamw ? adam::AdamMode::kAdamW : adam::AdamMode::kAdam;
  return hp;
}

void bind_adam(py::module_& m) {
  using namespace pybind11::literals;
  m.def(
      "check_adam",
      [](double lr, double beta1, double beta2, double eps, double weight_decay,
         double grad_scale) {
        const adam::AdamParams hp =
            make_hyper(lr, beta1, beta2, eps, weight_decay, true, true, grad_scale, 1);
        if (auto bad = adam::check_adam_params(hp)) {
          throw UsageError("cpu adam: " + std::string(bad->field) + " " + bad->what);
        }
      },
      "lr"_a, "beta1"_a, "beta2"_a, "eps"_a, "weight_decay"_a, "grad_scale"_a = 1.0,
      "ValueError with the kernel's message if the hyper-parameters are out of its range "
      "(check_adam_params): the check every optimizer makes before any update of a step.");
  py::class_<adam::CpuAdam>(m, "CpuAdam", "zinf's CPU Adam kernel with its thread pool.")
      .def(py::init([](std::size_t threads) {
             return std::make_unique<adam::CpuAdam>(adam::CpuAdamOptions{.threads = threads});
           }),
           "threads"_a = 0)
      .def("isa", [](const adam::CpuAdam& a) { return std::string(adam::isa_name(a.isa())); })
      .def(
          "prefetch",
          [](const adam::CpuAdam& a) {
            const adam::PrefetchSetting pf = a.prefetch();
            return py::make_tuple(pf.elements, std::string(pf.source));
          },
          "(elements, source): the software prefetch distance the next step uses and where it "
          "comes from (none, option, environment, default, calibrated); "
          "ZINF_CPU_ADAM_PREFETCH=auto|off|N sets it.")
      .def(
          "step",
          [](adam::CpuAdam& a, const PyTensor& params, const PyTensor& grads,
             const PyTensor& exp_avg, const PyTensor& exp_avg_sq, double lr, double beta1,
             double beta2, double eps, double weight_decay, std::uint64_t step,
             bool bias_correction, bool adamw, double grad_scale,
             const std::optional<PyTensor>& out, const std::string& where) {
            const adam::AdamParams hp = make_hyper(lr, beta1, beta2, eps, weight_decay,
                                                   bias_correction, adamw, grad_scale, step);
            const adam::TensorArg o = out ? tensor_arg(*out) : adam::TensorArg{};
            const adam::TensorArg p = tensor_arg(params), g = tensor_arg(grads),
                                  m_ = tensor_arg(exp_avg), v = tensor_arg(exp_avg_sq);
            py::gil_scoped_release nogil;
            adam::step_tensors(a, where, hp, p, g, m_, v, out ? &o : nullptr);
          },
          "params"_a, "grads"_a, "exp_avg"_a, "exp_avg_sq"_a, "lr"_a, "beta1"_a, "beta2"_a, "eps"_a,
          "weight_decay"_a, "step"_a, "bias_correction"_a, "adamw"_a, "grad_scale"_a = 1.0,
          "out"_a = py::none(), "where"_a = "CpuAdam.step",
          "One update of the tensors, each (data_ptr, dtype, shape, stride, device) "
          "(zinf.torch.tensor_arg): fp32 params; moments fp32 or bf16 (round to nearest even); "
          "gradients fp32/bf16/fp16; optional fp32/bf16/fp16 copy-out. ValueError naming the "
          "argument (prefixed with `where`) for sizes, dtypes, layouts, devices or overlaps the "
          "kernel cannot take (check_update_tensors), before any memory is touched.");
  m.def(
      "check_adam_tensors",
      [](const std::string& where, const PyTensor& params, const PyTensor& grads,
         const std::optional<PyTensor>& exp_avg, const std::optional<PyTensor>& exp_avg_sq) {
        const adam::TensorArg m_ = exp_avg ? tensor_arg(*exp_avg) : adam::TensorArg{};
        const adam::TensorArg v = exp_avg_sq ? tensor_arg(*exp_avg_sq) : adam::TensorArg{};
        adam::check_update_tensors(where, tensor_arg(params), tensor_arg(grads),
                                   exp_avg ? &m_ : nullptr, exp_avg_sq ? &v : nullptr);
      },
      "where"_a, "params"_a, "grads"_a, "exp_avg"_a = py::none(), "exp_avg_sq"_a = py::none(),
      "ValueError naming the argument (prefixed with `where`) unless the tensors of an update "
      "or rollback are on the cpu, float32/bfloat16/float16 (both moments one dtype), "
      "contiguous, of params' element count and apart (check_update_tensors). Moments None: "
      "the update makes them.");
  m.def(
      "check_adam_rollback",
      [](double lr, double beta1, double beta2, double eps, double weight_decay, bool adamw) {
        const adam::AdamParams hp =
            make_hyper(lr, beta1, beta2, eps, weight_decay, true, adamw, 1.0, 1);
        if (auto bad = adam::check_rollback_params(hp)) {
          throw UsageError("cpu adam rollback: " + std::string(bad->field) + " " + bad->what);
        }
      },
      "lr"_a, "beta1"_a, "beta2"_a, "eps"_a, "weight_decay"_a, "adamw"_a,
      "ValueError with the kernel's message if a rollback of an update with these "
      "hyper-parameters cannot be computed (check_rollback_params: beta1 or beta2 0, "
      "lr * weight_decay 1 in AdamW mode), or the update's own check refuses them.");
}

}  // namespace zinf::python
