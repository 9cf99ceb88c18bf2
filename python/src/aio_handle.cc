// SPDX-License-Identifier: Apache-2.0
// AioHandle: DeepSpeed's aio_handle contract (method names, return values) over a zinf
// IoEngine, without its silent failures: every request's completion is checked, a read past
// the end of a file or a short transfer raises naming the file, offset and length, and
// `validate` really compares the bytes with a second read of the file.
//
// Each operation opens its file (or takes a second descriptor of the caller's, see
// File::from_descriptor), attaches it to the engine and submits one request: the engine splits
// it into pieces of block_size rounded up to 4096 (DeepSpeed takes any block size, zinf's
// pieces stay page-aligned), queue_depth in flight. A path is opened with O_DIRECT when the
// buffer address, the length and the offset are aligned for it, else buffered: DeepSpeed needs
// aligned tensors for O_DIRECT too, but a caller's arbitrary tensor must still work. A caller's
// descriptor is used with the flags it has: with O_DIRECT, a misaligned buffer goes through an
// aligned bounce buffer, and a misaligned offset or length is refused (rewriting the edges of a
// block would race with the caller's own writes). Synchronous operations return 1 (the
// operations completed), asynchronous ones 0, and wait() the number of asynchronous operations
// it completed.
//
// One handle may be used from several threads (DeepSpeed's swappers share handles): each
// asynchronous operation holds what the caller asked to keep alive (its tensors) until the
// operation is complete, and wait() returns only once every operation submitted before it is
// complete, whichever thread's wait() completed it (InflightOps).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "inflight_ops.h"
#include "native.h"
#include "zinf/common/error.h"
#include "zinf/common/status.h"
#include "zinf/swap/file.h"
#include "zinf/swap/io_engine.h"

