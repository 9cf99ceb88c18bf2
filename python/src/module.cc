// SPDX-License-Identifier: Apache-2.0
#include "native.h"

PYBIND11_MODULE(_native, m) {
  m.doc() = "zinf's C++ core (I/O engine, pinned buffers, CPU Adam); use zinf, zinf.torch";
  zinf::python::bind_errors(m);
  zinf::python::bind_aio(m);
  zinf::python::bind_pinned(m);
  zinf::python::bind_adam(m);
  zinf::python::bind_optimizer(m);
  zinf::python::bind_layer_store(m);
  zinf::python::bind_activations(m);
  zinf::python::bind_direct_file(m);
  zinf::python::bind_dist(m);
}
