// SPDX-License-Identifier: Apache-2.0
// status_from_current_exception: every exception type to its code, errno and context kept.
#include <cerrno>
#include <new>
#include <stdexcept>

#include <gtest/gtest.h>

#include "zinf/common/error.h"
#include "zinf/common/status.h"

namespace zinf {
namespace {

template <typename Throw>
Status caught(Throw&& thrower) {
  try {
    thrower();
  } catch (...) {
    return status_from_current_exception();
  }
  return Status::ok_status();
}

TEST(StatusFromException, IoErrorKeepsItsStatusWhole) {
  const Status io = Status::from_errno(EACCES, "open config", "/etc/x.json", 0, 4096);
  const Status s = caught([&] { throw IoError(io); });
  EXPECT_EQ(s.code(), ErrorCode::kPermission);
  EXPECT_EQ(s.sys_errno(), EACCES);
  EXPECT_EQ(s.path(), "/etc/x.json");
  EXPECT_EQ(s.offset(), 0u);
  EXPECT_EQ(s.length(), 4096u);
  EXPECT_EQ(s.to_string(), io.to_string());
}

TEST(StatusFromException, EngineFailedIsAFailedStateThatKeepsTheCausesErrno) {
  const Status cause = Status::from_errno(ENOSPC, "write", "/nvme/a.swp", 8192, 4096);
  const Status s = caught([&] { throw EngineFailed(cause); });
  EXPECT_EQ(s.code(), ErrorCode::kFailedState);
  EXPECT_EQ(s.sys_errno(), ENOSPC);
  EXPECT_EQ(s.path(), "/nvme/a.swp");
  EXPECT_EQ(s.offset(), 8192u);
  EXPECT_EQ(s.operation(), "write");
}

TEST(StatusFromException, EachOtherTypeToItsCode) {
  struct Case {
    Status status;
    ErrorCode code;
    const char* message;
  };
  const Case cases[] = {
      {caught([] { throw UsageError("bad option"); }), ErrorCode::kInvalidArgument, "bad option"},
      {caught([] { throw DeviceError("cudaMalloc: out of memory"); }), ErrorCode::kDevice,
       "cudaMalloc: out of memory"},
      {caught([] { throw std::bad_alloc(); }), ErrorCode::kResource,
       "out of memory (std::bad_alloc)"},
      {caught([] { throw std::logic_error("a bug"); }), ErrorCode::kInternal, "a bug"},
      {caught([] { throw Error("plain zinf error"); }), ErrorCode::kInternal, "plain zinf error"},
      {caught([] { throw 42; }), ErrorCode::kInternal, "unknown exception"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(c.status.code(), c.code) << c.message;
    EXPECT_EQ(c.status.message(), c.message);
    EXPECT_EQ(c.status.sys_errno(), 0) << c.message;  // nothing to keep: no errno invented
  }
}

TEST(StatusFromException, OutsideACatchBlockIsInternal) {
  const Status s = status_from_current_exception();
  EXPECT_EQ(s.code(), ErrorCode::kInternal);
  EXPECT_FALSE(s.ok());
}

TEST(StatusFromException, NewCodesHaveNames) {
  EXPECT_EQ(error_code_name(ErrorCode::kDevice), "device");
  EXPECT_EQ(error_code_name(ErrorCode::kInternal), "internal");
}

}  // namespace
}  // namespace zinf
