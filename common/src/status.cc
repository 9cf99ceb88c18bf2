// SPDX-License-Identifier: Apache-2.0
// Status rendering and the errno -> ErrorCode table (docs/style.md section 3).
#include "zinf/common/status.h"

#include <cerrno>
#include <cstring>
#include <string>

namespace zinf {

std::string_view error_code_name(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::kOk: return "ok";
    case ErrorCode::kIo: return "io";
    case ErrorCode::kNoSpace: return "no_space";
    case ErrorCode::kNotFound: return "not_found";
    case ErrorCode::kPermission: return "permission";
    case ErrorCode::kUnsupported: return "unsupported";
    case ErrorCode::kResource: return "resource";
    case ErrorCode::kCancelled: return "cancelled";
    case ErrorCode::kTimedOut: return "timed_out";
    case ErrorCode::kShortTransfer: return "short_transfer";
    case ErrorCode::kCorrupt: return "corrupt";
    case ErrorCode::kInvalidArgument: return "invalid_argument";
    case ErrorCode::kFailedState: return "failed_state";
    case ErrorCode::kDevice: return "device";
    case ErrorCode::kInternal: return "internal";
  }
  return "unknown";
}

ErrorCode error_code_from_errno(int err, bool opening_direct) noexcept {
  switch (err) {
    case 0: return ErrorCode::kOk;
    case ENOSPC:
    case EDQUOT: return ErrorCode::kNoSpace;
    case ENOENT:
    case ENODEV: return ErrorCode::kNotFound;
    case EACCES:
    case EPERM:
    case EROFS: return ErrorCode::kPermission;
    case EOPNOTSUPP:
    case ENOSYS: return ErrorCode::kUnsupported;
    case EINVAL: return opening_direct ? ErrorCode::kUnsupported : ErrorCode::kIo;
    case ENOMEM:
    case EMFILE:
    case ENFILE: return ErrorCode::kResource;
    case ECANCELED: return ErrorCode::kCancelled;
    case ETIMEDOUT: return ErrorCode::kTimedOut;
    default: return ErrorCode::kIo;
  }
}

std::string errno_name(int err) {
  // strerrorname_np is glibc >= 2.32; Debian 12 has 2.36.
  if (const char* name = strerrorname_np(err)) return name;
  return "errno " + std::to_string(err);
}

Status Status::from_errno(int err, std::string operation, std::string path, std::uint64_t offset,
                          std::uint64_t length) {
  Status s;
  s.code_ = error_code_from_errno(err);
  if (s.code_ == ErrorCode::kOk) s.code_ = ErrorCode::kIo;  // errno 0 is still a failure here
  s.errno_ = err;
  s.operation_ = std::move(operation);
  s.path_ = std::move(path);
  s.offset_ = offset;
  s.length_ = length;
  return s;
}

Status Status::error(ErrorCode code, std::string message) {
  Status s;
  s.code_ = code == ErrorCode::kOk ? ErrorCode::kIo : code;
  s.message_ = std::move(message);
  return s;
}

std::string Status::to_string() const {
  if (ok()) return "ok";
  // "<op> failed: <path> offset=.. length=.. done=.. engine=..: <message>"; the details that
  // are unset are left out, and so is their separator when none is set.
  std::string details = path_;
  auto add = [&details](const std::string& field) {
    if (!details.empty()) details += ' ';
    details += field;
  };
  if (offset_ != kUnset) add("offset=" + std::to_string(offset_));
  if (length_ != kUnset) add("length=" + std::to_string(length_));
  if (bytes_done_ != kUnset) add("done=" + std::to_string(bytes_done_));
  if (!backend_.empty()) add("engine=" + backend_);
  std::string out = operation_.empty() ? std::string("operation") : operation_;
  out += " failed";
  if (!details.empty()) out += ": " + details;
  out += ": ";
  if (!message_.empty()) {
    out += message_;
    if (errno_ != 0) out += " (" + errno_name(errno_) + ")";
  } else if (errno_ != 0) {
    out += std::strerror(errno_);
    out += " (" + errno_name(errno_) + ")";
  } else {
    out += std::string(error_code_name(code_));
  }
  return out;
}

}  // namespace zinf
