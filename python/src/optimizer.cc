// SPDX-License-Identifier: Apache-2.0
// OffloadedOptimizer for Python: the fp32 masters and Adam moments of every parameter in pinned
// memory (tier "cpu") or on NVMe (tier "nvme"), one optimizer group per parameter tensor, the
// update copied out into the caller's fp32 parameters (CopyOut::f32). zinf.torch.Adam/AdamW
// with state="nvme" drive it; blocking calls release the GIL.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <pybind11/stl.h>

#include "native.h"
#include "zinf/offload/config.h"
#include "zinf/common/error.h"
#include "zinf/optim/optimizer.h"

namespace zinf::python {

using optim::OffloadedOptimizer;

py::dict stats_dict(const optim::StepStats& s) {
  py::dict d;
  d["step"] = s.step;
  d["sub_groups"] = s.sub_groups;
  d["elements"] = s.elements;
  d["seconds"] = s.seconds;
  d["read_seconds"] = s.read_seconds;
  d["write_seconds"] = s.write_seconds;
  d["compute_seconds"] = s.compute_seconds;
  d["wait_seconds"] = s.wait_seconds;
  d["bytes_read"] = s.bytes_read;
  d["bytes_written"] = s.bytes_written;
  d["skipped"] = s.skipped;
  d["global_grad_norm"] = s.global_grad_norm;
  d["grad_scale_applied"] = s.grad_scale_applied;
  d["loss_scale"] = s.loss_scale;
  d["allgather_bytes"] = s.allgather_bytes;
  d["reduce_scatter_bytes"] = s.reduce_scatter_bytes;
  d["all_reduce_bytes"] = s.all_reduce_bytes;
  return d;
}

optim::OptimizerOptions optimizer_options(const std::string& tier,
                                          const std::vector<std::string>& directories,
                                          std::uint64_t sub_group, std::uint32_t depth,
                                          std::uint64_t pinned_budget, std::size_t threads,
                                          bool checksums, const std::string& state_precision,
                                          const swap::IoOptions& io) {
  optim::OptimizerOptions o;
  o.io = io;
  o.tier = optim::parse_state_tier(tier, "state");
  o.directories = directories;
  o.sub_group_elements = sub_group;
  o.pipeline_depth = depth;
  o.pinned_budget_bytes = pinned_budget;
  o.adam.threads = threads;
  o.swap_checksums = checksums;
  o.state_precision = adam::parse_state_precision(state_precision, "state_precision");
  return o;
}

std::vector<optim::ParamGroupSpec> numbered_groups(const std::vector<std::uint64_t>& numels) {
  std::vector<optim::ParamGroupSpec> groups;
  groups.reserve(numels.size());
  for (std::size_t i = 0; i < numels.size(); ++i) {
    groups.push_back({"p" + std::to_string(i), numels[i]});
  }
  return groups;
}

py::dict io_dict(std::string_view engine, const swap::IoOptions& io) {
  py::dict d;
  d["engine"] = std::string(engine);
  d["block_size"] = io.block_size;
  d["queue_depth"] = io.queue_depth;
  d["threads"] = io.threads;
  return d;
}

void bind_optimizer(py::module_& m) {
  using namespace pybind11::literals;
  py::class_<swap::IoOptions>(m, "IoOptions",
                              "I/O settings of a store (see zinf.torch's aio= arguments).")
      .def(py::init<>())
      .def_property_readonly("block_size", [](const swap::IoOptions& o) { return o.block_size; })
      .def_property_readonly("queue_depth", [](const swap::IoOptions& o) { return o.queue_depth; })
      .def_property_readonly("threads", [](const swap::IoOptions& o) { return o.threads; });
  m.def(
      "io_options",
      [](const std::string& json_text, const std::string& source, const std::string& path) {
        if (!path.empty()) return offload::load_config(path).io_options();
        if (!json_text.empty()) return offload::parse_config(json_text, source).io_options();
        return swap::IoOptions{};
      },
      "json_text"_a = "", "source"_a = "aio", "path"_a = "",
      "The I/O settings of a ds_config's aio block (and zinf.backend): from the ds_config file "
      "at `path`, or from `json_text`, read by the engine's own config reader (its errors name "
      "`source` and the key); neither: the library's defaults.");
  m.attr("min_sub_group_elements") = offload::kConfigMinSubGroupSize;
  m.def(
      "default_sub_group_elements",
      [](const std::string& precision) {
        return optim::default_sub_group_elements(
            adam::parse_state_precision(precision, "state_precision"));
      },
      "precision"_a,
      "Elements per sub-group when none is given: records of 12 MiB (1M fp32, 1.5M bf16, "
      "2054336 int8).");
  py::class_<OffloadedOptimizer>(m, "OffloadedOptimizer",
                                 "zinf's offloaded Adam state; see zinf.torch.AdamW(state=...).")
      .def(py::init([](const std::vector<std::uint64_t>& numels, const std::string& tier,
                       const std::vector<std::string>& directories, std::uint64_t sub_group,
                       std::uint32_t depth, std::uint64_t pinned_budget, std::size_t threads,
                       bool checksums, const std::string& state_precision,
                       const swap::IoOptions& io) {
             optim::OptimizerOptions o =
                 optimizer_options(tier, directories, sub_group, depth, pinned_budget, threads,
                                   checksums, state_precision, io);
             std::vector<optim::ParamGroupSpec> groups = numbered_groups(numels);
             py::gil_scoped_release nogil;
             return std::make_unique<OffloadedOptimizer>(std::move(o), std::move(groups));
           }),
           "numels"_a, "tier"_a, "directories"_a, "sub_group_elements"_a, "pipeline_depth"_a,
           "pinned_budget_bytes"_a, "threads"_a, "checksums"_a, "state_precision"_a = "fp32",
           "io"_a = swap::IoOptions{})
      .def("set_params",
           [](OffloadedOptimizer& o, std::size_t group, std::uintptr_t params, std::size_t n) {
             py::gil_scoped_release nogil;
             o.set_params(group, {reinterpret_cast<const float*>(params), n});
           })
      .def(
          "set_hyper",
          [](OffloadedOptimizer& o, std::size_t group, double lr, double beta1, double beta2,
             double eps, double weight_decay, bool bias_correction, bool adamw, double grad_scale) {
            o.set_hyper(group, make_hyper(lr, beta1, beta2, eps, weight_decay, bias_correction,
                                          adamw, grad_scale));
          },
          "group"_a, "lr"_a, "beta1"_a, "beta2"_a, "eps"_a, "weight_decay"_a, "bias_correction"_a,
          "adamw"_a, "grad_scale"_a = 1.0)
      .def("begin_step", py::overload_cast<>(&OffloadedOptimizer::begin_step))
      .def("step_group",
           [](OffloadedOptimizer& o, std::size_t group, std::uintptr_t grads,
              const std::string& grad_dtype, std::uintptr_t params, std::size_t n) {
             const adam::GradView g{reinterpret_cast<const void*>(grads), n,
                                    parse_dtype(grad_dtype, "OffloadedOptimizer.step_group grads")};
             o.step_group(
                 group, g,
                 adam::CopyOut{reinterpret_cast<void*>(params), n, ElementType::kF32, true});
           })
      .def("end_step",
           [](OffloadedOptimizer& o) {
             optim::StepStats s;
             {
               py::gil_scoped_release nogil;
               s = o.end_step();
             }
             return stats_dict(s);
           })
      .def("set_state",
           [](OffloadedOptimizer& o, std::size_t group, std::uintptr_t p, std::uintptr_t m_,
              std::uintptr_t v, std::size_t n) {
             auto span = [n](std::uintptr_t a) {
               return std::span<const float>(reinterpret_cast<const float*>(a), n);
             };
             py::gil_scoped_release nogil;
             o.set_state(group, span(p), span(m_), span(v));
           })
      .def("set_step_count", &OffloadedOptimizer::set_step_count)
      .def("read_state",
           [](OffloadedOptimizer& o, std::size_t group, std::uintptr_t p, std::uintptr_t m_,
              std::uintptr_t v, std::size_t n) {
             auto span = [n](std::uintptr_t a) {
               return a == 0 ? std::span<float>()
                             : std::span<float>(reinterpret_cast<float*>(a), n);
             };
             py::gil_scoped_release nogil;
             o.read_state(group, span(p), span(m_), span(v));
           })
      .def("save",
           [](OffloadedOptimizer& o, const std::string& dir) {
             py::gil_scoped_release nogil;
             o.save(dir);
           })
      .def("save_async",
           [](OffloadedOptimizer& o, const std::string& dir) {
             py::gil_scoped_release nogil;
             o.save_async(dir);
           })
      .def("wait_save",
           [](OffloadedOptimizer& o) {
             py::gil_scoped_release nogil;
             o.wait_save();
           })
      .def("save_in_flight", &OffloadedOptimizer::save_in_flight)
      .def("last_save_snapshot",
           [](const OffloadedOptimizer& o) {
             return std::string(optim::save_snapshot_name(o.last_save_snapshot()));
           })
      .def("load",
           [](OffloadedOptimizer& o, const std::string& dir) {
             py::gil_scoped_release nogil;
             o.load(dir);
           })
      // A small text saved inside every later checkpoint's version (committed with its
      // state), and the one in the version LATEST names in `dir`: zinf.torch keeps the
      // parameters' shapes there, which the records (element counts only) do not hold.
      .def("set_checkpoint_file",
           [](OffloadedOptimizer& o, const std::string& name, std::optional<std::string> text) {
             o.set_checkpoint_file(name, std::move(text));
           })
      .def("read_checkpoint_file",
           [](OffloadedOptimizer& o, const std::string& dir,
              const std::string& name) -> std::optional<std::string> {
             py::gil_scoped_release nogil;
             o.wait_save();  // as load() does first
             return o.read_checkpoint_file(o.checkpoint_directory(dir, /*create=*/false), name);
           })
      .def("step_count", &OffloadedOptimizer::step_count)
      .def("pinned_bytes", &OffloadedOptimizer::pinned_bytes)
      .def("engine_name", [](const OffloadedOptimizer& o) { return std::string(o.engine_name()); })
      .def("io",
           [](const OffloadedOptimizer& o) { return io_dict(o.engine_name(), o.io_options()); });
}

}  // namespace zinf::python
