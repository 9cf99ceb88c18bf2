// SPDX-License-Identifier: Apache-2.0
// DirectFileWriter/Reader for Python: the native half of zinf.torch.FastFileWriter and
// FastFileReader (python/zinf/torch.py), which give torch.save and torch.load a file object.
// Bytes cross through the buffer protocol (bytes, bytearray, memoryview: what pickle and
// torch's zip writer hand over), and the GIL is released while they are copied or waited for.
#include <cstddef>
#include <span>
#include <string>

#include "native.h"
#include "zinf/swap/direct_file.h"

namespace zinf::python {
namespace {

std::span<const std::byte> bytes_of(const py::buffer_info& info) {
  return {static_cast<const std::byte*>(info.ptr),
          static_cast<std::size_t>(info.size * info.itemsize)};
}

}  // namespace

void bind_direct_file(py::module_& m) {
  using swap::DirectFileReader;
  using swap::DirectFileWriter;
  py::class_<DirectFileWriter>(m, "DirectFileWriter",
                               "Sequential O_DIRECT writer; see zinf.torch.FastFileWriter.")
      .def(py::init([](const std::string& path, std::uint64_t buffer_bytes, bool sync) {
             return std::make_unique<DirectFileWriter>(
                 path, swap::DirectFileOptions{.buffer_bytes = buffer_bytes, .sync_on_close = sync});
           }),
           py::arg("path"), py::arg("buffer_bytes"), py::arg("sync") = true)
      .def("write",
           [](DirectFileWriter& w, const py::buffer& b) {
             // One contiguous run of bytes: the Python side passes memoryview(b).cast("B").
             const py::buffer_info info = b.request();
             const auto data = bytes_of(info);
             py::gil_scoped_release nogil;
             w.write(data);
             return data.size();
           })
      .def("flush",
           [](DirectFileWriter& w) {
             py::gil_scoped_release nogil;
             w.flush();
           })
      .def("close",
           [](DirectFileWriter& w) {
             py::gil_scoped_release nogil;
             w.close();
           })
      .def("size", &DirectFileWriter::size)
      .def("is_direct", &DirectFileWriter::is_direct)
      .def("closed", &DirectFileWriter::closed);
  py::class_<DirectFileReader>(m, "DirectFileReader",
                               "O_DIRECT reader; see zinf.torch.FastFileReader.")
      .def(py::init([](const std::string& path, std::uint64_t buffer_bytes) {
             return std::make_unique<DirectFileReader>(
                 path, swap::DirectFileOptions{.buffer_bytes = buffer_bytes});
           }),
           py::arg("path"), py::arg("buffer_bytes"))
      .def("size", &DirectFileReader::size)
      .def("is_direct", &DirectFileReader::is_direct)
      .def("read_into",
           [](DirectFileReader& r, std::uint64_t offset, const py::buffer& b) {
             const py::buffer_info info = b.request(/*writable=*/true);
             std::span<std::byte> out{static_cast<std::byte*>(info.ptr),
                                      static_cast<std::size_t>(info.size * info.itemsize)};
             py::gil_scoped_release nogil;
             return r.read_at(offset, out);
           });
}

}  // namespace zinf::python
