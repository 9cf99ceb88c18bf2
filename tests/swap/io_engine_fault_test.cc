// SPDX-License-Identifier: Apache-2.0
// IoEngine under faults, for every backend: FaultPlan errors, short transfers, EAGAIN storms
// and delays go through each backend's own retry and resubmission code; the error a user sees
// names errno, path, offset and length; the engine keeps serving afterwards. Also the real
// fallback when io_uring_setup is refused (seccomp) and when fixed buffers are (memlock).
#include <linux/audit.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "io_test_util.h"
#include "support/pattern.h"
#include "support/test_dir.h"
#include "zinf/common/error.h"
#include "zinf/common/log.h"
#include "zinf/swap/fault_injection.h"
#include "zinf/swap/file.h"
#include "zinf/swap/io_engine.h"

namespace zinf::swap {
namespace {

using test::AlignedBuffer;
using test::check_pattern;
using test::fill_pattern;

constexpr std::uint32_t kBlock = 64 << 10;

class IoEngineFault : public test::BackendTest {
 protected:
  std::unique_ptr<IoEngine> make(std::vector<FaultRule> rules, std::uint64_t seed = 1) {
    plan_ = std::make_shared<FaultPlan>(std::move(rules), seed);
    IoOptions o;
    o.kind = GetParam();
    o.block_size = kBlock;
    o.queue_depth = 8;
    o.faults = plan_;
    return make_io_engine(o);
  }

  File open_file(const std::string& name) {
    return File::open(dir_.file(name), FileOptions{.create = true});
  }

  // Writes `bytes` of generation `gen` at `offset` (no faults expected) and returns nothing.
  static void write_pattern(IoEngine& e, FileId id, std::uint64_t offset, std::size_t bytes,
                            std::uint32_t gen) {
    AlignedBuffer out(bytes);
    fill_pattern(out.span(), id.index, offset, gen);
    IoRequest w{IoOp::kWrite, id, offset, out.span()};
    e.submit({&w, 1}).wait();
  }

  static std::string read_and_check(IoEngine& e, FileId id, std::uint64_t offset, std::size_t bytes,
                                    std::uint32_t gen) {
    AlignedBuffer in(bytes);
    IoRequest r{IoOp::kRead, id, offset, in.span()};
    e.submit({&r, 1}).wait();
    return check_pattern(in.span(), id.index, offset, gen);
  }

