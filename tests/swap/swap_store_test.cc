// SPDX-License-Identifier: Apache-2.0
// SwapStore against every IoEngine backend: odd-size round trips compared byte for byte, the
// striped layout read back from the files themselves, ranges and their rules, many tensors at
// once, checksums catching a corruption planted in a file, the free-space check at creation,
// capacity exhaustion and fragmentation, precondition, the buffered fallback, same-key rules,
// and the files' safety: they have no name, so nothing planted at a name is touched, no name
// collides, and nothing is left in the directories, not even by a killed process.
#include "zinf/swap/swap_store.h"

#include <fcntl.h>
#include <signal.h>
#include <linux/fiemap.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "io_test_util.h"
#include "support/pattern.h"
#include "support/child_process.h"
#include "support/private_tmpfs.h"
#include "support/test_dir.h"
#include "zinf/common/error.h"
#include "zinf/swap/crc32c.h"
#include "zinf/swap/io_engine.h"

namespace zinf::swap {
namespace {

using test::AlignedBuffer;
using test::check_pattern;
using test::fill_pattern;

constexpr std::uint32_t kStripe = 64 << 10;

// A path that reaches swap file `i` of `store` from this process, for reading or damaging it
// behind the store's back: the files have no name on disk, only a descriptor.
std::string fd_path(const SwapStore& store, std::size_t i) {
  return "/proc/self/fd/" + std::to_string(store.file_descriptor(i));
}

// The names in directory `dir`, sorted.
std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    out.push_back(e.path().filename().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Reads `length` bytes at `offset` of `path` with plain pread (not through zinf).
std::vector<std::byte> read_file(const std::string& path, std::uint64_t offset,
                                 std::size_t length) {
  std::vector<std::byte> out(length);
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  EXPECT_GE(fd, 0) << path << ": " << std::strerror(errno);
  if (fd < 0) return out;
  EXPECT_EQ(::pread(fd, out.data(), length, static_cast<off_t>(offset)),
            static_cast<ssize_t>(length));
  ::close(fd);
  return out;
}

// Bytes of `path` in unwritten (allocated, never written) extents, or nothing if the file
// system has no FIEMAP.
std::optional<std::uint64_t> unwritten_bytes(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  constexpr std::size_t kExtents = 256;
  std::vector<char> storage(sizeof(fiemap) + kExtents * sizeof(fiemap_extent));
  auto* fm = reinterpret_cast<fiemap*>(storage.data());
  std::uint64_t unwritten = 0;
  std::uint64_t start = 0;
  for (;;) {
    std::memset(storage.data(), 0, storage.size());
    fm->fm_start = start;
    fm->fm_length = ~0ull - start;
    fm->fm_flags = FIEMAP_FLAG_SYNC;
    fm->fm_extent_count = kExtents;
    if (::ioctl(fd, FS_IOC_FIEMAP, fm) != 0) {
      ::close(fd);
      return std::nullopt;
    }
    if (fm->fm_mapped_extents == 0) break;
    bool last = false;
    for (std::uint32_t i = 0; i < fm->fm_mapped_extents; ++i) {
      const fiemap_extent& e = fm->fm_extents[i];
      if ((e.fe_flags & FIEMAP_EXTENT_UNWRITTEN) != 0) unwritten += e.fe_length;
      start = e.fe_logical + e.fe_length;
      if ((e.fe_flags & FIEMAP_EXTENT_LAST) != 0) last = true;
    }
    if (last) break;
  }
  ::close(fd);
  return unwritten;
}

class SwapStoreTest : public test::BackendTest {
 protected:
  void SetUp() override {
    test::BackendTest::SetUp();
    if (IsSkipped()) return;
    IoOptions o;
    o.kind = GetParam();
    o.block_size = kStripe;
    o.queue_depth = 8;
    engine_ = make_io_engine(o);
  }

  std::vector<std::string> dirs(int n) {
    std::vector<std::string> out;
    for (int i = 0; i < n; ++i) out.push_back(dir_.subdir("d" + std::to_string(i)));
    return out;
  }

  SwapStoreOptions options(int n_dirs, std::uint64_t capacity, bool checksums = false) {
    SwapStoreOptions o;
    o.directories = dirs(n_dirs);
    o.capacity_bytes = capacity;
    o.stripe_bytes = kStripe;
    o.checksums = checksums;
    return o;
  }

  // Swaps `key` out from a buffer of `gen`'s pattern (the padding too) and back into a buffer
  // pre-filled with 0xEE; returns "" if every padded byte came back.
  static std::string round_trip(SwapStore& store, const std::string& key, std::uint32_t id,
                                std::uint32_t gen) {
    const std::uint64_t padded = store.padded_size(store.size_of(key));
    AlignedBuffer out(padded);
    fill_pattern(out.span(), id, 0, gen);
    store.swap_out(key, out.span()).wait();
    AlignedBuffer in(padded);
    std::memset(in.data(), 0xEE, padded);
    store.swap_in(key, in.span()).wait();
    return check_pattern(in.span(), id, 0, gen);
  }

  test::TestDir dir_;
  std::unique_ptr<IoEngine> engine_;
};

TEST_P(SwapStoreTest, RoundTripsOddSizes) {
  for (bool checksums : {false, true}) {
    SwapStore store(options(1, 8 << 20, checksums), *engine_);
    EXPECT_EQ(store.alignment() % 4096, 0u);
    const std::uint64_t sizes[] = {1, 4095, 4097, (3u << 20) + 5};
    for (std::uint32_t i = 0; i < 4; ++i) {
      SCOPED_TRACE("size " + std::to_string(sizes[i]) + " checksums " + std::to_string(checksums));
      const std::string key = "t" + std::to_string(i);
      store.allocate(key, sizes[i]);
      EXPECT_EQ(store.size_of(key), sizes[i]);
      EXPECT_EQ(store.padded_size(sizes[i]),
                (sizes[i] + store.alignment() - 1) / store.alignment() * store.alignment());
      EXPECT_EQ(round_trip(store, key, i, 1), "");
      EXPECT_EQ(round_trip(store, key, i, 2), "") << "second generation overwrites the first";
    }
    SwapStoreStats st = store.stats();
    EXPECT_EQ(st.swaps_out, 8u);
    EXPECT_EQ(st.swaps_in, 8u);
    EXPECT_EQ(st.failures, 0u);
  }
}

// The layout contract of swap_store.h, checked in the files themselves: with three files, the
// tensor's stripe unit k is at file k % 3, offset (k / 3) * stripe.
TEST_P(SwapStoreTest, StripesAcrossDirectories) {
  SwapStoreOptions o = options(3, 3 << 20);
  SwapStore store(o, *engine_);
  ASSERT_EQ(store.file_paths().size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(std::filesystem::path(store.file_paths()[i]).parent_path(), o.directories[i]);
    EXPECT_TRUE(store.file_paths()[i].ends_with(" (unlinked)")) << store.file_paths()[i];
    EXPECT_EQ(std::filesystem::file_size(fd_path(store, i)), store.file_bytes());
  }
  EXPECT_EQ(store.file_bytes(), 1u << 20);
  EXPECT_EQ(store.capacity_bytes(), 3u << 20);

  const std::uint64_t bytes = 7 * kStripe + 5;  // 8 units, the last one padded
  store.allocate("w", bytes);
  const std::uint64_t padded = store.padded_size(bytes);
  AlignedBuffer out(padded);
  fill_pattern(out.span(), 9, 0, 1);
  store.swap_out("w", out.span()).wait();

  std::uint64_t share[3] = {0, 0, 0};
  for (std::uint64_t unit = 0; unit * kStripe < padded; ++unit) {
    const std::uint64_t len = std::min<std::uint64_t>(kStripe, padded - unit * kStripe);
    const std::size_t file = unit % 3;
    auto got = read_file(fd_path(store, file), unit / 3 * kStripe, len);
    EXPECT_EQ(check_pattern(got, 9, unit * kStripe, 1), "")
        << "unit " << unit << " in file " << file;
    share[file] += len;
  }
  EXPECT_EQ(share[0], 3 * kStripe);         // units 0, 3, 6
  EXPECT_EQ(share[1], 2 * kStripe + 4096);  // units 1, 4, 7 (7 is the 5-byte tail, padded)
  EXPECT_EQ(share[2], 2 * kStripe);         // units 2, 5
  AlignedBuffer in(padded);
  store.swap_in("w", in.span()).wait();
  EXPECT_EQ(check_pattern(in.span(), 9, 0, 1), "");
}

// locate(): the pieces it gives hold the tensor's bytes in the files, in tensor order and
// aligned, with the unit CRCs of the last swap_out; refused for a key not written whole.
TEST_P(SwapStoreTest, LocateGivesWhereTheBytesAreAndTheirUnitSums) {
  SwapStore store(options(3, 3 << 20, /*checksums=*/true), *engine_);
  const std::uint64_t bytes = 7 * kStripe + 5;
  store.allocate("w", bytes);
  EXPECT_THROW((void)store.locate("w"), UsageError);  // nothing written yet
  EXPECT_THROW((void)store.locate("nope"), UsageError);
  const std::uint64_t padded = store.padded_size(bytes);
  AlignedBuffer out(padded);
  fill_pattern(out.span(), 4, 0, 1);
  store.swap_out("w", out.span()).wait();

  const StoredTensor t = store.locate("w");
  EXPECT_EQ(t.padded, padded);
  std::uint64_t next = 0;
  for (const StoredPiece& p : t.pieces) {
    EXPECT_EQ(p.tensor_offset, next);
    EXPECT_EQ(p.file_offset % store.alignment(), 0u);
    EXPECT_EQ(p.length % store.alignment(), 0u);
    auto got = read_file(fd_path(store, p.file), p.file_offset, p.length);
    EXPECT_EQ(check_pattern(got, 4, p.tensor_offset, 1), "") << "piece at " << p.tensor_offset;
    next += p.length;
  }
  EXPECT_EQ(next, padded);
  ASSERT_EQ(t.unit_sums.size(), store.unit_count("w"));
  for (std::uint64_t u = 0; u < t.unit_sums.size(); ++u) {
    const std::uint64_t len = std::min<std::uint64_t>(kStripe, padded - u * kStripe);
    EXPECT_EQ(t.unit_sums[u], crc32c(std::span<const std::byte>(out.data() + u * kStripe, len)))
        << "unit " << u;
  }
  // Without checksums: the pieces, and no sums.
  SwapStore plain(options(1, 1 << 20), *engine_);
  plain.allocate("x", 4096);
  AlignedBuffer small(4096);
  plain.swap_out("x", small.span()).wait();
  EXPECT_TRUE(plain.locate("x").unit_sums.empty());
  EXPECT_EQ(plain.locate("x").pieces.size(), 1u);
}

TEST_P(SwapStoreTest, RangesFollowTheirRules) {
  for (bool checksums : {false, true}) {
    SCOPED_TRACE(checksums ? "checksums" : "no checksums");
    SwapStore store(options(2, 4 << 20, checksums), *engine_);
    const std::uint64_t bytes = 16 * kStripe + 100;
    const std::uint64_t padded = store.padded_size(bytes);
    store.allocate("r", bytes);
    AlignedBuffer whole(padded);
    fill_pattern(whole.span(), 1, 0, 1);
    store.swap_out("r", whole.span()).wait();

    // Read a middle range.
    AlignedBuffer mid(2 * kStripe);
    store.swap_in_range("r", kStripe, 2 * kStripe, mid.span()).wait();
    EXPECT_EQ(check_pattern(mid.span(), 1, kStripe, 1), "");

    // Overwrite [4, 6) stripes with generation 2, and the tail (padded) with generation 3.
    AlignedBuffer part(2 * kStripe);
    fill_pattern(part.span(), 1, 4 * kStripe, 2);
    store.swap_out_range("r", 4 * kStripe, 2 * kStripe, part.span()).wait();
    AlignedBuffer tail(store.padded_size(100));
    fill_pattern(tail.span(), 1, 16 * kStripe, 3);
    store.swap_out_range("r", 16 * kStripe, 100, tail.span()).wait();

    AlignedBuffer in(padded);
    store.swap_in("r", in.span()).wait();
    auto s = in.span();
    EXPECT_EQ(check_pattern(s.first(4 * kStripe), 1, 0, 1), "");
    EXPECT_EQ(check_pattern(s.subspan(4 * kStripe, 2 * kStripe), 1, 4 * kStripe, 2), "");
    EXPECT_EQ(check_pattern(s.subspan(6 * kStripe, 10 * kStripe), 1, 6 * kStripe, 1), "");
    EXPECT_EQ(check_pattern(s.subspan(16 * kStripe), 1, 16 * kStripe, 3), "");

    // The rules.
    AlignedBuffer big(padded + 8192);
    auto bad = [&](std::uint64_t off, std::uint64_t len, std::span<std::byte> buf) {
      EXPECT_THROW(store.swap_in_range("r", off, len, buf), UsageError) << off << "+" << len;
    };
    bad(100, 4096, big.span());                      // offset not aligned
    bad(0, 0, big.span());                           // empty
    bad(kStripe, bytes, big.span());                 // past the end
    bad(0, 4096 + 1, big.span());                    // length not aligned, not the tail
    bad(0, kStripe, big.span().subspan(512));        // buffer not aligned
    bad(0, 2 * kStripe, big.span().first(kStripe));  // buffer too short
    EXPECT_THROW(store.swap_in("r", big.span().first(padded - 4096)), UsageError);
    if (checksums) {
      bad(4096, kStripe - 4096, big.span());  // not whole stripe units
      bad(0, kStripe + 4096, big.span());
    } else {
      AlignedBuffer page(4096);
      store.swap_in_range("r", 4096, 4096, page.span()).wait();
      EXPECT_EQ(check_pattern(page.span(), 1, 4096, 1), "");
    }
  }
}

TEST_P(SwapStoreTest, ManyConcurrentTensors) {
  SwapStore store(options(3, 16 << 20, /*checksums=*/true), *engine_);
  constexpr std::uint32_t kTensors = 24;
  std::vector<std::unique_ptr<AlignedBuffer>> out;
  std::vector<std::unique_ptr<AlignedBuffer>> in;
  for (std::uint32_t i = 0; i < kTensors; ++i) {
    const std::uint64_t bytes = 1 + (i * 97531ull) % (600 << 10);
    store.allocate("k" + std::to_string(i), bytes);
    out.push_back(std::make_unique<AlignedBuffer>(store.padded_size(bytes)));
    in.push_back(std::make_unique<AlignedBuffer>(store.padded_size(bytes)));
    fill_pattern(out.back()->span(), i, 0, 4);
  }
  // Four threads each swap a quarter out, then in, all tickets in flight at once.
  std::atomic<int> failures{0};
  auto run = [&](bool write) {
    std::vector<std::thread> threads;
    for (std::uint32_t t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        std::vector<IoTicket> tickets;
        for (std::uint32_t i = t; i < kTensors; i += 4) {
          const std::string key = "k" + std::to_string(i);
          tickets.push_back(write ? store.swap_out(key, out[i]->span())
                                  : store.swap_in(key, in[i]->span()));
        }
        for (auto& tk : tickets) {
          if (!tk.wait_status().ok()) ++failures;
        }
      });
    }
    for (auto& th : threads) th.join();
  };
  run(true);
  run(false);
  EXPECT_EQ(failures.load(), 0);
  for (std::uint32_t i = 0; i < kTensors; ++i) {
    EXPECT_EQ(check_pattern(in[i]->span(), i, 0, 4), "") << "tensor " << i;
  }
  EXPECT_EQ(store.stats().swaps_in, kTensors);
}

// Verified on the engine's completion thread (verify_threads 0) and on the store's own.
TEST_P(SwapStoreTest, ChecksumsCatchCorruptionPlantedInAFile) {
  for (std::uint32_t verify_threads : {0u, 2u}) {
    SCOPED_TRACE("verify_threads " + std::to_string(verify_threads));
    SwapStoreOptions o = options(3, 3 << 20, /*checksums=*/true);
    o.verify_threads = verify_threads;
    SwapStore store(o, *engine_);
    const std::uint64_t bytes = 4 * kStripe;
    store.allocate("w", bytes);
    AlignedBuffer out(bytes);
    fill_pattern(out.span(), 5, 0, 1);
    store.swap_out("w", out.span()).wait();

    // Unit 1 lives at offset 0 of file 1. Flip 8 bytes in its middle, behind zinf's back.
    const std::string& victim = store.file_paths()[1];
    {
      int fd = ::open(fd_path(store, 1).c_str(), O_WRONLY | O_CLOEXEC);
      ASSERT_GE(fd, 0);
      const char garbage[8] = {'g', 'a', 'r', 'b', 'a', 'g', 'e', '!'};
      ASSERT_EQ(::pwrite(fd, garbage, 8, 1000), 8);
      ASSERT_EQ(::fsync(fd), 0);
      ::close(fd);
    }
    std::vector<std::byte> corrupted(out.data() + kStripe, out.data() + 2 * kStripe);
    std::memcpy(corrupted.data() + 1000, "garbage!", 8);
    char expected_crcs[64];
    std::snprintf(expected_crcs, sizeof expected_crcs, "crc32c written 0x%08x, read 0x%08x",
                  crc32c(out.span().subspan(kStripe, kStripe)), crc32c(corrupted));

    AlignedBuffer in(bytes);
    try {
      store.swap_in("w", in.span()).wait();
      FAIL() << "corruption not detected";
    } catch (const IoError& e) {
      EXPECT_EQ(e.code(), ErrorCode::kCorrupt);
      EXPECT_EQ(std::string(e.what()),
                "swap_in of key 'w' failed: " + victim +
                    " offset=0 length=65536: checksum mismatch "
                    "in stripe unit 1 (tensor offset 65536 length 65536, stored at " +
                    victim + " offset=0 length=65536): " + expected_crcs);
    }
    EXPECT_EQ(store.stats().checksum_failures, 1u);
    EXPECT_EQ(store.stats().failures, 1u);

    // Units the garbage did not touch still read and verify; a range over unit 1 still fails.
    AlignedBuffer unit0(kStripe);
    store.swap_in_range("w", 0, kStripe, unit0.span()).wait();
    EXPECT_EQ(check_pattern(unit0.span(), 5, 0, 1), "");
    EXPECT_THROW(store.swap_in_range("w", kStripe, kStripe, unit0.span()).wait(), IoError);

    // Rewriting the tensor heals it.
    store.swap_out("w", out.span()).wait();
    store.swap_in("w", in.span()).wait();
    EXPECT_EQ(check_pattern(in.span(), 5, 0, 1), "");
  }
}

// Caller-side checksums: swap_in_unchecked hands the stored unit CRCs over with the bytes,
// swap_out_summed stores the caller's, and checksum_error() is the store's own corruption
// error, so a caller that folds the sums into its own pass loses nothing of the store's
// guarantees. A wrong caller sum is never silent: the next verified swap_in refuses the unit.
TEST_P(SwapStoreTest, CallerSideChecksumsKeepTheStoresGuarantees) {
  SwapStoreOptions o = options(3, 3 << 20, /*checksums=*/true);
  SwapStore store(o, *engine_);
  const std::uint64_t bytes = 4 * kStripe + 4096;  // a short last unit
  store.allocate("w", bytes);
  ASSERT_EQ(store.unit_count("w"), 5u);
  AlignedBuffer out(bytes);
  fill_pattern(out.span(), 9, 0, 1);
  std::vector<std::uint32_t> sums;
  for (std::uint64_t at = 0; at < bytes; at += kStripe) {
    sums.push_back(crc32c(out.span().subspan(at, std::min<std::uint64_t>(kStripe, bytes - at))));
  }
  store.swap_out_summed("w", out.span(), sums).wait();

  // Read back both ways: verified by the store, and unchecked with the sums handed over.
  AlignedBuffer in(bytes);
  store.swap_in("w", in.span()).wait();
  EXPECT_EQ(check_pattern(in.span(), 9, 0, 1), "");
  std::vector<std::uint32_t> expected(5);
  AlignedBuffer raw(bytes);
  store.swap_in_unchecked("w", raw.span(), expected).wait();
  EXPECT_EQ(expected, sums);
  EXPECT_EQ(check_pattern(raw.span(), 9, 0, 1), "");

  // A byte changed in the file: swap_in_unchecked completes, the caller's sum differs, and
  // checksum_error() gives exactly swap_in's own error.
  {
    int fd = ::open(fd_path(store, 1).c_str(), O_WRONLY | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::pwrite(fd, "!", 1, 77), 1);
    ::close(fd);
  }
  std::string store_text;
  try {
    store.swap_in("w", in.span()).wait();
    FAIL() << "corruption not detected";
  } catch (const IoError& e) {
    store_text = e.what();
  }
  store.swap_in_unchecked("w", raw.span(), expected).wait();
  const std::uint32_t found = crc32c(raw.span().subspan(kStripe, kStripe));
  ASSERT_NE(found, expected[1]);
  const Status err = store.checksum_error("w", 1, expected[1], found);
  EXPECT_EQ(err.code(), ErrorCode::kCorrupt);
  EXPECT_EQ(IoError(err).what(), store_text);
  EXPECT_EQ(store.stats().checksum_failures, 2u);

  // A wrong caller sum is stored as given and read back as corruption.
  sums[3] ^= 1;
  store.swap_out_summed("w", out.span(), sums).wait();
  EXPECT_THROW(store.swap_in("w", in.span()).wait(), IoError);

  // Misuse: wrong span sizes, unknown units, a store without checksums.
  std::vector<std::uint32_t> four(4);
  EXPECT_THROW((void)store.swap_in_unchecked("w", raw.span(), four), UsageError);
  EXPECT_THROW((void)store.swap_out_summed("w", out.span(), four), UsageError);
  EXPECT_THROW((void)store.checksum_error("w", 5, 0, 0), UsageError);
  SwapStoreOptions plain = options(1, 1 << 20, /*checksums=*/false);
  plain.directories = {dir_.subdir("plain")};
  SwapStore unsummed(plain, *engine_);
  unsummed.allocate("x", kStripe);
  std::vector<std::uint32_t> one(1);
  EXPECT_THROW((void)unsummed.swap_in_unchecked("x", raw.span(), one), UsageError);
}

// A restart right after a killed run: the dead run's files give their space back some
// milliseconds after it was reaped. The new store waits briefly for it instead of refusing.
// In a child with a private 16 MiB tmpfs: 12 MiB are held by a file closed 100 ms into the
// creation of an 8 MiB store, which must then succeed; a 32 MiB store still fails, naming the
// wait.
TEST(SwapStoreSpace, CreationWaitsBrieflyForSpaceAProcessThatJustEndedHeld) {
  test::TestDir dir;
  const std::string mnt = dir.subdir("small");
  ZINF_EXPECT_IN_PRIVATE_TMPFS(mnt, "16m", [&] {
    const std::string filler = mnt + "/dead-run";
    const int fd = ::open(filler.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0 || ::fallocate(fd, 0, 0, 12 << 20) != 0) return 7;
    ::unlink(filler.c_str());  // held by the descriptor alone, as an unnamed swap file
    std::thread dies([fd] {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      ::close(fd);
    });
    IoOptions io;
    io.kind = IoEngineKind::kThreads;
    auto engine = make_io_engine(io);
    SwapStoreOptions o;
    o.directories = {mnt};
    o.stripe_bytes = kStripe;
    o.capacity_bytes = 8 << 20;
    o.direct_io = false;
    bool made = false;
    try {
      SwapStore store(o, *engine);
      made = true;
    } catch (...) {
    }
    dies.join();
    if (!made) return 1;
    o.capacity_bytes = 32 << 20;
    try {
      SwapStore store(o, *engine);
      return 2;
    } catch (const IoError& e) {
      if (e.code() != ErrorCode::kNoSpace) return 3;
      if (std::string(e.what()).find("after 0.5 s") == std::string::npos) return 4;
    }
    return 0;
  });
}

TEST_P(SwapStoreTest, FreeSpaceCheckedAtCreationBeforeCreatingAnything) {
  std::vector<std::string> d = dirs(1);
  struct statvfs vfs {};
  ASSERT_EQ(::statvfs(d[0].c_str(), &vfs), 0);
  const std::uint64_t free_now = static_cast<std::uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  SwapStoreOptions o;
  o.directories = d;
  o.stripe_bytes = kStripe;
  o.capacity_bytes = free_now + (64ull << 30);  // far more than is free, even if others free some
  try {
    SwapStore store(o, *engine_);
    FAIL() << "created a store larger than the free space";
  } catch (const IoError& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNoSpace);
    const std::string prefix = "create swap store failed: " + d[0] + ": needs " +
                               std::to_string(o.capacity_bytes / kStripe * kStripe +
                                              (o.capacity_bytes % kStripe ? kStripe : 0)) +
                               " bytes for its swap file but only ";
    EXPECT_EQ(std::string(e.what()).rfind(prefix, 0), 0u) << e.what();
    EXPECT_TRUE(std::string(e.what()).ends_with(
        " bytes are free (after 0.5 s for the space of a process that just ended)"))
        << e.what();
  }
  EXPECT_TRUE(std::filesystem::is_empty(d[0])) << "nothing created";

