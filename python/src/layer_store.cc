// SPDX-License-Identifier: Apache-2.0
// zinf._native.LayerStore: the NVMe tier of zinf.torch.offload_parameters, on the engine's own
// prefetch::LayerStore. Each unit's parameters (one flat byte range per unit) are a layer; a
// traced fetch copies the unit from the prefetcher's window into the torch tensor that will
// back the unit's parameters, on the compute stream:
// - "cuda": zinf's CUDA device with torch's stream adopted as the compute stream. NVMe ->
//   pinned staging -> the window's device memory (zinf's copy stream, read ahead) -> the
//   tensor (a device-to-device copy on torch's stream, after the window's event): one
//   host-to-device copy per issued unit, no pageable copy, no host synchronisation.
// - "host": the host simulation, with a stream of its own; the same code, and the fetch
//   waits for that stream before returning (CPU torch reads the tensor at once).
// The tensor is torch's, so autograd may keep views of it for as long as it likes; the
// window's memory is recycled once the stream is past the copy.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <pybind11/stl.h>

#include "native.h"
#include "zinf/common/error.h"
#include "zinf/cuda/cuda_interop.h"
#include "zinf/cuda/device.h"
#include "zinf/prefetch/layer_store.h"

namespace zinf::python {
namespace {

// cudaStreamLegacy: torch reports its default stream as 0, which adopt_stream refuses as
// ambiguous; torch's 0 is the legacy default stream.
void* const kCudaStreamLegacy = reinterpret_cast<void*>(std::uintptr_t{1});

class PyLayerStore {
 public:
  PyLayerStore(const std::vector<std::uint64_t>& unit_bytes,
               const std::vector<std::string>& directories, std::size_t depth, bool checksums,
               const swap::IoOptions& io, const std::string& device, int device_index,
               std::uintptr_t stream) {
    cuda::DeviceOptions d;
    if (device == "cuda") {
      d.kind = cuda::DeviceKind::kCuda;
      d.device_index = device_index;
    } else if (device == "host") {
      d.kind = cuda::DeviceKind::kHost;
    } else {
      throw UsageError("LayerStore: device must be 'cuda' or 'host', got '" + device + "'");
    }
    device_ = cuda::make_device(d);
    if (d.kind == cuda::DeviceKind::kCuda) {
      adopted_ = cuda::adopt_stream(
          *device_, stream == 0 ? kCudaStreamLegacy : reinterpret_cast<void*>(stream));
      compute_ = adopted_.ref();
    } else {
      own_ = device_->create_stream();
      compute_ = own_.ref();
    }
    prefetch::LayerStoreOptions o;
    for (std::size_t u = 0; u < unit_bytes.size(); ++u) {
      o.keys.push_back("unit" + std::to_string(u));
      o.bytes.push_back(unit_bytes[u]);
    }
    o.directories = directories;
    o.io = io;
    o.checksums = checksums;
    o.depth = depth;
    o.huge_pages = false;  // windows of a few units: the arena is sized to them
    store_ = std::make_unique<prefetch::LayerStore>(o, *device_, compute_);
  }

  ~PyLayerStore() {
    store_.reset();  // waits for its reads and the compute stream before the streams go
  }

  std::size_t unit_count() const { return store_->layer_count(); }

  void write(std::size_t u, std::uintptr_t address, std::uint64_t bytes) {
    py::gil_scoped_release nogil;
    store_->write(u, {reinterpret_cast<const std::byte*>(address), bytes});
  }

  /// Copies unit `u` into `address` (device memory of the store's device: a CUDA tensor, or
  /// host memory on the host device) in the traced order, on the compute stream.
  void fetch_into(std::size_t u, std::uintptr_t address, std::uint64_t bytes) {
    py::gil_scoped_release nogil;
    store_->fetch_into(u, cuda::adopt_device_memory(
                              *device_, reinterpret_cast<void*>(address), bytes));
    ++fetches_;
    if (device_->kind() == cuda::DeviceKind::kHost) device_->synchronize(compute_);
  }