  test::TestDir dir_;
  std::shared_ptr<FaultPlan> plan_;
};

TEST(FaultPlan, FiredCountsTheFaultsEachRuleInjected) {
  // Rule 0 fires on the 2nd and 3rd matching write; rule 1 on every read; a read at offset 0
  // matches both but only the first rule in order that fires decides.
  FaultRule eio;
  eio.op = IoOp::kWrite;
  eio.first_match = 1;
  eio.times = 2;
  FaultRule delay;
  delay.kind = FaultKind::kDelay;
  delay.op = IoOp::kRead;
  delay.times = ~0ull;
  FaultPlan plan({eio, delay}, 7);
  const FileId f{0};
  for (int i = 0; i < 5; ++i) (void)plan.decide(IoOp::kWrite, f, 0);
  for (int i = 0; i < 3; ++i) (void)plan.decide(IoOp::kRead, f, 4096);
  EXPECT_EQ(plan.fired(0), 2u);
  EXPECT_EQ(plan.fired(1), 3u);
  EXPECT_EQ(plan.fired(2), 0u);  // past the rules
  EXPECT_EQ(plan.injected(), 5u);
  EXPECT_EQ(plan.injected_errors(), 2u);
}

TEST_P(IoEngineFault, EioOnTheNthPieceNamesTheRequestAndTheEngineGoesOn) {
  FaultRule eio;
  eio.kind = FaultKind::kError;
  eio.op = IoOp::kRead;
  eio.first_match = 2;  // the third read piece
  eio.err = EIO;
  auto engine = make({eio});
  File file = open_file("eio.dat");
  const FileId id = engine->attach(file);
  write_pattern(*engine, id, 0, 8 * kBlock, 1);

  AlignedBuffer in(8 * kBlock);
  IoRequest r{IoOp::kRead, id, 0, in.span()};
  try {
    engine->submit({&r, 1}).wait();
    FAIL() << "injected EIO was not reported";
  } catch (const IoError& e) {
    EXPECT_EQ(e.sys_errno(), EIO);
    EXPECT_EQ(e.code(), ErrorCode::kIo);
    const std::string what = e.what();
    EXPECT_NE(what.find("read failed: " + file.path()), std::string::npos) << what;
    EXPECT_NE(what.find("offset=0 length=" + std::to_string(8 * kBlock)), std::string::npos)
        << what;
    EXPECT_NE(what.find("(EIO)"), std::string::npos) << what;
    EXPECT_NE(what.find("engine=" + std::string(engine->name())), std::string::npos) << what;
    EXPECT_NE(what.find("piece offset="), std::string::npos) << what;
  }
  EXPECT_EQ(plan_->injected_errors(), 1u);
  EXPECT_EQ(engine->stats().failures, 1u);
  // The rule has fired; the same read now succeeds with every byte right.
  EXPECT_EQ(read_and_check(*engine, id, 0, 8 * kBlock, 1), "");
}

TEST_P(IoEngineFault, EnospcOnAWriteIsNoSpace) {
  FaultRule full;
  full.kind = FaultKind::kError;
  full.op = IoOp::kWrite;
  full.err = ENOSPC;
  full.offset_begin = 2 * kBlock;
  auto engine = make({full});
  File file = open_file("enospc.dat");
  const FileId id = engine->attach(file);
  AlignedBuffer out(4 * kBlock);
  fill_pattern(out.span(), id.index, 0, 1);
  IoRequest w{IoOp::kWrite, id, 0, out.span()};
  Status s = engine->submit({&w, 1}).wait_status();
  EXPECT_EQ(s.code(), ErrorCode::kNoSpace) << s.to_string();
  EXPECT_EQ(s.sys_errno(), ENOSPC);
  EXPECT_EQ(s.path(), file.path());
  EXPECT_EQ(s.offset(), 0u);
  EXPECT_EQ(s.length(), 4u * kBlock);
  EXPECT_NE(s.to_string().find("(ENOSPC)"), std::string::npos) << s.to_string();
  // Space "freed": the write is retried by the caller and lands whole.
  engine->submit({&w, 1}).wait();
  EXPECT_EQ(read_and_check(*engine, id, 0, 4 * kBlock, 1), "");
}

TEST_P(IoEngineFault, ShortTransfersAreResubmittedAndDataIsExact) {
  FaultRule shorten;
  shorten.kind = FaultKind::kShort;
  shorten.short_bytes = 4096 + 1536;  // not a multiple of 4096: resumes from an aligned point
  shorten.times = 1000;
  auto engine = make({shorten});
  File file = open_file("short.dat");
  const FileId id = engine->attach(file);
  write_pattern(*engine, id, 0, 6 * kBlock + 4096, 2);
  EXPECT_EQ(read_and_check(*engine, id, 0, 6 * kBlock + 4096, 2), "");
  const IoStats s = engine->stats();
  EXPECT_GT(s.short_resubmits, 0u);
  EXPECT_EQ(s.failures, 0u);
  EXPECT_EQ(s.bytes_written, 6u * kBlock + 4096);
  EXPECT_EQ(s.bytes_read, 6u * kBlock + 4096);
  EXPECT_GT(plan_->injected(), 0u);
}

TEST_P(IoEngineFault, ZeroBytesReportedIsAShortTransferNotSuccess) {
  FaultRule none;
  none.kind = FaultKind::kShort;
  none.short_bytes = 0;
  none.op = IoOp::kWrite;
  auto engine = make({none});
  File file = open_file("zero.dat");
  const FileId id = engine->attach(file);
  AlignedBuffer out(kBlock);
  IoRequest w{IoOp::kWrite, id, 0, out.span()};
  Status s = engine->submit({&w, 1}).wait_status();
  EXPECT_EQ(s.code(), ErrorCode::kShortTransfer) << s.to_string();
  EXPECT_NE(s.to_string().find(file.path()), std::string::npos) << s.to_string();
}

TEST_P(IoEngineFault, EagainStormWithinTheBoundSucceeds) {
  FaultRule storm;
  storm.kind = FaultKind::kEagain;
  storm.count = IoOptions{}.max_eagain_retries;  // exactly the bound
  storm.times = 3;
  auto engine = make({storm});
  File file = open_file("eagain.dat");
  const FileId id = engine->attach(file);
  write_pattern(*engine, id, 0, 3 * kBlock, 3);
  EXPECT_EQ(read_and_check(*engine, id, 0, 3 * kBlock, 3), "");
  EXPECT_GE(engine->stats().retries, 3u * storm.count);
}

TEST_P(IoEngineFault, EagainStormBeyondTheBoundTimesOut) {
  FaultRule storm;
  storm.kind = FaultKind::kEagain;
  storm.count = IoOptions{}.max_eagain_retries + 1;
  auto engine = make({storm});
  File file = open_file("eagain2.dat");
  const FileId id = engine->attach(file);
  AlignedBuffer out(kBlock);
  IoRequest w{IoOp::kWrite, id, 0, out.span()};
  try {
    engine->submit({&w, 1}).wait();
    FAIL() << "an endless EAGAIN storm succeeded";
  } catch (const IoError& e) {
    EXPECT_EQ(e.code(), ErrorCode::kTimedOut);
    EXPECT_EQ(e.sys_errno(), EAGAIN);
    EXPECT_NE(std::string(e.what()).find(file.path()), std::string::npos) << e.what();
  }
  // The engine still serves.
  write_pattern(*engine, id, 0, kBlock, 5);
  EXPECT_EQ(read_and_check(*engine, id, 0, kBlock, 5), "");
}

TEST_P(IoEngineFault, DelaysLoseNoCompletionAndNoByte) {
  FaultRule delay;
  delay.kind = FaultKind::kDelay;
  delay.probability = 0.5;
  delay.delay = std::chrono::microseconds(1500);
  auto engine = make({delay}, /*seed=*/42);
  File file = open_file("delay.dat");
  const FileId id = engine->attach(file);
  constexpr int kRequests = 24;
  constexpr std::size_t kBytes = 2 * kBlock + 8192;
  std::vector<AlignedBuffer> outs, ins;
  std::vector<std::atomic<int>> calls(2 * kRequests);
  std::vector<IoTicket> tickets;
  for (int i = 0; i < kRequests; ++i) {
    outs.emplace_back(kBytes);
    fill_pattern(outs.back().span(), id.index, i * kBytes, 6);
    IoRequest w{IoOp::kWrite, id, i * kBytes, outs.back().span()};
    tickets.push_back(
        engine->submit({&w, 1}, [&calls, i](const Status&) { calls[i].fetch_add(1); }));
  }
  for (auto& t : tickets) t.wait();
  tickets.clear();
  for (int i = 0; i < kRequests; ++i) {
    ins.emplace_back(kBytes);
    IoRequest r{IoOp::kRead, id, i * kBytes, ins.back().span()};
    tickets.push_back(
        engine->submit({&r, 1}, [&calls, i](const Status&) { calls[kRequests + i].fetch_add(1); }));
  }
  for (auto& t : tickets) t.wait();
  for (int i = 0; i < 2 * kRequests; ++i) EXPECT_EQ(calls[i].load(), 1) << "request " << i;
  for (int i = 0; i < kRequests; ++i) {
    EXPECT_EQ(check_pattern(ins[i].span(), id.index, i * kBytes, 6), "") << "request " << i;
  }
  EXPECT_GT(plan_->injected(), 0u) << "seed " << plan_->seed();
}

TEST_P(IoEngineFault, OneFailedRequestLeavesTheRestOfTheBatchWhole) {
  FaultRule eio;
  eio.kind = FaultKind::kError;
  eio.op = IoOp::kWrite;
  eio.offset_begin = 4 * kBlock;
  eio.offset_end = 8 * kBlock;
  eio.times = 100;
  auto engine = make({eio});
  File file = open_file("batch.dat");
  const FileId id = engine->attach(file);
  AlignedBuffer a(4 * kBlock), b(4 * kBlock), c(4 * kBlock);
  fill_pattern(a.span(), id.index, 0, 7);
  fill_pattern(b.span(), id.index, 4 * kBlock, 7);
  fill_pattern(c.span(), id.index, 8 * kBlock, 7);
  IoRequest batch[3] = {{IoOp::kWrite, id, 0, a.span()},
                        {IoOp::kWrite, id, 4 * kBlock, b.span()},
                        {IoOp::kWrite, id, 8 * kBlock, c.span()}};
  IoTicket t = engine->submit(batch);
  Status s = t.wait_status();
  EXPECT_EQ(s.sys_errno(), EIO);
  EXPECT_EQ(s.offset(), 4u * kBlock) << s.to_string();
  EXPECT_EQ(s.length(), 4u * kBlock) << s.to_string();
  EXPECT_EQ(t.bytes_done(), 8u * kBlock);
  EXPECT_EQ(read_and_check(*engine, id, 0, 4 * kBlock, 7), "");
  EXPECT_EQ(read_and_check(*engine, id, 8 * kBlock, 4 * kBlock, 7), "");
}

INSTANTIATE_TEST_SUITE_P(Backends, IoEngineFault, ::testing::ValuesIn(test::all_backends()),
                         test::backend_param_name);

// ---------------------------------------------------------------------------------------------
// Real refusals, each in a child process (gtest's threadsafe death-test style re-executes the
// binary, so the child starts single-threaded). The child reports through its exit code and,
// on failure, one line on stderr that the parent shows.

IoOptions options_for(IoEngineKind kind) {
  IoOptions o;
  o.kind = kind;
  o.block_size = kBlock;
  return o;
}

struct LogLines {
  std::mutex mu;
  std::vector<std::string> lines;
};

[[noreturn]] void child_fail(const std::string& why) {
  std::fprintf(stderr, "child check failed: %s\n", why.c_str());
  std::fflush(stderr);
  ::_exit(1);
}

#if defined(__x86_64__)
constexpr std::uint32_t kAuditArch = AUDIT_ARCH_X86_64;
#elif defined(__aarch64__)
constexpr std::uint32_t kAuditArch = AUDIT_ARCH_AARCH64;
#else
constexpr std::uint32_t kAuditArch = 0;
#endif

// Refuses io_uring_setup with EPERM the way a container's seccomp profile does.
void refuse_io_uring_setup() {
  sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, kAuditArch, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  sock_fprog prog{static_cast<unsigned short>(sizeof filter / sizeof filter[0]), filter};
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) child_fail("PR_SET_NO_NEW_PRIVS");
  if (::syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) != 0) child_fail("seccomp");
}

