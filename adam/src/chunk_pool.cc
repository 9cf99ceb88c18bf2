// SPDX-License-Identifier: Apache-2.0
// ChunkPool on boost::asio::thread_pool: the caller and threads-1 pool workers claim chunks
// from a shared counter until none is left.
//
// Asio rather than OpenMP: timed side by side on the same kernel and chunks (100M and 4M
// elements, 1 and 2 threads) the two were equal within this machine's noise; OpenMP's
// spinning workers only won on sub-megabyte arrays (~80 us vs ~170 us for 256 Ki elements on
// 2 threads), far below the optimizer's sub-group sizes. Asio is the project's executor, is
// understood by TSan (libgomp is not), and its idle workers sleep instead of spinning on
// vCPUs shared with the I/O threads.
#include "chunk_pool.h"

#include <algorithm>
#include <atomic>
#include <latch>
#include <string>
#include <thread>

#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>

#include "zinf/common/error.h"

namespace zinf::adam::detail {

struct ChunkPool::Pool {
  explicit Pool(std::size_t workers) : pool(workers) {}
  boost::asio::thread_pool pool;
};

namespace {

// How a run of n elements after an unaligned head is cut: full chunks while more than two are
// left, then the rest (one to two chunks' worth) in tail chunks; chunk 0 also takes the head.
// A run of one chunk or less stays whole.
struct Chunking {
  Chunking(std::size_t n, std::size_t head) {
    const std::size_t rest = n - head;
    if (rest <= kChunkElems) return;
    full = rest > 2 * kChunkElems ? (rest - kChunkElems) / kChunkElems : 0;
    const std::size_t tail = rest - full * kChunkElems;
    chunks = full + (tail + kTailChunkElems - 1) / kTailChunkElems;
  }
  // Chunk k's start past the head.
  std::size_t start(std::size_t k) const {
    return k <= full ? k * kChunkElems : full * kChunkElems + (k - full) * kTailChunkElems;
  }
  std::size_t full = 1;    // full-size chunks
  std::size_t chunks = 1;  // all chunks
};

// One run(): the shared claim counter and the latch the caller waits on. Held by shared_ptr
// so that a worker finishing after the caller has woken never touches freed memory.
struct Job {
  Job(Chunking cut_in, std::size_t n_in, std::size_t head_in, ChunkPool::ChunkFn fn_in,
      const void* ctx_in, std::ptrdiff_t helpers)
      : cut(cut_in), n(n_in), head(head_in), fn(fn_in), ctx(ctx_in), done(helpers) {}

  void work() {
    for (;;) {
      const std::size_t k = next.fetch_add(1, std::memory_order_relaxed);
      if (k >= cut.chunks) return;
      const std::size_t begin = k == 0 ? 0 : head + cut.start(k);
      const std::size_t end = k + 1 == cut.chunks ? n : head + cut.start(k + 1);
      fn(ctx, begin, end);
    }
  }

  const Chunking cut;
  const std::size_t n;
  const std::size_t head;
  const ChunkPool::ChunkFn fn;
  const void* const ctx;
  std::atomic<std::size_t> next{0};
  std::latch done;
};

}  // namespace

ChunkPool::ChunkPool(std::size_t threads) : threads_(threads) {
  if (threads_ == 0) threads_ = std::max(1u, std::thread::hardware_concurrency());
  if (threads_ > kMaxThreads) {
    throw UsageError("threads=" + std::to_string(threads) + " exceeds the limit of " +
                     std::to_string(kMaxThreads));
  }
  if (threads_ > 1) pool_ = std::make_unique<Pool>(threads_ - 1);
}

ChunkPool::~ChunkPool() {
  if (pool_) pool_->pool.join();
}

void ChunkPool::run(std::size_t n, const void* anchor, std::size_t elem_bytes, ChunkFn fn,
                    const void* ctx) {
  if (n == 0) return;
  // Elements before the first 64-byte boundary of the anchor array (0 if it is aligned, or if
  // its elements cannot reach a boundary).
  const auto addr = reinterpret_cast<std::uintptr_t>(anchor);
  std::size_t head = 0;
  if (elem_bytes != 0 && addr % elem_bytes == 0) {
    head = ((64 - addr % 64) % 64) / elem_bytes;
  }
  head = std::min(head, n);
  const Chunking cut(n, head);
  const std::size_t helpers = std::min(threads_, cut.chunks) - 1;
  if (helpers == 0) {
    Job job(cut, n, head, fn, ctx, 0);
    job.work();
    return;
  }
  auto job = std::make_shared<Job>(cut, n, head, fn, ctx, static_cast<std::ptrdiff_t>(helpers));
  for (std::size_t t = 0; t < helpers; ++t) {
    boost::asio::post(pool_->pool, [job] {
      job->work();
      job->done.count_down();
    });
  }
  job->work();
  job->done.wait();
}

}  // namespace zinf::adam::detail
