// SPDX-License-Identifier: Apache-2.0
#include "zinf/common/status.h"

#include <cerrno>

#include <gtest/gtest.h>

#include "zinf/common/error.h"
#include "zinf/common/log.h"

namespace zinf {
namespace {

TEST(Status, DefaultIsOk) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.to_string(), "ok");
}

TEST(Status, MapsErrnoPerStyleTable) {
  EXPECT_EQ(error_code_from_errno(ENOSPC), ErrorCode::kNoSpace);
  EXPECT_EQ(error_code_from_errno(EDQUOT), ErrorCode::kNoSpace);
  EXPECT_EQ(error_code_from_errno(ENOENT), ErrorCode::kNotFound);
  EXPECT_EQ(error_code_from_errno(ENODEV), ErrorCode::kNotFound);
  EXPECT_EQ(error_code_from_errno(EACCES), ErrorCode::kPermission);
  EXPECT_EQ(error_code_from_errno(EPERM), ErrorCode::kPermission);
  EXPECT_EQ(error_code_from_errno(EROFS), ErrorCode::kPermission);
  EXPECT_EQ(error_code_from_errno(EINVAL, /*opening_direct=*/true), ErrorCode::kUnsupported);
  EXPECT_EQ(error_code_from_errno(EINVAL), ErrorCode::kIo);
  EXPECT_EQ(error_code_from_errno(EOPNOTSUPP), ErrorCode::kUnsupported);
  EXPECT_EQ(error_code_from_errno(ENOMEM), ErrorCode::kResource);
  EXPECT_EQ(error_code_from_errno(EMFILE), ErrorCode::kResource);
  EXPECT_EQ(error_code_from_errno(ECANCELED), ErrorCode::kCancelled);
  EXPECT_EQ(error_code_from_errno(EIO), ErrorCode::kIo);
}

TEST(Status, MessageNamesPathOffsetLengthAndErrno) {
  Status s = Status::from_errno(EIO, "read", "/nvme/a.swp", 1048576, 4194304)
                 .with_bytes_done(0)
                 .with_backend("uring");
  EXPECT_EQ(s.code(), ErrorCode::kIo);
  EXPECT_EQ(s.sys_errno(), EIO);
  EXPECT_EQ(s.to_string(),
            "read failed: /nvme/a.swp offset=1048576 length=4194304 done=0 engine=uring: "
            "Input/output error (EIO)");
}

TEST(Status, ExplicitMessageKeepsErrnoName) {
  Status s = Status::error(ErrorCode::kShortTransfer, "zero bytes before the end")
                 .with_operation("read")
                 .with_path("/x")
                 .with_range(0, 4096)
                 .with_bytes_done(512);
  EXPECT_EQ(s.to_string(),
            "read failed: /x offset=0 length=4096 done=512: zero bytes before the end");
}

TEST(Status, WithoutPathReadsAsOneSentence) {
  EXPECT_EQ(Status::error(ErrorCode::kIo, "boom").with_operation("copy").to_string(),
            "copy failed: boom");
  EXPECT_EQ(Status::from_errno(EIO, "read", "", 0, 4096).to_string(),
            "read failed: offset=0 length=4096: Input/output error (EIO)");
}

TEST(Error, IoErrorCarriesStatus) {
  Status s = Status::from_errno(ENOSPC, "write", "/full/f", 0, 8192);
  try {
    throw_if_error(s);
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNoSpace);
    EXPECT_EQ(e.sys_errno(), ENOSPC);
    EXPECT_NE(std::string(e.what()).find("/full/f offset=0 length=8192"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("(ENOSPC)"), std::string::npos);
  }
  EXPECT_NO_THROW(throw_if_error(Status()));
}

TEST(Error, EngineFailedQuotesCause) {
  EngineFailed e(Status::from_errno(EIO, "write", "/a", 4096, 4096));
  EXPECT_EQ(std::string(e.what()),
            "refusing work after an earlier failure: write failed: /a offset=4096 length=4096: "
            "Input/output error (EIO)");
}

TEST(Log, SinkReceivesMessagesAtOrAboveLevel) {
  std::vector<std::string> got;
  LogSink old = set_log_sink([&](LogLevel, std::string_view m) { got.emplace_back(m); });
  LogLevel old_level = log_level();
  set_log_level(LogLevel::kNotice);
  log(LogLevel::kDebug, "hidden");
  log(LogLevel::kNotice, "shown");
  set_log_level(old_level);
  set_log_sink(std::move(old));
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0], "shown");
}

}  // namespace
}  // namespace zinf