void auto_fallback_child() {
  refuse_io_uring_setup();
  LogLines logs;
  set_log_sink([&logs](LogLevel level, std::string_view line) {
    std::lock_guard lock(logs.mu);
    logs.lines.push_back(std::string(level == LogLevel::kNotice ? "notice: " : "other: ") +
                         std::string(line));
  });
  if (io_uring_unavailable_reason() != "io_uring_setup: EPERM") {
    child_fail("reason is '" + io_uring_unavailable_reason() + "'");
  }
  auto engine = make_io_engine(options_for(IoEngineKind::kAuto));
  if (engine->name() != "threads") child_fail("auto built " + std::string(engine->name()));
  {
    std::lock_guard lock(logs.mu);
    if (logs.lines.size() != 1) child_fail(std::to_string(logs.lines.size()) + " log lines");
    if (logs.lines[0] != "notice: io_uring unavailable (io_uring_setup: EPERM); using threads") {
      child_fail("notice was '" + logs.lines[0] + "'");
    }
  }
  try {
    make_io_engine(options_for(IoEngineKind::kUring));
    child_fail("kUring started under a filter refusing io_uring_setup");
  } catch (const IoError& e) {
    if (e.sys_errno() != EPERM) child_fail(std::string("errno in ") + e.what());
    if (std::string(e.what()).find("EPERM") == std::string::npos) child_fail(e.what());
  }
  // The fallback engine works. In a scope of its own: _exit runs no destructor, and the
  // folder must go before it.
  {
    test::TestDir dir;
    File file = File::open(dir.file("fallback.dat"), FileOptions{.create = true});
    const FileId id = engine->attach(file);
    AlignedBuffer out(kBlock), in(kBlock);
    fill_pattern(out.span(), id.index, 0, 1);
    IoRequest w{IoOp::kWrite, id, 0, out.span()};
    engine->submit({&w, 1}).wait();
    IoRequest r{IoOp::kRead, id, 0, in.span()};
    engine->submit({&r, 1}).wait();
    if (std::string e = check_pattern(in.span(), id.index, 0, 1); !e.empty()) child_fail(e);
  }
  set_log_sink({});
  ::_exit(0);
}

