// SPDX-License-Identifier: Apache-2.0
// AioHandle: DeepSpeed's aio_handle contract (method names, return values) over a zinf
// IoEngine, without its silent failures: every request's completion is checked, a read past
// the end of a file or a short transfer raises naming the file, offset and length, and
// `validate` really compares the bytes with a plain read of the file.
//
// Each operation opens its file, attaches it to the engine and submits one request (the engine
// splits it into block_size pieces, queue_depth in flight). O_DIRECT is used when the buffer
// address, the length and the offset are aligned for it, else the file is opened buffered:
// DeepSpeed needs aligned tensors for O_DIRECT too, but a caller's arbitrary tensor must still
// work. Synchronous operations return 1 (the operations completed), asynchronous ones 0, and
// wait() the number of asynchronous operations completed since the last wait().
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "native.h"
#include "zinf/common/error.h"
#include "zinf/common/status.h"
#include "zinf/swap/file.h"
#include "zinf/swap/io_engine.h"

namespace zinf::python {
namespace {

constexpr std::uint64_t kDirectAlign = 4096;

bool aligned(std::uint64_t v, std::uint64_t a) { return v % a == 0; }

class AioHandle {
 public:
  AioHandle(int block_size, int queue_depth, bool single_submit, bool overlap_events,
            int intra_op_parallelism)
      : block_size_(block_size), queue_depth_(queue_depth), single_submit_(single_submit),
        overlap_events_(overlap_events), intra_op_(intra_op_parallelism) {
    if (block_size <= 0 || block_size % 4096 != 0) {
      throw UsageError("aio_handle: block_size must be a positive multiple of 4096, got " +
                       std::to_string(block_size));
    }
    if (queue_depth <= 0) {
      throw UsageError("aio_handle: queue_depth must be positive, got " +
                       std::to_string(queue_depth));
    }
    if (intra_op_parallelism <= 0) {
      throw UsageError("aio_handle: intra_op_parallelism must be positive, got " +
                       std::to_string(intra_op_parallelism));
    }
    swap::IoOptions io;
    io.block_size = static_cast<std::uint32_t>(block_size);
    io.queue_depth = static_cast<std::uint32_t>(queue_depth);
    io.threads = static_cast<std::uint32_t>(intra_op_parallelism);
    engine_ = swap::make_io_engine(io);
  }

  ~AioHandle() {
    // Buffers given to async operations may be freed right after: never leave I/O in flight.
    for (auto& p : pending_) p.ticket.wait_status().ignore("aio_handle destroyed before wait()");
  }

  int get_block_size() const { return block_size_; }
  int get_queue_depth() const { return queue_depth_; }
  bool get_single_submit() const { return single_submit_; }
  bool get_overlap_events() const { return overlap_events_; }
  int get_intra_op_parallelism() const { return intra_op_; }
  std::string engine_name() const { return std::string(engine_->name()); }

  int pread(std::uintptr_t address, std::uint64_t bytes, const std::string& path, bool validate,
            bool async, std::uint64_t offset) {
    return submit(swap::IoOp::kRead, address, bytes, path, validate, async, offset);
  }
  int pwrite(std::uintptr_t address, std::uint64_t bytes, const std::string& path, bool validate,
             bool async, std::uint64_t offset) {
    return submit(swap::IoOp::kWrite, address, bytes, path, validate, async, offset);
  }

  // Waits for every asynchronous operation; raises the first failure once all have ended.
  int wait() {
    std::vector<Op> ops = std::move(pending_);
    pending_.clear();
    std::optional<Status> first;
    int done = 0;
    {
      py::gil_scoped_release nogil;
      for (auto& op : ops) {
        Status s = finish(op);
        if (s.ok()) {
          ++done;
        } else if (!first) {
          first = std::move(s);
        }
      }
    }
    if (first) throw IoError(*first);
    return done;
  }

 private:
  struct Op {
    swap::IoOp op = swap::IoOp::kRead;
    std::unique_ptr<swap::File> file;
    swap::FileId id;
    swap::IoTicket ticket;
    std::byte* data = nullptr;
    std::uint64_t bytes = 0;
    std::uint64_t offset = 0;
    bool validate = false;
  };

