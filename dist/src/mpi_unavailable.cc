// SPDX-License-Identifier: Apache-2.0
// The MPI adapter's factory in a build without MPI: it says why instead of failing to link.
#include <string>

#include "zinf/common/error.h"
#include "zinf/dist/mpi_collectives.h"

namespace zinf::dist {

std::string mpi_unavailable_reason() {
  return "zinf was built without MPI (ZINF_WITH_MPI=OFF, or no MPI C bindings found at "
         "configure time; Debian: libopenmpi-dev)";
}

std::unique_ptr<Collectives> make_mpi_collectives(const MpiCollectivesOptions& /*options*/) {
  throw UsageError("cannot create MPI collectives: " + mpi_unavailable_reason());
}

}  // namespace zinf::dist
