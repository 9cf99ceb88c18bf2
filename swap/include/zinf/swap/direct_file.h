// SPDX-License-Identifier: Apache-2.0
// DirectFileWriter / DirectFileReader: one file written front to back, and read back, through
// O_DIRECT with aligned staging buffers and an IoEngine, for serialisers that hand over a byte
// stream (torch.save's writes; zinf.torch.FastFileWriter). Part of zinf::swap.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

namespace zinf::swap {

struct FaultPlan;

struct DirectFileOptions {
  /// Bytes of one staging buffer: the size of each write (and read) submitted. A multiple of
  /// the file's alignment (rounded up). 8 MiB: large enough that the drive sees deep queues
  /// (the engine splits it into IoOptions::block_size pieces), small next to a checkpoint.
  std::uint64_t buffer_bytes = std::uint64_t{8} << 20;
  /// fdatasync before close() returns, so that the file is durable when it does.
  bool sync_on_close = true;
  /// Faults injected into the writer's engine (tests; see fault_injection.h). Null: none.
  std::shared_ptr<FaultPlan> faults = nullptr;
};

/// Writes a new file sequentially. Two staging buffers of buffer_bytes (aligned host memory
/// from a BufferPool): write() copies into one while the other's write is in flight, so the
/// copy overlaps the drive. The file is opened with O_DIRECT where the file system allows it;
/// where it refuses (EINVAL: tmpfs, some FUSE) it is written buffered, with one notice (a
/// choice: the bytes are the same, only the page cache is used; is_direct() says which).
/// The last, partial block is written padded with zeros to the alignment, and the file is then
/// truncated to the bytes written (ftruncate), so its size is exactly size().
///
/// Errors: IoError naming the path (and for a failed write the offset and length; errno kept,
/// e.g. ENOSPC as kNoSpace); a failed write is reported by the write(), flush() or close()
/// that waits for it, and the writer is then failed (every later call throws the same error,
/// close() removes nothing: the caller decides). Not thread-safe (one caller). The destructor
/// closes without throwing (an error is logged); call close() to see it.
class DirectFileWriter {
 public:
  /// Creates (or truncates) `path` (mode 0600 when created, as File::open). IoError if it
  /// cannot (errno and path kept: EACCES, ENOENT for a missing directory, ...).
  DirectFileWriter(const std::string& path, const DirectFileOptions& options = {});
  ~DirectFileWriter();
  DirectFileWriter(const DirectFileWriter&) = delete;
  DirectFileWriter& operator=(const DirectFileWriter&) = delete;

  /// Appends `data`; returns once it is copied into staging (a full buffer's write is
  /// submitted, and the buffer reused only once that write is done).
  void write(std::span<const std::byte> data);
  /// Waits for every full buffer's write submitted so far (the partial one stays staged until
  /// close(): O_DIRECT writes whole blocks only).
  void flush();
  /// Writes the staged tail, truncates to size(), fdatasyncs (sync_on_close) and closes.
  /// Idempotent after success.
  void close();

  std::uint64_t size() const noexcept { return size_; }
  bool is_direct() const noexcept;
  bool closed() const noexcept { return closed_; }
  const std::string& path() const noexcept { return path_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string path_;
  std::uint64_t size_ = 0;
  bool closed_ = false;
};

/// Reads a file at any offset through O_DIRECT (buffered where refused, as the writer) and a
/// cached aligned window of buffer_bytes, filled with pread: a stream of small reads (a zip
/// directory, pickle records) costs one drive read per window, a large one goes window by
/// window. Errors: IoError naming path, offset and length. Not thread-safe.
class DirectFileReader {
 public:
  explicit DirectFileReader(const std::string& path, const DirectFileOptions& options = {});
  ~DirectFileReader();
  DirectFileReader(const DirectFileReader&) = delete;
  DirectFileReader& operator=(const DirectFileReader&) = delete;

  std::uint64_t size() const noexcept { return size_; }
  bool is_direct() const noexcept;
  /// Copies up to out.size() bytes from `offset` into `out`; returns the bytes copied (fewer
  /// only at the end of the file; 0 at or past it).
  std::size_t read_at(std::uint64_t offset, std::span<std::byte> out);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::uint64_t size_ = 0;
};

}  // namespace zinf::swap
