// SPDX-License-Identifier: Apache-2.0
// zinf._native: the pybind11 module over zinf's C++ layers. It never links libtorch: tensors
// cross as (address, bytes, dtype) from the pure-Python side (zinf.torch, zinf.compat), so one
// build serves any torch version. Each unit binds itself into the module.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "zinf/adam/cpu_adam.h"
#include "zinf/optim/optimizer.h"
#include "zinf/swap/io_engine.h"

namespace zinf::python {

namespace py = pybind11;

/// zinf.IoError (a subclass of OSError with errno, strerror, filename, plus offset, length and
/// kind) and the translation of every zinf exception: IoError and EngineFailed -> IoError,
/// UsageError -> ValueError, DeviceError -> RuntimeError.
void bind_errors(py::module_& m);
/// The DeepSpeed-shaped aio handle over a zinf IoEngine.
void bind_aio(py::module_& m);
/// Pinned, budgeted host buffers (buffer protocol) from a BufferPool.
void bind_pinned(py::module_& m);
/// A dtype as zinf.torch names it ("fp32", "bf16", "fp16"; torch's "float32", "bfloat16",
/// "float16" too). UsageError (ValueError in Python) naming `what` for anything else.
ElementType parse_dtype(const std::string& name, const char* what);
/// The hyper-parameters of one update as Python passes them (mode: adamw or L2 Adam).
adam::AdamParams make_hyper(double lr, double beta1, double beta2, double eps, double weight_decay,
                            bool bias_correction, bool adamw, double grad_scale = 1.0,
                            std::uint64_t step = 1);
/// CpuAdam over caller memory.
void bind_adam(py::module_& m);
/// OffloadedOptimizer: Adam state in pinned memory or on NVMe, fp32 copy-out. Also IoOptions
/// (the I/O settings every store takes, from a ds_config's aio block) and io_options().
void bind_optimizer(py::module_& m);
/// The optimizer options both optimizers' constructors take from Python (zinf.torch.AdamW's
/// and zinf.distributed.ShardedAdam's storage arguments). UsageError for a bad tier or
/// precision name.
optim::OptimizerOptions optimizer_options(const std::string& tier,
                                          const std::vector<std::string>& directories,
                                          std::uint64_t sub_group, std::uint32_t depth,
                                          std::uint64_t pinned_budget, std::size_t threads,
                                          bool checksums, const std::string& state_precision,
                                          const swap::IoOptions& io);
/// An I/O engine's name and settings as a dict (engine, block_size, queue_depth, threads): what
/// the stores report so that a caller can see its aio settings arrived.
py::dict io_dict(std::string_view engine, const swap::IoOptions& io);
/// One group per parameter tensor, named p0, p1, ... in the order Python gives them.
std::vector<optim::ParamGroupSpec> numbered_groups(const std::vector<std::uint64_t>& numels);
/// A step's statistics as a dict (the StepStats field names), for both optimizers.
py::dict stats_dict(const optim::StepStats& s);
/// zinf::dist: Collectives over Python callables, ShardedOptimizer (zinf.distributed).
void bind_dist(py::module_& m);
/// LayerStore: units of parameters on NVMe, read ahead onto the host or a CUDA device
/// (zinf.torch.offload_parameters).
void bind_layer_store(py::module_& m);
/// ActivationStore over CPU tensors (zinf.torch.offload_activations).
void bind_activations(py::module_& m);
/// DirectFileWriter/Reader (zinf.torch.FastFileWriter, FastFileReader).
void bind_direct_file(py::module_& m);

}  // namespace zinf::python
