// SPDX-License-Identifier: Apache-2.0
// Exceptions at the public API, built from a Status.
#include "zinf/common/error.h"

#include <exception>
#include <new>

namespace zinf {

IoError::IoError(Status status) : Error(status.to_string()), status_(std::move(status)) {}

EngineFailed::EngineFailed(Status cause)
    : Error("refusing work after an earlier failure: " + cause.to_string()),
      cause_(std::move(cause)) {}

void throw_if_error(const Status& status) {
  if (!status.ok()) throw IoError(status);
}

namespace {

// The code of the exception being handled; allocates nothing, so it survives an exhausted
// heap where the text does not.
ErrorCode current_exception_code() noexcept {
  try {
    throw;
  } catch (const IoError& e) {
    return e.code();
  } catch (const EngineFailed&) {
    return ErrorCode::kFailedState;
  } catch (const UsageError&) {
    return ErrorCode::kInvalidArgument;
  } catch (const DeviceError&) {
    return ErrorCode::kDevice;
  } catch (const std::bad_alloc&) {
    return ErrorCode::kResource;
  } catch (...) {
    return ErrorCode::kInternal;
  }
}

}  // namespace

Status status_from_current_exception() noexcept {
  const ErrorCode code = std::current_exception() ? current_exception_code() : ErrorCode::kInternal;
  try {
    if (!std::current_exception()) return Status::error(code, "no exception is being handled");
    try {
      throw;
    } catch (const IoError& e) {
      return e.status();
    } catch (const EngineFailed& e) {
      return Status(e.cause()).with_code(code);
    } catch (const std::bad_alloc&) {
      return Status::error(code, "out of memory (std::bad_alloc)");
    } catch (const std::exception& e) {
      return Status::error(code, e.what());
    } catch (...) {
      return Status::error(code, "unknown exception");
    }
  } catch (...) {
    return Status::error(code, {});  // copying the text failed: an empty string allocates nothing
  }
}

}  // namespace zinf
