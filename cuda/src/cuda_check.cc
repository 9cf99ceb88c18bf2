// SPDX-License-Identifier: Apache-2.0
// The error paths of ZINF_CUDA_CHECK and ZINF_CUDA_CHECK_NOTHROW.
#include "cuda_check.h"

#include <cstring>

#include "zinf/common/error.h"
#include "zinf/common/log.h"

namespace zinf::cuda::detail {

std::string cuda_error_text(cudaError_t err, std::string_view call, const char* file, int line) {
  const char* base = std::strrchr(file, '/');
  std::string out(call);
  out += " failed at ";
  out += base != nullptr ? base + 1 : file;
  out += ':';  // piecewise: ":" + std::to_string(line) trips GCC 12 -Wrestrict at -O3
  out += std::to_string(line);
  out += ": ";
  out += cudaGetErrorName(err);
  out += ": ";
  out += cudaGetErrorString(err);
  return out;
}

void throw_cuda_error(cudaError_t err, std::string_view call, const char* file, int line) {
  // Clear the runtime's last-error slot so that the next, unrelated check does not see it.
  (void)cudaGetLastError();
  throw DeviceError(cuda_error_text(err, call, file, line));
}

bool check_cuda_nothrow(cudaError_t err, const char* call, const char* file, int line) noexcept {
  if (err == cudaSuccess || err == cudaErrorCudartUnloading) return true;
  (void)cudaGetLastError();
  try {
    log(LogLevel::kWarning, cuda_error_text(err, call, file, line));
  } catch (...) {
    // Out of memory while formatting: nothing more can be said.
  }
  return false;
}

}  // namespace zinf::cuda::detail