  // Two directories on one file system: each alone fits, together they do not.
  std::vector<std::string> two = {d[0], dir_.subdir("other")};
  o.directories = two;
  o.capacity_bytes = (free_now / 4 * 3) / kStripe * kStripe * 2;
  try {
    SwapStore store(o, *engine_);
    FAIL() << "the per-file-system sum was not checked";
  } catch (const IoError& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNoSpace);
    EXPECT_NE(std::string(e.what()).find(d[0] + ": needs "), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("for 2 swap files"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(std::filesystem::is_empty(two[0]));
  EXPECT_TRUE(std::filesystem::is_empty(two[1]));
}

TEST_P(SwapStoreTest, CapacityExhaustionAndFragmentation) {
  SwapStoreOptions o = options(1, 1 << 20);
  SwapStore store(o, *engine_);
  EXPECT_EQ(store.capacity_bytes(), 1u << 20);
  store.allocate("a", 512 << 10);
  store.allocate("b", 512 << 10);
  EXPECT_EQ(store.free_bytes(), 0u);
  try {
    store.allocate("c", 1);
    FAIL() << "allocated past capacity";
  } catch (const IoError& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNoSpace);
    EXPECT_EQ(std::string(e.what()), "allocate failed: " + o.directories[0] +
                                         ": swap store is full: key 'c' needs 1 bytes (4096 "
                                         "padded), 0 bytes free of 1048576");
  }
  EXPECT_FALSE(store.contains("c"));
  store.release("a");
  store.release("b");
  EXPECT_EQ(store.used_bytes(), 0u);

  // Fragment: 16 tensors of 64 KiB, free every other one, then ask for 512 KiB: no run is that
  // long, so it gets scattered extents, and still round-trips.
  for (int i = 0; i < 16; ++i) store.allocate("f" + std::to_string(i), kStripe);
  for (int i = 0; i < 16; i += 2) store.release("f" + std::to_string(i));
  store.allocate("scattered", 8 * kStripe);
  EXPECT_EQ(store.free_bytes(), 0u);
  EXPECT_EQ(round_trip(store, "scattered", 77, 1), "");
  EXPECT_EQ(round_trip(store, "f1", 1, 1), "");
  EXPECT_THROW(store.allocate("more", 1), IoError);
}

TEST_P(SwapStoreTest, KeyRules) {
  SwapStore store(options(1, 1 << 20), *engine_);
  AlignedBuffer buf(8192);
  store.allocate("k", 5000);
  EXPECT_THROW(store.allocate("k", 10), UsageError);
  EXPECT_THROW(store.allocate("zero", 0), UsageError);
  EXPECT_THROW(store.swap_out("nope", buf.span()), UsageError);
  EXPECT_THROW(store.swap_in("nope", buf.span()), UsageError);
  EXPECT_THROW(store.release("nope"), UsageError);
  EXPECT_THROW((void)store.size_of("nope"), UsageError);
  try {
    (void)store.swap_in("k", buf.span());
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()),
              "SwapStore::swap_in of key 'k' bytes [0, 8192) were never swapped out");
  }
  store.swap_out("k", buf.span()).wait();
  store.swap_in("k", buf.span()).wait();
}

