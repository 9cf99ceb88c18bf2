// SPDX-License-Identifier: Apache-2.0
// ZINF_CUDA_CHECK / ZINF_CUDA_CHECK_NOTHROW: every CUDA runtime call is checked, and a failure
// names the call's text, file:line, the error's name and its string (docs/style.md section 3).
// Private to zinf::cuda; only built with CUDA.
#pragma once

#include <cuda_runtime.h>

#include <string>
#include <string_view>

namespace zinf::cuda::detail {

/// "<call> failed at <file>:<line>: <cudaErrorName>: <error string>", file without directories.
std::string cuda_error_text(cudaError_t err, std::string_view call, const char* file, int line);

/// Clears the runtime's last error, then throws zinf::DeviceError with cuda_error_text.
[[noreturn]] void throw_cuda_error(cudaError_t err, std::string_view call, const char* file,
                                   int line);

/// For destructors: returns true for cudaSuccess and for cudaErrorCudartUnloading (the runtime
/// is shutting down at process exit and has released everything already); otherwise clears the
/// last error, logs cuda_error_text as a warning and returns false. Never throws.
bool check_cuda_nothrow(cudaError_t err, const char* call, const char* file, int line) noexcept;

}  // namespace zinf::cuda::detail

/// Evaluates a CUDA runtime call; on failure clears the sticky last error and throws
/// zinf::DeviceError naming the call, file:line, error name and string.
#define ZINF_CUDA_CHECK(call)                                                            \
  do {                                                                                   \
    const cudaError_t zinf_cuda_err_ = (call);                                           \
    if (zinf_cuda_err_ != cudaSuccess) [[unlikely]]                                      \
      ::zinf::cuda::detail::throw_cuda_error(zinf_cuda_err_, #call, __FILE__, __LINE__); \
  } while (0)

/// Evaluates a CUDA runtime call in a destructor or callback: logs a failure instead of
/// throwing, accepts cudaErrorCudartUnloading. Yields true if the call is to be taken as done.
#define ZINF_CUDA_CHECK_NOTHROW(call) \
  ::zinf::cuda::detail::check_cuda_nothrow((call), #call, __FILE__, __LINE__)