TEST(IoEngineFallback, AutoUsesThreadsWithOneNoticeWhenSeccompRefusesIoUring) {
  if (kAuditArch == 0) GTEST_SKIP() << "no seccomp arch constant for this CPU";
  if (std::string why = io_uring_unavailable_reason(); !why.empty()) {
    GTEST_SKIP() << "io_uring already unavailable here (" << why << "): nothing to refuse";
  }
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(auto_fallback_child(), ::testing::ExitedWithCode(0), "");
}

// Drops CAP_IPC_LOCK (root bypasses the memlock limit with it) and sets an 8 MiB limit, as an
// unprivileged process has here (measured with fio on the build machines).
void drop_ipc_lock_with_small_memlock() {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2]{};
  if (::syscall(SYS_capget, &header, data) != 0) child_fail("capget");
  data[CAP_IPC_LOCK / 32].effective &= ~(1u << (CAP_IPC_LOCK % 32));
  data[CAP_IPC_LOCK / 32].permitted &= ~(1u << (CAP_IPC_LOCK % 32));
  if (::syscall(SYS_capset, &header, data) != 0) child_fail("capset");
  rlimit rl{8u << 20, 8u << 20};
  if (::setrlimit(RLIMIT_MEMLOCK, &rl) != 0) child_fail("setrlimit");
}

