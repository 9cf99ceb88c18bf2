// SPDX-License-Identifier: Apache-2.0
// zinf::dist for Python: Collectives built from Python callables (the callback adapter, which
// zinf.distributed fills with torch.distributed calls) and the ShardedOptimizer over them.
// The collectives run on the thread that calls into zinf with the GIL released, so each
// callback takes the GIL back; buffers reach Python as DLPack capsules over zinf's memory (no
// copy; torch.utils.dlpack.from_dlpack wraps them) that are valid only during the callback.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <pybind11/stl.h>

#include "native.h"
#include "zinf/common/error.h"
#include "zinf/dist/callback_collectives.h"
#include "zinf/dist/collectives.h"
#include "zinf/dist/sharded_optimizer.h"
#include "zinf/optim/optimizer.h"

namespace zinf::python {
namespace {

using dist::Collectives;
using dist::ElementType;
using dist::ReduceOp;

// The buffers reach Python as DLPack capsules ("dltensor"), which torch.utils.dlpack.from_dlpack
// wraps without a copy. Not memoryviews and torch.frombuffer: such a tensor's storage holds a
// Python object, and torch.distributed's gloo worker thread may drop the last reference to the
// tensor after the collective has returned, then take the GIL to release it, which aborts the
// process when that happens during interpreter exit. A DLPack tensor's storage holds only the
// struct below, freed without the GIL. DLPack's C ABI (dlpack.h, v0.x), declared here rather
// than pulled in as a dependency for five structs.
struct DLDevice {
  std::int32_t device_type;  // kDLCPU = 1
  std::int32_t device_id;
};
struct DLDataType {
  std::uint8_t code;  // kDLInt = 0, kDLUInt = 1, kDLFloat = 2
  std::uint8_t bits;
  std::uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  std::int32_t ndim;
  DLDataType dtype;
  std::int64_t* shape;
  std::int64_t* strides;
  std::uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor*);
};

// One 1-D tensor's DLManagedTensor and its shape, freed by the consumer through `deleter` (or by
// the capsule if nobody consumed it). It does not own the memory it describes.
struct Managed {
  DLManagedTensor tensor{};
  std::int64_t shape[1] = {0};
};

void delete_managed(DLManagedTensor* t) { delete static_cast<Managed*>(t->manager_ctx); }

DLDataType dl_type(ElementType type) {
  switch (type) {
    case ElementType::kF32: return {2, 32, 1};
    case ElementType::kF64: return {2, 64, 1};
    case ElementType::kI32: return {0, 32, 1};
    case ElementType::kI64: return {0, 64, 1};
    case ElementType::kU8: return {1, 8, 1};
    case ElementType::kBF16: return {4, 16, 1};
    case ElementType::kF16: return {2, 16, 1};
  }
  return {1, 8, 1};
}

// An empty span may have no address; DLPack wants one.
std::byte empty_byte{};

// A capsule over `bytes` as a 1-D tensor of `type` (bytes.size() is whole elements: the adapter
// checked it). The memory is zinf's and valid only during the callback; a const span (a
// collective's input) must not be written, which DLPack cannot say.
py::capsule capsule_of(std::span<const std::byte> bytes, ElementType type) {
  auto m = std::make_unique<Managed>();
  m->shape[0] = static_cast<std::int64_t>(bytes.size() / dist::element_size(type));
  DLTensor& t = m->tensor.dl_tensor;
  t.data = const_cast<std::byte*>(bytes.empty() ? &empty_byte : bytes.data());
  t.device = {1, 0};
  t.ndim = 1;
  t.dtype = dl_type(type);
  t.shape = m->shape;
  t.strides = nullptr;  // compact
  t.byte_offset = 0;
  m->tensor.manager_ctx = m.get();
  m->tensor.deleter = delete_managed;
  py::capsule cap(&m->tensor, "dltensor", [](PyObject* o) {
    // A consumer renames the capsule "used_dltensor" and takes over the deleter's call.
    if (PyCapsule_IsValid(o, "dltensor")) {
      auto* unused = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(o, "dltensor"));
      unused->deleter(unused);
    }
  });
  m.release();  // the capsule or its consumer owns it now
  return cap;
}

// Calls `f` with the GIL held, with the arguments `make_args` builds once it is held (no
// Python object may be made without it). A Python exception becomes a std::runtime_error with
// its type and text, which the adapter turns into a CollectiveError naming the operation and
// this rank: no Python object leaves the GIL's scope.
template <class MakeArgs>
void call_python(const py::function& f, MakeArgs&& make_args) {
  py::gil_scoped_acquire gil;
  try {
    f(*make_args());
  } catch (py::error_already_set& e) {
    throw std::runtime_error(py::str(e.type().attr("__name__")).cast<std::string>() + ": " +
                             py::str(e.value()).cast<std::string>());
  }
}

ElementType parse_element_type(const std::string& name) {
  for (ElementType t : {ElementType::kF32, ElementType::kF64, ElementType::kI32, ElementType::kI64,
                        ElementType::kU8}) {
    if (dist::element_type_name(t) == name) return t;
  }
  throw UsageError("collectives: element type must be fp32, fp64, i32, i64 or u8, got '" + name +
                   "'");
}