TEST_P(SwapStoreTest, CallbackRunsAfterTheSwapIsCommitted) {
  SwapStore store(options(2, 1 << 20, /*checksums=*/true), *engine_);
  store.allocate("k", 3 * kStripe);
  AlignedBuffer out(3 * kStripe);
  fill_pattern(out.span(), 3, 0, 1);
  std::atomic<int> calls{0};
  Status seen = Status::error(ErrorCode::kIo, "not called");
  IoTicket t = store.swap_out("k", out.span(), [&](const Status& s) {
    seen = s;
    ++calls;
  });
  t.wait();  // returns after the callback (IoCallback contract)
  EXPECT_EQ(calls.load(), 1);
  EXPECT_TRUE(seen.ok()) << seen.to_string();
  EXPECT_EQ(t.bytes_done(), 3u * kStripe);
  EXPECT_TRUE(t.poll());
  EXPECT_TRUE(t.completed_at().has_value());
  // Committed: a swap_in right after the wait sees the data and its checksums.
  AlignedBuffer in(3 * kStripe);
  store.swap_in("k", in.span()).wait();
  EXPECT_EQ(check_pattern(in.span(), 3, 0, 1), "");
}

TEST_P(SwapStoreTest, PreconditionWritesEveryBlock) {
  SwapStore store(options(2, 2 << 20), *engine_);
  std::optional<std::uint64_t> before = unwritten_bytes(fd_path(store, 0));
  store.precondition();
  for (std::size_t i = 0; i < store.file_paths().size(); ++i) {
    const std::string p = fd_path(store, i);
    auto after = unwritten_bytes(p);
    if (!before || !after) GTEST_SKIP() << "no FIEMAP on this file system";
    EXPECT_EQ(*after, 0u) << p << " still has unwritten extents";
    EXPECT_EQ(std::filesystem::file_size(p), store.file_bytes());
  }
  store.allocate("k", 100000);
  EXPECT_EQ(round_trip(store, "k", 1, 1), "");
  EXPECT_THROW(store.precondition(), UsageError) << "would destroy stored data";
}

