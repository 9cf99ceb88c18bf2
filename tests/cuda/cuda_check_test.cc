// SPDX-License-Identifier: Apache-2.0
// ZINF_CUDA_CHECK and ZINF_CUDA_CHECK_NOTHROW (private to zinf::cuda, tested white-box): the
// text a user sees and the destructor variant. Needs no GPU. (That the last-error slot is
// cleared cannot be seen here: without a driver cudaGetLastError keeps returning the init error.)
#include "cuda_check.h"

#include <string>

#include <gtest/gtest.h>

#include "device_test_util.h"
#include "zinf/common/error.h"

namespace zinf::cuda {
namespace {

cudaError_t fails_with(cudaError_t err) { return err; }

TEST(CudaCheck, ThrowsDeviceErrorWithCallFileLineNameAndString) {
  int line = 0;
  try {
    line = __LINE__ + 1;
    ZINF_CUDA_CHECK(fails_with(cudaErrorInvalidValue));
    FAIL() << "no exception";
  } catch (const DeviceError& e) {
    EXPECT_EQ(std::string(e.what()),
              "fails_with(cudaErrorInvalidValue) failed at cuda_check_test.cc:" +
                  std::to_string(line) + ": cudaErrorInvalidValue: invalid argument");
  }
}

TEST(CudaCheck, SuccessDoesNothing) { EXPECT_NO_THROW(ZINF_CUDA_CHECK(fails_with(cudaSuccess))); }

TEST(CudaCheck, NoThrowLogsFailuresAndAcceptsUnloading) {
  test::LogCapture logs(LogLevel::kWarning);
  EXPECT_TRUE(ZINF_CUDA_CHECK_NOTHROW(fails_with(cudaSuccess)));
  EXPECT_TRUE(ZINF_CUDA_CHECK_NOTHROW(fails_with(cudaErrorCudartUnloading)));
  EXPECT_TRUE(logs.lines().empty());
  const int line = __LINE__ + 1;
  EXPECT_FALSE(ZINF_CUDA_CHECK_NOTHROW(fails_with(cudaErrorInvalidDevice)));
  ASSERT_EQ(logs.lines().size(), 1u);
  EXPECT_EQ(logs.lines()[0],
            "warning: fails_with(cudaErrorInvalidDevice) failed at cuda_check_test.cc:" +
                std::to_string(line) + ": cudaErrorInvalidDevice: invalid device ordinal");
}

}  // namespace
}  // namespace zinf::cuda
