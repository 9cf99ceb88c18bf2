// SPDX-License-Identifier: Apache-2.0
// The exceptions zinf throws at its public API (STYLE.md section 3). Each owns its text.
// Part of zinf::common.
#pragma once

#include <stdexcept>
#include <string>

#include "zinf/common/status.h"

namespace zinf {

/// Base of every exception zinf throws. `what()` is the one-line message.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

/// A failed storage or setup operation; carries the Status with path, offset, length, errno.
class IoError : public Error {
 public:
  explicit IoError(Status status);
  const Status& status() const noexcept { return status_; }
  ErrorCode code() const noexcept { return status_.code(); }
  int sys_errno() const noexcept { return status_.sys_errno(); }

 private:
  Status status_;
};

/// Misuse of the public API (misaligned buffer, unknown key, bad option). Thrown in every
/// build type.
class UsageError : public Error {
 public:
  explicit UsageError(const std::string& message) : Error(message) {}
};

/// A failure reported by a device backend (CUDA call, host simulation).
class DeviceError : public Error {
 public:
  explicit DeviceError(const std::string& message) : Error(message) {}
};

/// Thrown by every call on an object that an earlier failure left inconsistent; quotes it.
class EngineFailed : public Error {
 public:
  explicit EngineFailed(Status cause);
  const Status& cause() const noexcept { return cause_; }

 private:
  Status cause_;
};

/// Throws IoError(status) unless it is ok.
void throw_if_error(const Status& status);

}  // namespace zinf