  /// Copies unit `u` into host memory at `address` straight from the store, outside the
  /// traced order. Blocking.
  void read(std::size_t u, std::uintptr_t address, std::uint64_t bytes) {
    py::gil_scoped_release nogil;
    store_->read(u, {reinterpret_cast<std::byte*>(address), bytes});
  }

  void end_iteration() {
    py::gil_scoped_release nogil;
    store_->end_iteration();
  }

  py::dict stats() const {
    const prefetch::PrefetcherStats s = store_->prefetch_stats();
    const cuda::DeviceStats d = device_->stats();
    const auto seconds = [](std::chrono::nanoseconds n) {
      return std::chrono::duration<double>(n).count();
    };
    py::dict out;
    out["acquires"] = s.acquires;
    out["hits"] = s.hits;
    out["on_demand"] = s.on_demand;
    out["retraces"] = s.retraces;
    out["layers_issued"] = s.layers_issued;
    out["evictions"] = s.evictions;
    out["bytes_read"] = s.bytes_read;
    out["read_busy_seconds"] = seconds(s.read_busy_time);
    out["acquire_blocked_seconds"] = seconds(s.acquire_blocked_time);
    out["stall_seconds"] = seconds(s.stall_time);
    out["peak_held_bytes"] = s.peak_held_bytes;
    out["bytes_written"] = store_->store().stats().bytes_out;
    out["fetches"] = fetches_;
    out["bytes_to_device"] = d.bytes_to_device;
    out["bytes_on_device"] = d.bytes_on_device;
    out["pageable_copies"] = d.pageable_copies;
    out["device"] = std::string(device_->name());
    return out;
  }

  std::vector<std::string> file_paths() const { return store_->store().file_paths(); }
  std::string engine_name() const { return std::string(store_->engine().name()); }
  py::dict io() const { return io_dict(store_->engine().name(), store_->engine().options()); }

 private:
  // Destroyed in reverse: the store (its prefetcher uses the compute stream and the device),
  // then the streams, then the device.
  std::unique_ptr<cuda::Device> device_;
  cuda::Stream own_;
  cuda::AdoptedStream adopted_;
  cuda::StreamRef compute_;
  std::unique_ptr<prefetch::LayerStore> store_;
  std::uint64_t fetches_ = 0;
};

}  // namespace

void bind_layer_store(py::module_& m) {
  using namespace pybind11::literals;
  py::class_<PyLayerStore>(m, "LayerStore",
                           "Units of parameters on NVMe, read ahead in traced order onto the "
                           "host or a CUDA device; see zinf.torch.offload_parameters.")
      .def(py::init([](const std::vector<std::uint64_t>& unit_bytes,
                       const std::vector<std::string>& directories, std::size_t depth,
                       bool checksums, const swap::IoOptions& io, const std::string& device,
                       int device_index, std::uintptr_t stream) {
             py::gil_scoped_release nogil;
             return std::make_unique<PyLayerStore>(unit_bytes, directories, depth, checksums, io,
                                                   device, device_index, stream);
           }),
           "unit_bytes"_a, "directories"_a, "depth"_a, "checksums"_a = true,
           "io"_a = swap::IoOptions{}, "device"_a = "host", "device_index"_a = 0,
           "stream"_a = 0)
      .def("io", &PyLayerStore::io)
      .def("write", &PyLayerStore::write, "unit"_a, "address"_a, "nbytes"_a)
      .def("fetch_into", &PyLayerStore::fetch_into, "unit"_a, "address"_a, "nbytes"_a)
      .def("read", &PyLayerStore::read, "unit"_a, "address"_a, "nbytes"_a)
      .def("end_iteration", &PyLayerStore::end_iteration)
      .def("stats", &PyLayerStore::stats)
      .def("unit_count", &PyLayerStore::unit_count)
      .def("file_paths", &PyLayerStore::file_paths)
      .def("engine_name", &PyLayerStore::engine_name);
}

}  // namespace zinf::python
