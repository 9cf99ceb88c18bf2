// SPDX-License-Identifier: Apache-2.0
// DirectFileWriter / DirectFileReader (direct_file.h): a sequential O_DIRECT writer with two
// staging buffers and a padded, truncated tail, and a windowed O_DIRECT reader.
#include "zinf/swap/direct_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <optional>

#include "zinf/common/align.h"
#include "zinf/common/error.h"
#include "zinf/common/log.h"
#include "zinf/swap/buffer_pool.h"
#include "zinf/swap/fault_injection.h"
#include "zinf/swap/file.h"
#include "zinf/swap/io_engine.h"

namespace zinf::swap {
namespace {

// One engine per writer: it lives as long as one torch.save, and its queue is its own. kAuto:
// io_uring where the kernel allows it, else the thread pool; the engine splits each buffer
// into block_size pieces and keeps queue_depth of them in flight.
std::unique_ptr<IoEngine> file_engine(const DirectFileOptions& options) {
  IoOptions io;
  io.kind = IoEngineKind::kAuto;
  io.faults = options.faults;
  return make_io_engine(io);
}

std::uint64_t buffer_size_for(const DirectFileOptions& options, std::uint32_t alignment) {
  if (options.buffer_bytes == 0) throw UsageError("DirectFile: buffer_bytes must be > 0");
  return align_up(options.buffer_bytes, std::max<std::uint32_t>(alignment, 4096));
}

}  // namespace

struct DirectFileWriter::Impl {
  File file;
  std::unique_ptr<IoEngine> engine;
  FileId id;
  std::optional<BufferPool> pool;
  std::array<BufferLease, 2> buffers;
  std::array<IoTicket, 2> tickets;
  std::size_t current = 0;   // the buffer being filled
  std::uint64_t filled = 0;  // bytes staged in it
  std::uint64_t buffer_bytes = 0;
  std::uint64_t file_offset = 0;  // where the current buffer goes
  bool sync_on_close = true;
  std::optional<Status> failure;
  // Bytes of the file allocated ahead (fallocate), and whether the file system allows it.
  std::uint64_t allocated = 0;
  bool can_allocate = true;
  bool can_allocate_ahead = true;  // false once the drive had no room for the step ahead

