// SPDX-License-Identifier: Apache-2.0
// Exceptions at the public API, built from a Status.
#include "zinf/common/error.h"

namespace zinf {

IoError::IoError(Status status) : Error(status.to_string()), status_(std::move(status)) {}

EngineFailed::EngineFailed(Status cause)
    : Error("refusing work after an earlier failure: " + cause.to_string()),
      cause_(std::move(cause)) {}

void throw_if_error(const Status& status) {
  if (!status.ok()) throw IoError(status);
}

}  // namespace zinf