TEST_P(SwapStoreTest, CloseFreesTheFilesAndRefusesLaterCalls) {
  SwapStoreOptions o = options(2, 1 << 20);
  auto store = std::make_unique<SwapStore>(o, *engine_);
  // Held only by the store's descriptors: once they are closed the files are gone, which a
  // descriptor of our own (taken now) would prevent, so look at the link counts instead.
  for (std::size_t i = 0; i < 2; ++i) {
    struct stat st {};
    ASSERT_EQ(::fstat(store->file_descriptor(i), &st), 0);
    EXPECT_EQ(st.st_nlink, 0u) << "swap file " << i << " has a name";
  }
  store->allocate("k", 4096);
  Status s = store->close();
  EXPECT_TRUE(s.ok()) << s.to_string();
  EXPECT_THROW(store->allocate("j", 1), UsageError);
  EXPECT_THROW((void)store->file_descriptor(0), UsageError);
  EXPECT_TRUE(store->close().ok());
  store.reset();
  for (const auto& d : o.directories) EXPECT_EQ(entries(d), std::vector<std::string>{}) << d;
}

// The files never have a name in their directories: not while the store is open, not after.
TEST_P(SwapStoreTest, LeavesNoFileInItsDirectories) {
  SwapStoreOptions o = options(2, 2 << 20);
  o.directories.push_back(o.directories[0]);  // one directory twice: two files there
  {
    SwapStore store(o, *engine_);
    for (const auto& d : o.directories) EXPECT_EQ(entries(d), std::vector<std::string>{}) << d;
    store.allocate("k", 3 * kStripe);
    EXPECT_EQ(round_trip(store, "k", 1, 1), "");
    for (const auto& d : o.directories) EXPECT_EQ(entries(d), std::vector<std::string>{}) << d;
  }
  for (const auto& d : o.directories) EXPECT_EQ(entries(d), std::vector<std::string>{}) << d;
}