void refused_registration_child() {
  drop_ipc_lock_with_small_memlock();
  LogLines logs;
  set_log_sink([&logs](LogLevel, std::string_view line) {
    std::lock_guard lock(logs.mu);
    logs.lines.emplace_back(line);
  });
  auto engine = make_io_engine(options_for(IoEngineKind::kUring));
  AlignedBuffer arena(32u << 20);
  const std::span<std::byte> regions[] = {arena.span()};
  if (engine->register_buffers(regions)) child_fail("32 MiB registered under an 8 MiB limit");
  {
    std::lock_guard lock(logs.mu);
    if (logs.lines.size() != 1) child_fail(std::to_string(logs.lines.size()) + " log lines");
    if (logs.lines[0].find("ENOMEM") == std::string::npos) child_fail(logs.lines[0]);
  }
  {  // a scope of its own, so that the folder goes before _exit (which runs no destructor)
    test::TestDir dir;
    File file = File::open(dir.file("unregistered.dat"), FileOptions{.create = true});
    const FileId id = engine->attach(file);
    auto out = arena.span().first(2 * kBlock);
    auto in = arena.span().subspan(4 * kBlock, 2 * kBlock);
    fill_pattern(out, id.index, 0, 1);
    IoRequest w{IoOp::kWrite, id, 0, out};
    engine->submit({&w, 1}).wait();
    IoRequest r{IoOp::kRead, id, 0, in};
    engine->submit({&r, 1}).wait();
    if (std::string e = check_pattern(in, id.index, 0, 1); !e.empty()) child_fail(e);
  }
  set_log_sink({});
  ::_exit(0);
}

TEST(IoEngineFallback, RefusedBufferRegistrationLogsOnceAndIoGoesOn) {
  if (std::string why = io_uring_unavailable_reason(); !why.empty()) {
    GTEST_SKIP() << "io_uring unavailable: " << why;
  }
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(refused_registration_child(), ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace zinf::swap
