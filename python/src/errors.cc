// SPDX-License-Identifier: Apache-2.0
// zinf's exceptions as Python exceptions. An I/O failure is an OSError, as Python's own file
// errors are, so `except OSError` catches it and errno/filename work; zinf adds where in the
// file it happened (offset, length) and what kind of failure it was (kind: "short_transfer",
// "corrupt", ...), which Python's own OSError has no place for.
#include <exception>
#include <string>

#include "native.h"
#include "zinf/common/error.h"
#include "zinf/common/status.h"

namespace zinf::python {
namespace {

PyObject* io_error_type = nullptr;  // zinf._native.IoError, alive for the process

void raise_io_error(const Status& status, const char* what) {
  py::object type = py::reinterpret_borrow<py::object>(io_error_type);
  py::object exc;
  if (status.sys_errno() == 0) {
    // No errno (a short read, a checksum mismatch, a budget): OSError(errno, ...) would print
    // "[Errno 0]". The message already names the file; errno stays None, filename is set.
    exc = type(what);
    if (!status.path().empty()) exc.attr("filename") = status.path();
  } else {
    exc = status.path().empty() ? type(status.sys_errno(), what)
                                : type(status.sys_errno(), what, status.path());
  }
  // None where the failure has no place in a file (an open, a budget).
  exc.attr("offset") = status.offset() == Status::kUnset ? py::none() : py::cast(status.offset());
  exc.attr("length") = status.length() == Status::kUnset ? py::none() : py::cast(status.length());
  exc.attr("kind") = std::string(error_code_name(status.code()));
  PyErr_SetObject(io_error_type, exc.ptr());
}

}  // namespace

void bind_errors(py::module_& m) {
  io_error_type = PyErr_NewExceptionWithDoc(
      "zinf._native.IoError",
      "A zinf I/O failure: an OSError with errno, strerror and filename, plus offset and length "
      "(bytes: where in the file) and kind (zinf's error code name, e.g. 'short_transfer').",
      PyExc_OSError, nullptr);
  if (io_error_type == nullptr) throw py::error_already_set();
  m.add_object("IoError", py::handle(io_error_type));
  // OSError prints "[Errno None] None: 'file'" once a filename is set without an errno: an
  // error without one (a short read, a checksum mismatch) prints zinf's message, which names
  // the file, offset and length itself.
  py::handle type(io_error_type);
  const py::object os_error_str = py::handle(PyExc_OSError).attr("__str__");
  type.attr("__str__") = py::cpp_function(
      [os_error_str](py::object self) -> py::object {
        if (self.attr("errno").is_none()) {
          const py::tuple args = self.attr("args");
          return args.empty() ? py::str("") : py::str(args[0]);
        }
        return os_error_str(self);
      },
      py::is_method(type));
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const IoError& e) {
      raise_io_error(e.status(), e.what());
    } catch (const EngineFailed& e) {
      raise_io_error(e.cause(), e.what());
    } catch (const UsageError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const DeviceError& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
  });
}

}  // namespace zinf::python