// The names a store of this pid used to take (zinf-swap-<pid>-<n>.<i>.swp), planted as links
// to a file outside and as a leftover file of a killed run with the same pid (a restarted
// container): the store neither follows them nor fails on them, and leaves them alone.
TEST_P(SwapStoreTest, PlantedNamesAreNeitherFollowedNorCollidedWith) {
  SwapStoreOptions o = options(2, 2 << 20);
  const std::string victim = dir_.file("victim");
  { std::ofstream(victim) << "precious"; }
  const std::string pid = std::to_string(::getpid());
  for (int n = 0; n < 256; ++n) {
    for (std::size_t i = 0; i < o.directories.size(); ++i) {
      const std::string name = o.directories[i] + "/zinf-swap-" + pid + "-" + std::to_string(n) +
                               "." + std::to_string(i) + ".swp";
      if (n % 2 == 0) {
        ASSERT_EQ(::symlink(victim.c_str(), name.c_str()), 0) << name;
      } else {
        std::ofstream(name) << "left by a killed run";
      }
    }
  }
  const std::vector<std::string> before = entries(o.directories[0]);
  for (int round = 0; round < 3; ++round) {
    SwapStore store(o, *engine_);
    store.allocate("k", 5 * kStripe + 1);
    EXPECT_EQ(round_trip(store, "k", 2, 1), "");
    EXPECT_EQ(entries(o.directories[0]), before);
  }
  std::ifstream in(victim);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "precious");
  EXPECT_EQ(std::filesystem::file_size(victim), 8u);
}