  int submit(swap::IoOp kind, std::uintptr_t address, std::uint64_t bytes,
             const std::string& path, bool validate, bool async, std::uint64_t offset) {
    const char* what = kind == swap::IoOp::kRead ? "aio_handle read" : "aio_handle write";
    if (address == 0 && bytes > 0) throw UsageError(std::string(what) + ": null buffer");
    Op op;
    op.op = kind;
    op.data = reinterpret_cast<std::byte*>(address);
    op.bytes = bytes;
    op.offset = offset;
    op.validate = validate;
    swap::FileOptions fo;
    fo.read_only = kind == swap::IoOp::kRead;
    fo.create = kind == swap::IoOp::kWrite;
    fo.direct = aligned(address, kDirectAlign) && aligned(bytes, kDirectAlign) &&
                aligned(offset, kDirectAlign);
    op.file = std::make_unique<swap::File>(swap::File::open(path, fo));
    if (op.file->is_direct() &&
        !(aligned(address, op.file->alignment()) && aligned(bytes, op.file->alignment()) &&
          aligned(offset, op.file->alignment()))) {
      fo.direct = false;  // the device wants a coarser alignment than 4096
      op.file = std::make_unique<swap::File>(swap::File::open(path, fo));
    }
    if (kind == swap::IoOp::kRead) {
      const std::uint64_t size = op.file->size();
      if (offset > size || bytes > size - offset) {
        throw IoError(Status::error(ErrorCode::kShortTransfer,
                                    "the file holds " + std::to_string(size) +
                                        " bytes, fewer than the read asks for")
                          .with_operation(what)
                          .with_path(path)
                          .with_range(offset, bytes));
      }
    }
    op.id = engine_->attach(*op.file);
    try {
      const swap::IoRequest req{kind, op.id, offset, std::span<std::byte>(op.data, bytes)};
      op.ticket = engine_->submit(std::span<const swap::IoRequest>(&req, 1));
    } catch (...) {
      engine_->detach(op.id);
      throw;
    }
    if (async) {
      pending_.push_back(std::move(op));
      return 0;
    }
    Status s;
    {
      py::gil_scoped_release nogil;
      s = finish(op);
    }
    if (!s.ok()) throw IoError(s);
    return 1;
  }

  // Waits for `op`, detaches and closes its file, checks the byte count and, with validate,
  // compares the buffer with a plain read of the file. Never throws.
  Status finish(Op& op) {
    Status s = op.ticket.wait_status();
    if (s.ok() && op.ticket.bytes_done() != op.bytes) {
      s = Status::error(ErrorCode::kShortTransfer,
                        std::to_string(op.ticket.bytes_done()) + " of " +
                            std::to_string(op.bytes) + " bytes transferred")
              .with_path(op.file->path())
              .with_range(op.offset, op.bytes);
    }
    if (s.ok() && op.validate) s = compare_with_file(op);
    engine_->detach(op.id);
    const Status closed = op.file->close();
    if (s.ok()) s = closed;
    return s;
  }

  static Status compare_with_file(const Op& op) {
    std::vector<std::byte> check(static_cast<std::size_t>(op.bytes));
    std::uint64_t got = 0;
    // A second, plain descriptor: the attached one may be O_DIRECT, which the vector is not
    // aligned for.
    swap::FileOptions fo;
    fo.read_only = true;
    fo.direct = false;
    try {
      swap::File plain = swap::File::open(op.file->path(), fo);
      while (got < op.bytes) {
        const ssize_t n = ::pread(plain.fd(), check.data() + got, op.bytes - got,
                                  static_cast<off_t>(op.offset + got));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
          return Status::from_errno(errno, "aio_handle validate", op.file->path())
              .with_range(op.offset, op.bytes);
        }
        if (n == 0) break;
        got += static_cast<std::uint64_t>(n);
      }
    } catch (const IoError& e) {
      return e.status();
    }
    if (got != op.bytes || std::memcmp(check.data(), op.data, op.bytes) != 0) {
      return Status::error(ErrorCode::kCorrupt,
                           "validate: the file's bytes differ from the buffer's")
          .with_path(op.file->path())
          .with_range(op.offset, op.bytes);
    }
    return Status::ok_status();
  }

  int block_size_;
  int queue_depth_;
  bool single_submit_;
  bool overlap_events_;
  int intra_op_;
  std::unique_ptr<swap::IoEngine> engine_;
  std::vector<Op> pending_;
};

}  // namespace

void bind_aio(py::module_& m) {
  using namespace pybind11::literals;
  py::class_<AioHandle>(m, "AioHandle",
                        "Asynchronous file I/O over a zinf engine; see zinf.compat.deepspeed.")
      .def(py::init<int, int, bool, bool, int>(), "block_size"_a, "queue_depth"_a,
           "single_submit"_a, "overlap_events"_a, "intra_op_parallelism"_a)
      .def("get_block_size", &AioHandle::get_block_size)
      .def("get_queue_depth", &AioHandle::get_queue_depth)
      .def("get_single_submit", &AioHandle::get_single_submit)
      .def("get_overlap_events", &AioHandle::get_overlap_events)
      .def("get_intra_op_parallelism", &AioHandle::get_intra_op_parallelism)
      .def("engine_name", &AioHandle::engine_name)
      .def("pread", &AioHandle::pread, "address"_a, "nbytes"_a, "filename"_a, "validate"_a,
           "async_op"_a, "file_offset"_a)
      .def("pwrite", &AioHandle::pwrite, "address"_a, "nbytes"_a, "filename"_a, "validate"_a,
           "async_op"_a, "file_offset"_a)
      .def("wait", &AioHandle::wait);
}

}  // namespace zinf::python
