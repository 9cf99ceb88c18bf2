// SPDX-License-Identifier: Apache-2.0
// DirectFileWriter / DirectFileReader: every byte round-trips for sizes around the block and
// buffer boundaries (the padded tail is cut off again), reads at any offset, the buffered
// fallback where O_DIRECT is refused (tmpfs), and the errors a user sees: a path that cannot
// be created, and a failed write (ENOSPC) naming the file, offset and length.
#include <sys/stat.h>
#include <sys/vfs.h>

#include <cerrno>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "support/pattern.h"
#include "support/private_tmpfs.h"
#include "support/test_dir.h"
#include "zinf/common/error.h"
#include "zinf/swap/direct_file.h"
#include "zinf/swap/fault_injection.h"

namespace zinf::swap {
namespace {

constexpr std::uint64_t kBuffer = 16384;  // small, so that tests cross buffers often

// Bytes that differ at every offset (support/pattern.h), so a misplaced block shows.
std::vector<std::byte> pattern(std::uint64_t n, std::uint32_t seed) {
  std::vector<std::byte> v(n);
  test::fill_pattern(v, seed, 0, 1);
  return v;
}

std::vector<std::byte> read_whole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  const std::string t = s.str();
  const auto* p = reinterpret_cast<const std::byte*>(t.data());
  return {p, p + t.size()};
}

// Writes `data` in pieces of 1, 7, 4096, 10000, ... bytes (the shapes a pickler hands over).
void write_in_pieces(DirectFileWriter& w, const std::vector<std::byte>& data) {
  const std::uint64_t sizes[] = {1, 7, 4096, 10000, 3, 65536, 511};
  std::uint64_t at = 0;
  for (std::size_t i = 0; at < data.size(); ++i) {
    const std::uint64_t n = std::min<std::uint64_t>(sizes[i % 7], data.size() - at);
    w.write(std::span(data).subspan(at, n));
    at += n;
  }
}

class DirectFile : public ::testing::TestWithParam<std::uint64_t> {
 protected:
  test::TestDir dir_;
};

TEST_P(DirectFile, EveryByteRoundTripsAndTheFileIsExactlyTheBytesWritten) {
  const std::uint64_t n = GetParam();
  const std::string path = dir_.file("f.pt");
  const auto data = pattern(n, static_cast<std::uint32_t>(n));
  {
    DirectFileWriter w(path, DirectFileOptions{.buffer_bytes = kBuffer});
    write_in_pieces(w, data);
    w.flush();
    EXPECT_EQ(w.size(), n);
    w.close();
    EXPECT_TRUE(w.closed());
  }
  EXPECT_EQ(read_whole(path), data);

  DirectFileReader r(path, DirectFileOptions{.buffer_bytes = kBuffer});
  ASSERT_EQ(r.size(), n);
  // Whole, then from odd offsets in odd lengths, then past the end.
  std::vector<std::byte> back(n);
  EXPECT_EQ(r.read_at(0, back), n);
  EXPECT_EQ(back, data);
  for (std::uint64_t off = 0; off < n; off += 5003) {
    std::vector<std::byte> part(std::min<std::uint64_t>(9001, n - off));
    ASSERT_EQ(r.read_at(off, part), part.size());
    EXPECT_TRUE(std::equal(part.begin(), part.end(), data.begin() + static_cast<long>(off)))
        << "at " << off;
  }
  std::vector<std::byte> past(10);
  EXPECT_EQ(r.read_at(n, past), 0u);
}

INSTANTIATE_TEST_SUITE_P(Sizes, DirectFile,
                         ::testing::Values(0, 1, 4095, 4096, 4097, kBuffer - 1, kBuffer,
                                           kBuffer + 1, 3 * kBuffer + 12345),
                         [](const auto& p) { return std::to_string(p.param); });

// tmpfs refused O_DIRECT before Linux 6.6: where it does, the writer and reader go buffered
// (one notice) with the same bytes; where it does not, they stay direct. Either way is_direct()
// says which, and the bytes are the same.
TEST(DirectFileFallback, TmpfsGivesTheSameBytesDirectOrBuffered) {
  struct statfs fs {};
  if (::statfs("/dev/shm", &fs) != 0 || fs.f_type != 0x01021994 /* TMPFS_MAGIC */) {
    GTEST_SKIP() << "no tmpfs at /dev/shm";
  }
  char tmpl[] = "/dev/shm/zinf-direct-file-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string path = std::string(tmpl) + "/f.pt";
  const auto data = pattern(kBuffer + 100, 9);
  const bool direct = test::supports_direct_io(tmpl);
  {
    DirectFileWriter w(path, DirectFileOptions{.buffer_bytes = kBuffer});
    EXPECT_EQ(w.is_direct(), direct);
    write_in_pieces(w, data);
    w.close();
  }
  EXPECT_EQ(read_whole(path), data);
  DirectFileReader r(path);
  EXPECT_EQ(r.is_direct(), direct);
  std::vector<std::byte> back(data.size());
  EXPECT_EQ(r.read_at(0, back), data.size());
  EXPECT_EQ(back, data);
  ::unlink(path.c_str());
  ::rmdir(tmpl);
}

TEST(DirectFileErrors, APathThatCannotBeCreatedNamesItAndKeepsErrno) {
  test::TestDir dir;
  const std::string path = dir.file("missing/f.pt");
  try {
    DirectFileWriter w(path);
    FAIL() << "no IoError";
  } catch (const IoError& e) {
    EXPECT_EQ(e.status().sys_errno(), ENOENT) << e.what();
    EXPECT_EQ(e.status().path(), path);
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  try {
    DirectFileReader r(path);
    FAIL() << "no IoError";
  } catch (const IoError& e) {
    EXPECT_EQ(e.status().sys_errno(), ENOENT) << e.what();
    EXPECT_EQ(e.status().path(), path);
  }
}

// A drive that fills up: the write of the second buffer fails with ENOSPC. The error reaches
// the caller at the next call that waits for that write (here close()), as IoError kNoSpace
// naming the file, the offset and the length of the failed write; the writer then refuses.
TEST(DirectFileErrors, AFailedWriteNamesFileOffsetAndLengthAndFailsTheWriter) {
  test::TestDir dir;
  const std::string path = dir.file("f.pt");
  FaultRule rule;
  rule.kind = FaultKind::kError;
  rule.op = IoOp::kWrite;
  rule.offset_begin = kBuffer;
  rule.offset_end = kBuffer + 1;
  rule.err = ENOSPC;
  auto plan = std::make_shared<FaultPlan>(std::vector<FaultRule>{rule}, 1);
  DirectFileWriter w(path, DirectFileOptions{.buffer_bytes = kBuffer, .faults = plan});
  const auto data = pattern(2 * kBuffer + 10, 3);
  w.write(data);  // buffers 0 and 1 submitted; the tail staged
  try {
    w.close();
    FAIL() << "no IoError";
  } catch (const IoError& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNoSpace) << e.what();
    EXPECT_EQ(e.status().sys_errno(), ENOSPC);
    EXPECT_EQ(e.status().path(), path);
    EXPECT_EQ(e.status().offset(), kBuffer) << e.what();
    EXPECT_EQ(e.status().length(), kBuffer) << e.what();
  }
  EXPECT_EQ(plan->injected_errors(), 1u);
  EXPECT_THROW(w.write(data), IoError);
  EXPECT_THROW(w.close(), IoError);
}

// The writer allocates 64 MiB ahead of its writes (a speed-up for ext4), but a save smaller
// than that must not fail on a drive with room for it: an 8 MiB file on a 40 MiB tmpfs is
// written whole, and only a file that does not fit (48 MiB) fails, with ENOSPC naming the file
// and a range inside what was being written.
TEST(DirectFileErrors, TheAllocationAheadNeverFailsASaveThatFits) {
  test::TestDir dir;
  const std::string mnt = dir.subdir("small");
  ZINF_EXPECT_IN_PRIVATE_TMPFS(mnt, "40m", [&] {
    const std::string path = mnt + "/ck.pt";
    const auto data = pattern((std::uint64_t{8} << 20) + 10, 5);
    {
      DirectFileWriter w(path);
      w.write(data);
      w.close();
    }
    if (read_whole(path) != data) return 1;
    const auto big = pattern(std::uint64_t{48} << 20, 6);
    try {
      DirectFileWriter w(path);
      w.write(big);
      w.close();
      return 2;
    } catch (const IoError& e) {
      if (e.code() != ErrorCode::kNoSpace || e.sys_errno() != ENOSPC) return 3;
      if (e.status().path() != path) return 4;
      // The failed range lies within the 48 MiB being written.
      if (e.status().offset() + e.status().length() > big.size()) return 5;
    }
    return 0;
  });
}

}  // namespace
}  // namespace zinf::swap