// A process killed while its store is open leaves nothing in the directories (the kernel
// frees unnamed files with their last descriptor). The store lives in a forked child (the
// parent holds no engine threads at the fork) that the parent kills with SIGKILL.
TEST(SwapStoreFiles, KilledOwnerLeavesNothingBehind) {
  test::TestDir dir;
  const std::vector<std::string> dirs = {dir.subdir("a"), dir.subdir("b")};
  test::Child child([&](const std::function<void()>& ready) {
    IoOptions io;
    io.kind = IoEngineKind::kThreads;
    io.block_size = kStripe;
    auto engine = make_io_engine(io);
    SwapStoreOptions o;
    o.directories = dirs;
    o.capacity_bytes = 4 << 20;
    o.stripe_bytes = kStripe;
    SwapStore store(o, *engine);
    store.allocate("k", 1 << 20);
    AlignedBuffer out(1 << 20);
    fill_pattern(out.span(), 1, 0, 1);
    store.swap_out("k", out.span()).wait();
    ready();
    for (;;) ::pause();
  });
  ASSERT_TRUE(child.ready()) << "the child could not make its store";
  for (const auto& d : dirs) EXPECT_EQ(entries(d), std::vector<std::string>{}) << d << " (open)";
  const int status = child.kill_and_reap();
  EXPECT_TRUE(WIFSIGNALED(status));
  for (const auto& d : dirs) EXPECT_EQ(entries(d), std::vector<std::string>{}) << d << " (killed)";
}

