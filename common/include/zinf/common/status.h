// SPDX-License-Identifier: Apache-2.0
// Status: one failure (or success) with all of its context, passed as a value across threads.
// Part of zinf::common, beneath every layer. Converted to an exception (zinf/common/error.h)
// only at the public API.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace zinf {

/// What kind of failure a Status records. The raw errno is kept beside it.
enum class ErrorCode : std::uint8_t {
  kOk = 0,
  kIo,             ///< any other errno from the OS (EIO, EBADF, ...)
  kNoSpace,        ///< ENOSPC, EDQUOT: the device or quota is full (retryable after freeing space)
  kNotFound,       ///< ENOENT, ENODEV
  kPermission,     ///< EACCES, EPERM, EROFS
  kUnsupported,    ///< EINVAL on an O_DIRECT open, EOPNOTSUPP, ENOSYS
  kResource,       ///< ENOMEM, EMFILE, ENFILE
  kCancelled,      ///< ECANCELED, or work dropped by shutdown
  kTimedOut,       ///< ETIMEDOUT, or a bounded retry that ran out
  kShortTransfer,  ///< a transfer stopped before its length (no errno)
  kCorrupt,        ///< a checksum mismatch or an inconsistent on-disk structure (no errno)
  kInvalidArgument,  ///< misuse detected where a Status rather than an exception is the channel
  kFailedState,      ///< an engine that refuses work after an earlier unrecoverable failure
  kDevice,           ///< a device backend failed (a CUDA call, its host simulation); no errno
  kInternal,         ///< an unexpected exception: a bug, never bad input (no errno)
};

/// Returns the stable lower-case name of `code` ("no_space", "short_transfer", ...).
std::string_view error_code_name(ErrorCode code) noexcept;

/// Maps an errno value to an ErrorCode following docs/style.md section 3. `opening_direct` marks an
/// open(2) with O_DIRECT, where EINVAL means "this file system has no direct I/O".
ErrorCode error_code_from_errno(int err, bool opening_direct = false) noexcept;

/// Returns the symbolic name of an errno value ("EIO", "ENOSPC", ...), or "errno N".
std::string errno_name(int err);

/// A success, or a failure with the operation, path, offset, length, bytes done, backend and
/// errno that produced it. Cheap to move; copyable. Thread-compatible (no internal locking).
class [[nodiscard]] Status {
 public:
  /// Marks "no value" for offset/length fields that do not apply.
  static constexpr std::uint64_t kUnset = ~std::uint64_t{0};

  /// Constructs a success.
  Status() = default;

  /// Returns a success.
  static Status ok_status() { return Status(); }

  /// Builds a failure from an errno value (`err` > 0), mapping it to an ErrorCode.
  static Status from_errno(int err, std::string operation, std::string path = {},
                           std::uint64_t offset = kUnset, std::uint64_t length = kUnset);

  /// Builds a failure with an explicit code and message and no errno.
  static Status error(ErrorCode code, std::string message);

  bool ok() const noexcept { return code_ == ErrorCode::kOk; }
  ErrorCode code() const noexcept { return code_; }
  int sys_errno() const noexcept { return errno_; }
  const std::string& operation() const noexcept { return operation_; }
  const std::string& path() const noexcept { return path_; }
  std::uint64_t offset() const noexcept { return offset_; }
  std::uint64_t length() const noexcept { return length_; }
  std::uint64_t bytes_done() const noexcept { return bytes_done_; }
  const std::string& backend() const noexcept { return backend_; }
  const std::string& message() const noexcept { return message_; }

  // Builders, so that a lower layer can add what it knows as the Status travels up.
  Status& with_code(ErrorCode c) & {
    code_ = c;
    return *this;
  }
  Status&& with_code(ErrorCode c) && {
    code_ = c;
    return std::move(*this);
  }
  Status& with_errno(int e) & {
    errno_ = e;
    return *this;
  }
  Status&& with_errno(int e) && {
    errno_ = e;
    return std::move(*this);
  }
  Status& with_operation(std::string op) & {
    operation_ = std::move(op);
    return *this;
  }
  Status&& with_operation(std::string op) && {
    operation_ = std::move(op);
    return std::move(*this);
  }
  Status& with_path(std::string p) & {
    path_ = std::move(p);
    return *this;
  }
  Status&& with_path(std::string p) && {
    path_ = std::move(p);
    return std::move(*this);
  }
  Status& with_range(std::uint64_t off, std::uint64_t len) & {
    offset_ = off;
    length_ = len;
    return *this;
  }
  Status&& with_range(std::uint64_t off, std::uint64_t len) && {
    offset_ = off;
    length_ = len;
    return std::move(*this);
  }
  Status& with_bytes_done(std::uint64_t n) & {
    bytes_done_ = n;
    return *this;
  }
  Status&& with_bytes_done(std::uint64_t n) && {
    bytes_done_ = n;
    return std::move(*this);
  }
  Status& with_backend(std::string b) & {
    backend_ = std::move(b);
    return *this;
  }
  Status&& with_backend(std::string b) && {
    backend_ = std::move(b);
    return std::move(*this);
  }
  Status& with_message(std::string m) & {
    message_ = std::move(m);
    return *this;
  }
  Status&& with_message(std::string m) && {
    message_ = std::move(m);
    return std::move(*this);
  }

  /// Returns the one-line text a user sees, e.g.
  /// `read failed: /nvme/a.swp offset=1048576 length=4194304 done=0 engine=uring: Input/output error (EIO)`.
  /// A success renders as "ok".
  std::string to_string() const;

  /// Discards this Status on purpose; `reason` documents why at the call site.
  void ignore(std::string_view reason) const noexcept { (void)reason; }

 private:
  ErrorCode code_ = ErrorCode::kOk;
  int errno_ = 0;
  std::uint64_t offset_ = kUnset;
  std::uint64_t length_ = kUnset;
  std::uint64_t bytes_done_ = kUnset;
  std::string operation_;
  std::string path_;
  std::string backend_;
  std::string message_;
};

}  // namespace zinf
