// SPDX-License-Identifier: Apache-2.0
// ActivationStore for zinf.torch.offload_activations: the C++ store on the host simulation of a
// device, whose "device memory" is the caller's host memory (CPU tensors, adopted by address).
// Each call blocks until its copy is done: a pack hook's tensor may be freed as soon as the hook
// returns, and an unpack hook returns a tensor autograd reads at once. The NVMe writes and the
// reads ahead of backward still run on the store's threads. One calling thread (autograd's
// hooks run on the training thread for CPU tensors).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <pybind11/stl.h>

#include "native.h"
#include "zinf/common/error.h"
#include "zinf/cuda/cuda_interop.h"
#include "zinf/cuda/device.h"
#include "zinf/offload/activation_store.h"

namespace zinf::python {
namespace {

class Activations {
 public:
  Activations(const std::string& tier, const std::vector<std::string>& directories,
              std::uint64_t capacity_bytes, std::uint64_t pinned_budget_bytes,
              std::size_t prefetch_depth, bool checksums, const swap::IoOptions& io) {
    offload::ActivationStoreOptions o;
    o.io = io;
    if (tier == "cpu") {
      o.tier = offload::ActivationTier::kCpu;
    } else if (tier == "nvme") {
      o.tier = offload::ActivationTier::kNvme;
    } else {
      throw UsageError("ActivationStore: tier '" + tier + "': expected cpu or nvme");
    }
    o.directories = directories;
    o.capacity_bytes = capacity_bytes;
    o.pinned_budget_bytes = pinned_budget_bytes;
    o.prefetch_depth = prefetch_depth;
    o.checksums = checksums;
    cuda::DeviceOptions d;
    d.kind = cuda::DeviceKind::kHost;
    device_ = cuda::make_device(d);
    stream_ = device_->create_stream();
    store_ = std::make_unique<offload::ActivationStore>(*device_, o);
  }

  ~Activations() {
    store_.reset();  // waits for its copies and I/O
    stream_ = {};
  }

  std::uint64_t save(const std::string& name, std::uintptr_t address, std::uint64_t bytes) {
    py::gil_scoped_release nogil;
    const cuda::DeviceSpan src =
        cuda::adopt_device_memory(*device_, reinterpret_cast<void*>(address), bytes);
    const auto h = store_->save(name, src, stream_.ref());
    store_->wait_saved(h, stream_.ref());
    device_->synchronize(stream_.ref());  // the caller may free the tensor on return
    return h;
  }

  void load(std::uint64_t handle, std::uintptr_t address, std::uint64_t bytes) {
    py::gil_scoped_release nogil;
    const cuda::DeviceSpan dst =
        cuda::adopt_device_memory(*device_, reinterpret_cast<void*>(address), bytes);
    store_->load(handle, dst, stream_.ref());
    device_->synchronize(stream_.ref());
  }

  void clear() {
    py::gil_scoped_release nogil;
    store_->clear();
  }

  py::dict stats() const {
    const offload::ActivationStats s = store_->stats();
    py::dict d;
    d["saved"] = s.saved;
    d["loaded"] = s.loaded;
    d["bytes_saved"] = s.bytes_saved;
    d["bytes_written"] = s.bytes_written;
    d["bytes_read"] = s.bytes_read;
    d["hits"] = s.hits;
    d["on_demand"] = s.on_demand;
    d["held_tensors"] = s.held_tensors;
    d["held_bytes"] = s.held_bytes;
    d["pinned_bytes_peak"] = s.pinned_bytes_peak;
    return d;
  }

 private:
  std::unique_ptr<cuda::Device> device_;
  cuda::Stream stream_;
  std::unique_ptr<offload::ActivationStore> store_;
};

}  // namespace

void bind_activations(py::module_& m) {
  py::class_<Activations>(m, "ActivationStore",
                          "Activations out to pinned memory or NVMe and back (CPU tensors by "
                          "address); see zinf.torch.offload_activations")
      .def(py::init<const std::string&, const std::vector<std::string>&, std::uint64_t,
                    std::uint64_t, std::size_t, bool, const swap::IoOptions&>(),
           py::arg("tier"), py::arg("directories"), py::arg("capacity_bytes"),
           py::arg("pinned_budget_bytes"), py::arg("prefetch_depth"), py::arg("checksums"),
           py::arg("io") = swap::IoOptions{})
      .def("save", &Activations::save, py::arg("name"), py::arg("address"), py::arg("nbytes"))
      .def("load", &Activations::load, py::arg("handle"), py::arg("address"), py::arg("nbytes"))
      .def("clear", &Activations::clear)
      .def("stats", &Activations::stats);
}

}  // namespace zinf::python
