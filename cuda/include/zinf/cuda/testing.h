// SPDX-License-Identifier: Apache-2.0
// Test hooks of zinf::cuda: what the host simulation knows of its memory, for tests that run
// device-memory code on it. For tests only.
#pragma once

#include <cstddef>

#include "zinf/cuda/device.h"

namespace zinf::cuda::test_hooks {

/// True if [data, data + bytes) lies inside one live allocation (DeviceBuffer) of `device`, a
/// host simulation (DeviceKind::kHost). Its device memory is host memory, so a host buffer
/// passed where device memory belongs would still work there: this is how a test proves it was
/// not. UsageError for another backend.
bool host_device_owns(const Device& device, const void* data, std::size_t bytes);

}  // namespace zinf::cuda::test_hooks
