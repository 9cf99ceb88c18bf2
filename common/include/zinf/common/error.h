// SPDX-License-Identifier: Apache-2.0
// The exceptions zinf throws at its public API (docs/style.md section 3). Each owns its text.
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

/// The Status behind the exception being handled, for code that passes errors on as values
/// (a pipeline thread, the C API): call it inside a catch block. The one mapping of exception
/// to ErrorCode, so that every such place reports the same code for the same failure:
///   IoError         its Status as it is (code, errno, path, range, message)
///   EngineFailed    its cause with the code kFailedState (errno, path, range kept)
///   UsageError      kInvalidArgument, what()
///   DeviceError     kDevice, what()
///   std::bad_alloc  kResource, "out of memory (std::bad_alloc)"
///   std::exception  kInternal, what() (anything else thrown is a bug)
///   anything else   kInternal, "unknown exception"
/// Never throws: if copying the text runs out of memory, the code alone comes back. Outside a
/// catch block it returns kInternal "no exception is being handled".
Status status_from_current_exception() noexcept;

}  // namespace zinf
