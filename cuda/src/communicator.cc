// SPDX-License-Identifier: Apache-2.0
// What every build has of the Communicator: the factory's answer where NCCL is missing. The NCCL backend is nccl_communicator.cc, built only with NCCL.
#include "zinf/cuda/communicator.h"

#include <string>

#include "zinf/common/error.h"
#include "zinf/config.h"

namespace zinf::cuda {

#if !ZINF_HAVE_NCCL

std::string nccl_unavailable_reason() {
  return "zinf was built without NCCL (ZINF_WITH_NCCL=OFF, no CUDA, or nccl.h/libnccl not found "
         "at configure time)";
}

CommunicatorId make_communicator_id() {
  throw DeviceError("cannot make a communicator id: " + nccl_unavailable_reason());
}

std::unique_ptr<Communicator> make_nccl_communicator(Device& /*device*/,
                                                     const CommunicatorOptions& /*options*/) {
  throw DeviceError("cannot create an NCCL communicator: " + nccl_unavailable_reason());
}

#endif

}  // namespace zinf::cuda
