// SPDX-License-Identifier: Apache-2.0
// IoBench's runs on a small file: a random lap writes every block once (read back from the kept
// file, outside zinf's own reads), a mixed run verifies the reads of blocks it wrote itself, the
// same seed draws the same mix, and a time-based run samples each interval and leaves the file
// verifiable after partial laps. Files of 1-2 MiB; the timed run lasts 0.3 s and no figure of
// its speed is checked.
#include "io_bench.h"

#include <chrono>
#include <cstddef>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "io_pattern.h"
#include "support/test_dir.h"

namespace zinf::tools {
namespace {

using std::chrono::milliseconds;

constexpr std::uint32_t kBlock = 64 << 10;

IoBenchOptions small(const std::string& dir, std::uint64_t size) {
  IoBenchOptions o;
  o.dirs = {dir};
  o.size = size;
  o.io.kind = swap::IoEngineKind::kThreads;  // everywhere, io_uring or not
  o.io.block_size = kBlock;
  o.io.queue_depth = 4;
  o.io.threads = 2;
  o.huge_pages = false;
  return o;
}

TEST(IoBench, RandomLapWritesEveryBlockOnce) {
  zinf::test::TestDir dir;
  IoBenchOptions o = small(dir.path(), 2 << 20);
  o.keep = true;
  std::string path;
  {
    IoBench bench(o);
    (void)bench.write();  // generation 1 everywhere
    IoRunSpec spec;
    spec.random = true;
    spec.seed = 42;
    const IoPassResult r = bench.run(spec);  // generation 2, in a random order
    EXPECT_EQ(r.write_bytes, 2u << 20);
    EXPECT_EQ(r.write_latencies_us.size(), 32u);
    EXPECT_TRUE(r.write_samples.empty());  // not time-based
    path = bench.keep_files().at(0);
  }
  // Every block carries generation 2: none was skipped (nor, with 32 requests, repeated).
  std::ifstream f(path, std::ios::binary);
  std::vector<std::byte> buf(kBlock);
  for (std::uint64_t off = 0; off < (2u << 20); off += kBlock) {
    ASSERT_TRUE(f.read(reinterpret_cast<char*>(buf.data()), kBlock)) << off;
    EXPECT_EQ(verify_block(buf, 0, off, 2), "") << "block at " << off;
  }
}

TEST(IoBench, MixedRunVerifiesTheBlocksItWroteAndTheSeedRedrawsIt) {
  zinf::test::TestDir dir;
  IoBench bench(small(dir.path(), 2 << 20));
  (void)bench.write();
  IoRunSpec spec;
  spec.read_share = 0.5;
  spec.random = true;
  spec.seed = 7;
  const IoPassResult a = bench.run(spec);
  EXPECT_EQ(a.read_bytes + a.write_bytes, 2u << 20);
  EXPECT_GT(a.read_bytes, 0u);
  EXPECT_GT(a.write_bytes, 0u);
  EXPECT_EQ(a.read_latencies_us.size() * kBlock, a.read_bytes);
  const IoPassResult b = bench.run(spec);  // reads verify what the first run wrote
  EXPECT_EQ(b.read_bytes, a.read_bytes) << "seed 7 draws the same mix";
  spec.seed = 8;
  (void)bench.run(spec);
  (void)bench.read();  // every block as its last writer left it
}

TEST(IoBench, TimedRunSamplesEachIntervalAndLeavesTheFileVerifiable) {
  zinf::test::TestDir dir;
  IoBench bench(small(dir.path(), 1 << 20));
  (void)bench.write();
  IoRunSpec spec;
  spec.duration = milliseconds(300);
  spec.sample_interval = milliseconds(100);
  const IoPassResult r = bench.run(spec);
  EXPECT_GE(r.seconds, 0.3);
  EXPECT_EQ(r.read_bytes, 0u);
  EXPECT_TRUE(r.read_samples.empty());
  ASSERT_GE(r.write_samples.size(), 3u);
  std::uint64_t sampled = 0;
  for (std::size_t i = 0; i < r.write_samples.size(); ++i) {
    const ThroughputSample& s = r.write_samples[i];
    if (i < 3) {
      EXPECT_NEAR(s.end_s, 0.1 * static_cast<double>(i + 1), 1e-9) << i;
      EXPECT_NEAR(s.seconds, 0.1, 1e-9) << i;
    }
    sampled += s.bytes;
    EXPECT_EQ(s.cumulative_bytes, sampled) << i;
    EXPECT_EQ(s.bytes % kBlock, 0u) << i;
  }
  EXPECT_LE(sampled, r.write_bytes);
  // The run stopped wherever its last lap was: the reads verify each block's own generation.
  (void)bench.read();
  spec.read_share = 1;
  const IoPassResult rd = bench.run(spec);
  EXPECT_EQ(rd.write_bytes, 0u);
  EXPECT_FALSE(rd.read_samples.empty());
}

}  // namespace
}  // namespace zinf::tools