TEST_P(SwapStoreTest, RejectsBadOptions) {
  SwapStoreOptions o = options(1, 1 << 20);
  o.stripe_bytes = 6000;
  EXPECT_THROW(SwapStore(o, *engine_), UsageError);
  o = options(1, 0);
  EXPECT_THROW(SwapStore(o, *engine_), UsageError);
  o = options(0, 1 << 20);
  EXPECT_THROW(SwapStore(o, *engine_), UsageError);
  o = options(1, 1 << 20);
  o.directories[0] += "/missing";
  try {
    SwapStore store(o, *engine_);
    FAIL();
  } catch (const IoError& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound);
    EXPECT_NE(std::string(e.what()).find(o.directories[0]), std::string::npos) << e.what();
  }
}

// tmpfs: O_DIRECT is refused on older kernels (File falls back to buffered); either way the
// store must work there.
TEST_P(SwapStoreTest, WorksOnTmpfs) {
  if (!std::filesystem::is_directory("/dev/shm")) GTEST_SKIP() << "no /dev/shm here";
  struct statvfs vfs {};
  if (::statvfs("/dev/shm", &vfs) != 0 ||
      static_cast<std::uint64_t>(vfs.f_bavail) * vfs.f_frsize < (64u << 20)) {
    GTEST_SKIP() << "/dev/shm has less than 64 MiB free";
  }
  std::string base = "/dev/shm/zinf-swap-store-test-" + std::to_string(::getpid()) + "-" +
                     io_engine_kind_name(GetParam()).data();
  std::filesystem::create_directories(base);
  {
    SwapStoreOptions o;
    o.directories = {base};
    o.capacity_bytes = 4 << 20;
    o.stripe_bytes = kStripe;
    o.checksums = true;
    SwapStore store(o, *engine_);
    RecordProperty("tmpfs_direct_io", test::supports_direct_io(base) ? "yes" : "no");
    store.allocate("t", (1 << 20) + 3);
    EXPECT_EQ(round_trip(store, "t", 2, 1), "");
  }
  std::filesystem::remove_all(base);
}