namespace zinf::python {
namespace {

constexpr std::uint64_t kDirectAlign = 4096;
// The engine's limits (IoOptions): DeepSpeed's handle takes any positive values.
constexpr int kMaxEngineQueueDepth = 4096;

bool aligned(std::uint64_t v, std::uint64_t a) { return v % a == 0; }

struct FreeDeleter {
  void operator()(std::byte* p) const noexcept { std::free(p); }
};
using AlignedBytes = std::unique_ptr<std::byte, FreeDeleter>;

AlignedBytes aligned_bytes(std::uint64_t bytes, std::uint64_t alignment) {
  void* p = nullptr;
  const std::uint64_t size = (bytes + alignment - 1) / alignment * alignment;
  if (::posix_memalign(&p, alignment, size == 0 ? alignment : size) != 0) throw std::bad_alloc();
  return AlignedBytes(static_cast<std::byte*>(p));
}

// Where an operation reads or writes: a path the caller named, or a descriptor of theirs.
struct Target {
  std::string path;
  std::optional<int> fd = std::nullopt;
};

class AioHandle {
 public:
  AioHandle(int block_size, int queue_depth, bool single_submit, bool overlap_events,
            int intra_op_parallelism)
      : block_size_(block_size), queue_depth_(queue_depth), single_submit_(single_submit),
        overlap_events_(overlap_events), intra_op_(intra_op_parallelism) {
    if (block_size <= 0) {
      throw UsageError("aio_handle: block_size must be positive, got " +
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
    io.block_size = static_cast<std::uint32_t>(
        (static_cast<std::uint64_t>(block_size) + kDirectAlign - 1) / kDirectAlign * kDirectAlign);
    io.queue_depth = static_cast<std::uint32_t>(std::min(queue_depth, kMaxEngineQueueDepth));
    io.threads = static_cast<std::uint32_t>(intra_op_parallelism);
    engine_ = swap::make_io_engine(io);
  }

  ~AioHandle() {
    // Buffers given to async operations may be freed right after: never leave I/O in flight.
    // (Destroyed with the GIL held, by the last reference: no wait() is running.)
    auto claim = ops_.claim();
    for (auto& [n, op] : claim.ops) finish(op).ignore("aio_handle destroyed before wait()");
  }

  int get_block_size() const { return block_size_; }
  int get_queue_depth() const { return queue_depth_; }
  bool get_single_submit() const { return single_submit_; }
  bool get_overlap_events() const { return overlap_events_; }
  int get_intra_op_parallelism() const { return intra_op_; }
  std::string engine_name() const { return std::string(engine_->name()); }

  int get_alignment() const { return static_cast<int>(kDirectAlign); }

  // `keep`: held until an asynchronous operation is complete (the caller's tensors and their
  // storage); `on_done`: None or a callable, called with the GIL once the operation succeeded
  // and before any wait() counting on it returns (the copy into a GPU tensor).
  int pread(std::uintptr_t address, std::uint64_t bytes, const std::string& path, bool validate,
            bool async, std::uint64_t offset, py::object keep, py::object on_done) {
    return submit(swap::IoOp::kRead, address, bytes, Target{path}, validate, async, offset,
                  std::move(keep), std::move(on_done));
  }
  int pwrite(std::uintptr_t address, std::uint64_t bytes, const std::string& path, bool validate,
             bool async, std::uint64_t offset, py::object keep, py::object on_done) {
    return submit(swap::IoOp::kWrite, address, bytes, Target{path}, validate, async, offset,
                  std::move(keep), std::move(on_done));
  }
  int pread_fd(std::uintptr_t address, std::uint64_t bytes, int fd, bool validate, bool async,
               std::uint64_t offset, py::object keep, py::object on_done) {
    return submit(swap::IoOp::kRead, address, bytes, Target{{}, fd}, validate, async, offset,
                  std::move(keep), std::move(on_done));
  }
  int pwrite_fd(std::uintptr_t address, std::uint64_t bytes, int fd, bool validate, bool async,
                std::uint64_t offset, py::object keep, py::object on_done) {
    return submit(swap::IoOp::kWrite, address, bytes, Target{{}, fd}, validate, async, offset,
                  std::move(keep), std::move(on_done));
  }

  // Completes every asynchronous operation no other wait() has taken, runs their on_done,
  // drops their keep-alives, then waits for the operations other threads' wait() calls took
  // that were submitted before this one. Raises the first failure among the operations it
  // completed (an I/O error before an on_done's exception) once they have all ended; returns
  // how many it completed.
  int wait() {
    auto claim = ops_.claim();
    std::vector<Status> statuses(claim.ops.size());
    {
      py::gil_scoped_release nogil;
      for (std::size_t i = 0; i < claim.ops.size(); ++i) statuses[i] = finish(claim.ops[i].second);
    }
    std::optional<Status> first;
    std::optional<py::error_already_set> first_py;
    int done = 0;
    std::vector<std::uint64_t> numbers;
    for (std::size_t i = 0; i < claim.ops.size(); ++i) {
      Op& op = claim.ops[i].second;
      numbers.push_back(claim.ops[i].first);
      if (!statuses[i].ok()) {
        if (!first) first = std::move(statuses[i]);
      } else if (!op.on_done.is_none()) {
        try {
          op.on_done();
          ++done;
        } catch (py::error_already_set& e) {
          if (!first_py) first_py = std::move(e);
        }
      } else {
        ++done;
      }
      op.on_done = py::none();
      op.keep = py::none();  // the I/O is over: the caller's buffers may go
    }
    {
      py::gil_scoped_release nogil;
      ops_.finished(numbers);
      ops_.wait_finished(claim.upto);
    }
    if (first) throw IoError(*first);
    if (first_py) throw std::move(*first_py);
    return done;
  }

 private:
  struct Op {
    swap::IoOp op = swap::IoOp::kRead;
    std::unique_ptr<swap::File> file;
    swap::FileId id;
    swap::IoTicket ticket;
    std::byte* data = nullptr;     // the caller's buffer
    AlignedBytes bounce;           // set when the caller's buffer cannot take direct I/O
    std::uint64_t bytes = 0;
    std::uint64_t offset = 0;
    bool validate = false;
    py::object keep = py::none();     // alive until the operation is complete
    py::object on_done = py::none();  // None, or called once the operation succeeded
  };

  // Opens the caller's path, or a second descriptor of the caller's open file.
  static std::unique_ptr<swap::File> open_target(swap::IoOp kind, const Target& target,
                                                 std::uintptr_t address, std::uint64_t bytes,
                                                 std::uint64_t offset, bool validate) {
    if (target.fd) {  // File::from_descriptor refuses a negative one
      return std::make_unique<swap::File>(swap::File::from_descriptor(
          *target.fd, kind == swap::IoOp::kRead || validate, kind == swap::IoOp::kWrite));
    }
    swap::FileOptions fo;
    fo.read_only = kind == swap::IoOp::kRead;
    fo.create = kind == swap::IoOp::kWrite;
    fo.direct = aligned(address, kDirectAlign) && aligned(bytes, kDirectAlign) &&
                aligned(offset, kDirectAlign);
    auto file = std::make_unique<swap::File>(swap::File::open(target.path, fo));
    if (file->is_direct() &&
        !(aligned(address, file->alignment()) && aligned(bytes, file->alignment()) &&
          aligned(offset, file->alignment()))) {
      fo.direct = false;  // the device wants a coarser alignment than 4096
      fo.create = false;  // created by the first open
      file = std::make_unique<swap::File>(swap::File::open(target.path, fo));
    }
    return file;
  }

  // A write that extends the file: its blocks are allocated in one call first, as zinf's own
  // swap files are (extending direct writes are otherwise allocated piece by piece as they
  // land), and a full drive fails here, naming the range, before any byte is written.
  static void reserve_extent(const swap::File& file, std::uint64_t offset, std::uint64_t bytes) {
    if (bytes == 0) return;
    struct stat st {};
    if (::fstat(file.fd(), &st) != 0 || !S_ISREG(st.st_mode)) return;
    if (offset + bytes <= static_cast<std::uint64_t>(st.st_size)) return;
    (void)file.reserve(offset, bytes, "aio_handle write (allocate)");  // no fallocate: as is
  }

  int submit(swap::IoOp kind, std::uintptr_t address, std::uint64_t bytes, const Target& target,
             bool validate, bool async, std::uint64_t offset, py::object keep, py::object on_done) {
    const char* what = kind == swap::IoOp::kRead ? "aio_handle read" : "aio_handle write";
    if (address == 0 && bytes > 0) throw UsageError(std::string(what) + ": null buffer");
    if (kind == swap::IoOp::kWrite && target.fd) {
      // Linux's pwrite on an O_APPEND descriptor writes at the end of the file whatever the
      // offset: the bytes would land elsewhere than asked, reported as success.
      const int fl = ::fcntl(*target.fd, F_GETFL);
      if (fl >= 0 && (fl & O_APPEND) != 0) {
        throw UsageError(std::string(what) + ": descriptor " + std::to_string(*target.fd) +
                         " has O_APPEND, which writes at the end of the file, not at "
                         "file_offset=" +
                         std::to_string(offset) + ": open it without O_APPEND");
      }
    }
    Op op;
    op.op = kind;
    op.data = reinterpret_cast<std::byte*>(address);
    op.bytes = bytes;
    op.offset = offset;
    op.validate = validate;
    op.file = open_target(kind, target, address, bytes, offset, validate);
    const std::string& path = op.file->path();
    std::byte* io_buffer = op.data;
    if (op.file->is_direct()) {  // only a caller's O_DIRECT descriptor can be misaligned here
      const std::uint64_t a = op.file->alignment();
      if (!aligned(offset, a) || !aligned(bytes, a)) {
        throw IoError(Status::error(ErrorCode::kInvalidArgument,
                                    "the descriptor has O_DIRECT, which needs the offset and the "
                                    "length to be multiples of " + std::to_string(a))
                          .with_operation(what)
                          .with_path(path)
                          .with_range(offset, bytes));
      }
      if (!aligned(address, a)) {
        op.bounce = aligned_bytes(bytes, a);
        if (kind == swap::IoOp::kWrite && bytes > 0) std::memcpy(op.bounce.get(), op.data, bytes);
        io_buffer = op.bounce.get();
      }
    }
    if (kind == swap::IoOp::kWrite) reserve_extent(*op.file, offset, bytes);
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
      const swap::IoRequest req{kind, op.id, offset, std::span<std::byte>(io_buffer, bytes)};
      op.ticket = engine_->submit(std::span<const swap::IoRequest>(&req, 1));
    } catch (...) {
      engine_->detach(op.id);
      throw;
    }
    if (async) {
      op.keep = std::move(keep);
      op.on_done = std::move(on_done);
      ops_.add(std::move(op));
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
    if (s.ok() && op.bounce && op.op == swap::IoOp::kRead && op.bytes > 0) {
      std::memcpy(op.data, op.bounce.get(), op.bytes);
    }
    if (s.ok() && op.validate) s = compare_with_file(op);
    engine_->detach(op.id);
    const Status closed = op.file->close();
    if (s.ok()) s = closed;
    return s;
  }

  // Reads the range back through the operation's own descriptor (no second lookup of a path),
  // into a buffer aligned for it.
  static Status compare_with_file(const Op& op) {
    const AlignedBytes check = aligned_bytes(op.bytes, std::max<std::uint64_t>(kDirectAlign, op.file->alignment()));
    std::uint64_t got = 0;
    while (got < op.bytes) {
      const ssize_t n = ::pread(op.file->fd(), check.get() + got, op.bytes - got,
                                static_cast<off_t>(op.offset + got));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        return Status::from_errno(errno, "aio_handle validate", op.file->path())
            .with_range(op.offset, op.bytes);
      }
      if (n == 0) break;
      got += static_cast<std::uint64_t>(n);
    }
    if (got != op.bytes || std::memcmp(check.get(), op.data, op.bytes) != 0) {
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
  InflightOps<Op> ops_;
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
           "async_op"_a, "file_offset"_a, "keep"_a = py::none(), "on_done"_a = py::none())
      .def("pwrite", &AioHandle::pwrite, "address"_a, "nbytes"_a, "filename"_a, "validate"_a,
           "async_op"_a, "file_offset"_a, "keep"_a = py::none(), "on_done"_a = py::none())
      .def("get_alignment", &AioHandle::get_alignment)
      .def("pread_fd", &AioHandle::pread_fd, "address"_a, "nbytes"_a, "fd"_a, "validate"_a,
           "async_op"_a, "file_offset"_a, "keep"_a = py::none(), "on_done"_a = py::none())
      .def("pwrite_fd", &AioHandle::pwrite_fd, "address"_a, "nbytes"_a, "fd"_a, "validate"_a,
           "async_op"_a, "file_offset"_a, "keep"_a = py::none(), "on_done"_a = py::none())
      .def("wait", &AioHandle::wait);
}

}  // namespace zinf::python