ReduceOp parse_reduce_op(const std::string& name) {
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
    if (dist::reduce_op_name(op) == name) return op;
  }
  throw UsageError("collectives: reduce op must be sum, avg, max or min, got '" + name + "'");
}

std::span<std::byte> bytes_at(std::uintptr_t address, std::size_t n) {
  return {reinterpret_cast<std::byte*>(address), n};
}

}  // namespace

void bind_dist(py::module_& m) {
  using namespace pybind11::literals;
  py::class_<Collectives>(m, "Collectives",
                          "A group of ranks (zinf::dist::Collectives); see zinf.distributed.")
      .def_property_readonly("rank", &Collectives::rank)
      .def_property_readonly("size", &Collectives::size)
      .def_property_readonly("name", [](const Collectives& c) { return std::string(c.name()); })
      // Addresses and byte counts of host memory, as zinf.torch passes tensors; blocking, so
      // the GIL is released (the callbacks take it back).
      .def("all_gather",
           [](Collectives& c, std::uintptr_t send, std::size_t send_bytes, std::uintptr_t recv,
              std::size_t recv_bytes) {
             py::gil_scoped_release nogil;
             c.all_gather(bytes_at(send, send_bytes), bytes_at(recv, recv_bytes));
           })
      .def("reduce_scatter",
           [](Collectives& c, std::uintptr_t send, std::size_t send_bytes, std::uintptr_t recv,
              std::size_t recv_bytes, const std::string& type, const std::string& op) {
             const ElementType t = parse_element_type(type);
             const ReduceOp o = parse_reduce_op(op);
             py::gil_scoped_release nogil;
             c.reduce_scatter(bytes_at(send, send_bytes), bytes_at(recv, recv_bytes), t, o);
           })
      .def("all_reduce",
           [](Collectives& c, std::uintptr_t data, std::size_t bytes, const std::string& type,
              const std::string& op) {
             const ElementType t = parse_element_type(type);
             const ReduceOp o = parse_reduce_op(op);
             py::gil_scoped_release nogil;
             c.all_reduce(bytes_at(data, bytes), t, o);
           })
      .def("broadcast",
           [](Collectives& c, std::uintptr_t data, std::size_t bytes, int root) {
             py::gil_scoped_release nogil;
             c.broadcast(bytes_at(data, bytes), root);
           })
      .def("barrier", [](Collectives& c) {
        py::gil_scoped_release nogil;
        c.barrier();
      });

  m.def(
      "callback_collectives",
      [](int rank, int size, const std::string& name, py::function all_gather,
         py::function all_reduce, py::function broadcast, py::function barrier,
         std::optional<py::function> reduce_scatter) {
        dist::CollectiveCallbacks cb;
        cb.rank = rank;
        cb.size = size;
        cb.name = name;
        // The std::functions hold the Python callables; they are copied only here, with the
        // GIL held, and destroyed with the Collectives, which Python owns (GIL held too).
        cb.all_gather = [f = std::move(all_gather)](std::span<const std::byte> send,
                                                    std::span<std::byte> recv) {
          call_python(f, [&] {
            return py::make_tuple(capsule_of(send, ElementType::kU8),
                                  capsule_of(recv, ElementType::kU8));
          });
        };
        cb.all_reduce = [f = std::move(all_reduce)](std::span<std::byte> data, ElementType type,
                                                    ReduceOp op) {
          call_python(f, [&] {
            return py::make_tuple(capsule_of(data, type),
                                  std::string(dist::element_type_name(type)),
                                  std::string(dist::reduce_op_name(op)));
          });
        };
        cb.broadcast = [f = std::move(broadcast)](std::span<std::byte> data, int root) {
          call_python(f, [&] { return py::make_tuple(capsule_of(data, ElementType::kU8), root); });
        };
        cb.barrier = [f = std::move(barrier)] { call_python(f, [] { return py::tuple(); }); };
        if (reduce_scatter && !reduce_scatter->is_none()) {
          cb.reduce_scatter = [f = std::move(*reduce_scatter)](std::span<const std::byte> send,
                                                               std::span<std::byte> recv,
                                                               ElementType type, ReduceOp op) {
            call_python(f, [&] {
              return py::make_tuple(capsule_of(send, ElementType::kU8),
                                    capsule_of(recv, ElementType::kU8),
                                    std::string(dist::element_type_name(type)),
                                    std::string(dist::reduce_op_name(op)));
            });
          };
        }
        return dist::make_callback_collectives(std::move(cb));
      },
      "rank"_a, "size"_a, "name"_a, "all_gather"_a, "all_reduce"_a, "broadcast"_a, "barrier"_a,
      "reduce_scatter"_a = py::none(),
      "Collectives over Python callables (host memory). all_gather(send, recv), "
      "all_reduce(data, dtype, op) with op 'sum', 'max' or 'min' (an average is summed and "
      "divided by zinf), broadcast(data, root), barrier(), and optionally "
      "reduce_scatter(send, recv, dtype, op): buffers are DLPack capsules of 1-D CPU tensors "
      "(torch.utils.dlpack.from_dlpack), uint8 for all_gather and broadcast, of `dtype` ('fp32', "
      "'fp64', 'i32', 'i64' or 'u8') for the reductions; valid only during the call, and a "
      "collective's input (send) must not be written. A callback fails by "
      "raising; the collective then raises zinf.IoError naming it and this rank, and every "
      "later call raises too (the group is failed).");

  py::class_<dist::ShardedOptimizer>(
      m, "ShardedOptimizer",
      "Adam across ranks, each keeping 1/N of the state; see zinf.distributed.ShardedAdam.")
      .def(py::init([](const std::vector<std::uint64_t>& numels, Collectives& comm,
                       const std::string& tier, const std::vector<std::string>& directories,
                       std::uint64_t sub_group, std::uint32_t depth, std::uint64_t pinned_budget,
                       std::size_t threads, bool checksums, const std::string& state_precision,
                       const swap::IoOptions& io, int stage) {
             optim::OptimizerOptions o =
                 optimizer_options(tier, directories, sub_group, depth, pinned_budget, threads,
                                   checksums, state_precision, io);
             std::vector<optim::ParamGroupSpec> groups = numbered_groups(numels);
             // The constructor runs no collective, so the GIL may go.
             py::gil_scoped_release nogil;
             return std::make_unique<dist::ShardedOptimizer>(std::move(o), std::move(groups), comm,
                                                             stage);
           }),
           // The optimizer keeps a reference to the collectives: they live as long as it.
           py::keep_alive<1, 3>(), "numels"_a, "collectives"_a, "tier"_a, "directories"_a,
           "sub_group_elements"_a, "pipeline_depth"_a, "pinned_budget_bytes"_a, "threads"_a,
           "checksums"_a, "state_precision"_a = "fp32", "io"_a = swap::IoOptions{}, "stage"_a = 2)
      .def_property_readonly("stage", &dist::ShardedOptimizer::stage)
      .def("shard_numel", &dist::ShardedOptimizer::shard_numel)
      .def("shard_offset", &dist::ShardedOptimizer::shard_offset)
      .def("set_params",
           [](dist::ShardedOptimizer& o, std::size_t group, std::uintptr_t params, std::size_t n) {
             py::gil_scoped_release nogil;
             o.set_params(group, {reinterpret_cast<const float*>(params), n});
           })
      .def(
          "set_hyper",
          [](dist::ShardedOptimizer& o, std::size_t group, double lr, double beta1, double beta2,
             double eps, double weight_decay, bool bias_correction, bool adamw) {
            o.local().set_hyper(
                group, make_hyper(lr, beta1, beta2, eps, weight_decay, bias_correction, adamw));
          },
          "group"_a, "lr"_a, "beta1"_a, "beta2"_a, "eps"_a, "weight_decay"_a, "bias_correction"_a,
          "adamw"_a)
      .def(
          "step",
          [](dist::ShardedOptimizer& o, const std::vector<std::uintptr_t>& grads,
             const std::vector<std::uintptr_t>& params, const std::vector<std::size_t>& numels,
             double clip, double loss_scale) {
            if (grads.size() != numels.size() || params.size() != numels.size()) {
              throw UsageError("ShardedOptimizer.step: " + std::to_string(grads.size()) +
                               " gradients and " + std::to_string(params.size()) +
                               " parameters for " + std::to_string(numels.size()) + " sizes");
            }
            std::vector<std::span<const float>> g;
            std::vector<std::span<float>> p;
            for (std::size_t i = 0; i < numels.size(); ++i) {
              g.emplace_back(reinterpret_cast<const float*>(grads[i]), numels[i]);
              p.emplace_back(reinterpret_cast<float*>(params[i]), numels[i]);
            }
            optim::StepStats s;
            {
              py::gil_scoped_release nogil;
              s = o.step(g, p, dist::ShardedStepOptions{clip, loss_scale});
            }
            return stats_dict(s);
          },
          "grads"_a, "params"_a, "numels"_a, "clip"_a = 0.0, "loss_scale"_a = 1.0)
      .def("read_state",
           [](dist::ShardedOptimizer& o, std::size_t group, std::uintptr_t p, std::uintptr_t m_,
              std::uintptr_t v, std::size_t n) {
             auto span = [n](std::uintptr_t a) {
               return a == 0 ? std::span<float>()
                             : std::span<float>(reinterpret_cast<float*>(a), n);
             };
             py::gil_scoped_release nogil;
             o.local().read_state(group, span(p), span(m_), span(v));
           })
      .def("save",
           [](dist::ShardedOptimizer& o, const std::string& dir) {
             py::gil_scoped_release nogil;
             o.save(dir);
           })
      .def("load",
           [](dist::ShardedOptimizer& o, const std::string& dir) {
             py::gil_scoped_release nogil;
             o.load(dir);
           })
      .def("step_count", [](dist::ShardedOptimizer& o) { return o.local().step_count(); })
      .def("pinned_bytes", [](dist::ShardedOptimizer& o) { return o.local().pinned_bytes(); });
}

}  // namespace zinf::python
