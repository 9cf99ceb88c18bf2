// SPDX-License-Identifier: Apache-2.0
// CpuAdam over memory the caller owns (torch tensors' storage, passed as addresses by
// zinf.torch): one update of one parameter, the GIL released while the kernel runs.
#include <cstdint>
#include <span>
#include <string>

#include "native.h"
#include "zinf/adam/compact_state.h"
#include "zinf/adam/cpu_adam.h"
#include "zinf/common/error.h"

namespace zinf::python {
namespace {

template <typename T>
std::span<T> span_at(std::uintptr_t address, std::size_t n) {
  return {reinterpret_cast<T*>(address), n};
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
          [](adam::CpuAdam& a, std::uintptr_t params, std::uintptr_t grads,
             const std::string& grad_dtype, std::uintptr_t m_, std::uintptr_t v, std::size_t numel,
             double lr, double beta1, double beta2, double eps, double weight_decay,
             std::uint64_t step, bool bias_correction, bool adamw, double grad_scale,
             std::uintptr_t out, const std::string& out_dtype, const std::string& moments) {
            const adam::AdamParams hp = make_hyper(lr, beta1, beta2, eps, weight_decay,
                                                   bias_correction, adamw, grad_scale, step);
            const adam::GradView g{reinterpret_cast<const void*>(grads), numel,
                                   parse_dtype(grad_dtype, "CpuAdam.step grads")};
            adam::CopyOut o = adam::CopyOut::none();
            if (out != 0) {
              o = {reinterpret_cast<void*>(out), numel, parse_dtype(out_dtype, "CpuAdam.step out"),
                   true};
            }
            adam::CompactMoments cm;
            cm.precision = adam::parse_state_precision(moments, "CpuAdam.step moments");
            if (cm.precision == adam::StatePrecision::kInt8) {
              throw UsageError("CpuAdam.step: moments must be fp32 or bf16 here, got int8");
            }
            cm.size = numel;
            cm.m = reinterpret_cast<void*>(m_);
            cm.v = reinterpret_cast<void*>(v);
            py::gil_scoped_release nogil;
            a.step(hp, span_at<float>(params, numel), cm, g, o);
          },
          "params"_a, "grads"_a, "grad_dtype"_a, "exp_avg"_a, "exp_avg_sq"_a, "numel"_a, "lr"_a,
          "beta1"_a, "beta2"_a, "eps"_a, "weight_decay"_a, "step"_a, "bias_correction"_a, "adamw"_a,
          "grad_scale"_a = 1.0, "out"_a = 0, "out_dtype"_a = "bf16", "moments"_a = "fp32",
          "One update of numel elements at the given addresses (fp32 params; moments fp32 or "
          "bf16 (round to nearest even); gradients fp32/bf16/fp16; optional fp32/bf16/fp16 "
          "copy-out).");
}

}  // namespace zinf::python