  void check() const {
    if (failure) throw IoError(*failure);
  }
  // Waits for buffer b's write; a failure fails the writer.
  void settle(std::size_t b) {
    Status s = tickets[b].wait_status();
    tickets[b] = IoTicket{};
    if (!s.ok() && !failure) failure = s;
    check();
  }
  // Allocates the file ahead of the writes, in steps of 64 MiB or more. Why: an O_DIRECT write
  // past the end of the file extends it, and ext4 runs such writes one at a time (the inode
  // lock, the size update); inside the allocated size they go as deep as the queue. close()
  // truncates the file back to the bytes written. The step ahead is a speed-up only: where
  // the drive has no room for it, the file is allocated up to the end of the buffer being
  // written and no further (an 8 MiB save fits in 40 MiB free); only the bytes being written
  // failing to fit are an error (ENOSPC naming that range).
  void allocate_ahead(std::uint64_t end) {
    if (!can_allocate || end <= allocated) return;
    const std::uint64_t ahead =
        can_allocate_ahead ? std::max(end, allocated + (std::uint64_t{64} << 20)) : end;
    int err = allocate(ahead);
    if (err == 0) return;
    if ((err == ENOSPC || err == EDQUOT) && ahead > end) {
      can_allocate_ahead = false;
      err = allocate(end);
      if (err == 0) return;
    }
    if (err == EOPNOTSUPP || err == ENOSYS || err == EINVAL) {
      can_allocate = false;  // the writes extend the file themselves
      return;
    }
    failure =
        Status::from_errno(err, "allocate", file.path()).with_range(allocated, end - allocated);
    check();
  }
  // fallocate from `allocated` up to `to`: 0, or the errno.
  int allocate(std::uint64_t to) {
    if (::fallocate(file.fd(), 0, static_cast<off_t>(allocated),
                    static_cast<off_t>(to - allocated)) == 0) {
      allocated = to;
      return 0;
    }
    return errno;
  }
  void submit_current(std::uint64_t bytes) {
    allocate_ahead(file_offset + bytes);
    IoRequest req{IoOp::kWrite, id, file_offset, buffers[current].span().first(bytes)};
    tickets[current] = engine->submit(std::span<const IoRequest>(&req, 1));
    file_offset += bytes;
    current ^= 1;
    filled = 0;
    settle(current);  // the other buffer is reused from here on
  }
};

DirectFileWriter::DirectFileWriter(const std::string& path, const DirectFileOptions& options)
    : impl_(std::make_unique<Impl>()), path_(path) {
  Impl& m = *impl_;
  m.file = File::open(path, FileOptions{.create = true, .truncate = true});
  m.buffer_bytes = buffer_size_for(options, m.file.alignment());
  m.sync_on_close = options.sync_on_close;
  m.engine = file_engine(options);
  m.id = m.engine->attach(m.file);
  m.pool.emplace(BufferPoolOptions{.budget_bytes = 2 * m.buffer_bytes,
                                   .alignment = std::max<std::uint32_t>(m.file.alignment(), 4096)});
  for (auto& b : m.buffers) b = m.pool->acquire(m.buffer_bytes);
}

DirectFileWriter::~DirectFileWriter() {
  if (closed_) return;
  try {
    if (!impl_->failure) close();  // a failure was thrown to the caller already
  } catch (const std::exception& e) {
    log(LogLevel::kWarning, std::string("DirectFileWriter: closing ") + path_ + ": " + e.what());
  }
  if (impl_) {
    // Every write is waited for (close() may have stopped at the first error).
    for (auto& t : impl_->tickets) t.wait_status().ignore("closing after an error");
    if (impl_->engine && impl_->id.valid()) impl_->engine->detach(impl_->id);
    impl_->id = FileId{};
  }
}

bool DirectFileWriter::is_direct() const noexcept { return impl_->file.is_direct(); }

void DirectFileWriter::write(std::span<const std::byte> data) {
  if (closed_) throw UsageError("DirectFileWriter::write: " + path_ + " is closed");
  Impl& m = *impl_;
  m.check();
  while (!data.empty()) {
    const std::uint64_t n = std::min<std::uint64_t>(data.size(), m.buffer_bytes - m.filled);
    std::memcpy(m.buffers[m.current].data() + m.filled, data.data(), n);
    m.filled += n;
    size_ += n;
    data = data.subspan(n);
    if (m.filled == m.buffer_bytes) m.submit_current(m.buffer_bytes);
  }
}

void DirectFileWriter::flush() {
  if (closed_) return;
  Impl& m = *impl_;
  m.check();
  m.settle(m.current ^ 1);
}

void DirectFileWriter::close() {
  if (closed_) return;
  Impl& m = *impl_;
  m.check();
  if (m.filled > 0) {
    // The tail: whole blocks only under O_DIRECT, so zeros up to the alignment, written, then
    // cut off again below.
    const std::uint64_t padded = align_up(m.filled, std::max<std::uint32_t>(m.file.alignment(), 1));
    std::memset(m.buffers[m.current].data() + m.filled, 0, padded - m.filled);
    m.submit_current(padded);
  }
  m.settle(0);
  m.settle(1);
  m.engine->detach(m.id);
  m.id = FileId{};
  if (::ftruncate(m.file.fd(), static_cast<off_t>(size_)) != 0) {
    m.failure = Status::from_errno(errno, "truncate to the bytes written", path_)
                    .with_range(size_, 0);
    m.check();
  }
  if (m.sync_on_close) {
    Status s = m.file.sync();
    if (!s.ok()) m.failure = s;
    m.check();
  }
  Status s = m.file.close();
  if (!s.ok()) m.failure = s;
  m.check();
  closed_ = true;
}

struct DirectFileReader::Impl {
  File file;
  std::optional<BufferPool> pool;
  BufferLease window;
  std::uint64_t window_bytes = 0;
  std::uint64_t window_offset = 0;
  std::uint64_t window_valid = 0;  // bytes of the file in the window (0: empty)
};

DirectFileReader::DirectFileReader(const std::string& path, const DirectFileOptions& options)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.file = File::open(path, FileOptions{.read_only = true});
  size_ = m.file.size();
  m.window_bytes = buffer_size_for(options, m.file.alignment());
  m.pool.emplace(BufferPoolOptions{.budget_bytes = m.window_bytes,
                                   .alignment = std::max<std::uint32_t>(m.file.alignment(), 4096)});
  m.window = m.pool->acquire(m.window_bytes);
}

DirectFileReader::~DirectFileReader() = default;

bool DirectFileReader::is_direct() const noexcept { return impl_->file.is_direct(); }

std::size_t DirectFileReader::read_at(std::uint64_t offset, std::span<std::byte> out) {
  Impl& m = *impl_;
  std::size_t done = 0;
  while (done < out.size() && offset < size_) {
    if (offset < m.window_offset || offset >= m.window_offset + m.window_valid) {
      // Reload the window at the aligned block holding `offset`, whole blocks: pread returns
      // short at the end of the file, where the last block is partial (the reader does not
      // go through the engine, which treats a short read as one to resubmit).
      m.window_offset = align_down(offset, m.window_bytes);
      const std::uint64_t want = std::min(m.window_bytes, size_ - m.window_offset);
      const std::uint64_t len = align_up(want, std::max<std::uint32_t>(m.file.alignment(), 1));
      m.window_valid = 0;
      std::uint64_t got = 0;
      while (got < want) {
        const ssize_t r = ::pread(m.file.fd(), m.window.data() + got, len - got,
                                  static_cast<off_t>(m.window_offset + got));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
          throw IoError(Status::from_errno(errno, "read", m.file.path())
                            .with_range(m.window_offset + got, len - got));
        }
        if (r == 0) {
          throw IoError(Status::error(ErrorCode::kShortTransfer,
                                      "the file ended early (truncated while open?)")
                            .with_operation("read")
                            .with_path(m.file.path())
                            .with_range(m.window_offset + got, want - got));
        }
        got += static_cast<std::uint64_t>(r);
      }
      m.window_valid = want;
    }
    const std::uint64_t in = offset - m.window_offset;
    const std::uint64_t n = std::min<std::uint64_t>(out.size() - done, m.window_valid - in);
    std::memcpy(out.data() + done, m.window.data() + in, n);
    done += n;
    offset += n;
  }
  return done;
}

}  // namespace zinf::swap