// direct_io = false: the path every file system without O_DIRECT takes.
TEST_P(SwapStoreTest, BufferedFilesWork) {
  SwapStoreOptions o = options(2, 2 << 20, /*checksums=*/true);
  o.direct_io = false;
  SwapStore store(o, *engine_);
  EXPECT_EQ(store.alignment(), 4096u) << "buffers and padding stay 4096-aligned";
  store.allocate("b", 3 * kStripe + 7);
  EXPECT_EQ(round_trip(store, "b", 6, 1), "");
  AlignedBuffer tail(4096);
  fill_pattern(tail.span(), 6, 3 * kStripe, 2);
  store.swap_out_range("b", 3 * kStripe, 7, tail.span()).wait();
  AlignedBuffer in(store.padded_size(3 * kStripe + 7));
  store.swap_in("b", in.span()).wait();
  EXPECT_EQ(check_pattern(in.span().first(3 * kStripe), 6, 0, 1), "");
  EXPECT_EQ(check_pattern(in.span().subspan(3 * kStripe), 6, 3 * kStripe, 2), "");
}

INSTANTIATE_TEST_SUITE_P(Backends, SwapStoreTest, ::testing::ValuesIn(test::all_backends()),
                         test::backend_param_name);

}  // namespace
}  // namespace zinf::swap
