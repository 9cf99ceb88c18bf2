// SPDX-License-Identifier: Apache-2.0
// SwapStore: the striped address space over one preallocated file per directory, the key ->
// extents table, and the swap operations: validation and same-key conflict checks under the
// store lock, then engine batches whose completions verify checksums and commit the key's new
// state before the caller's ticket completes.
#include "zinf/swap/swap_store.h"

#include <sys/stat.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>

#include "range_allocator.h"
#include "ticket_state.h"
#include "zinf/common/align.h"
#include "zinf/common/check.h"
#include "zinf/common/error.h"
#include "zinf/common/log.h"
#include "zinf/swap/buffer_pool.h"
#include "zinf/swap/crc32c.h"
#include "zinf/swap/dir.h"
#include "zinf/swap/file.h"

namespace zinf::swap {
namespace {

constexpr std::uint32_t kMinAlignment = 4096;
// precondition() writes zeros from one buffer of this size, shared by all its requests (writes
// only read it). 8 MiB: 8 engine pieces of the default 1 MiB block per request.
constexpr std::uint64_t kPreconditionChunk = 8ull << 20;

std::string hex32(std::uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

// Byte ranges [begin, end) as a sorted, merged list: which parts of a tensor hold swapped-out
// data. Typical tensors are written whole, so this is one entry.
class ByteRanges {
 public:
  void add(std::uint64_t begin, std::uint64_t end) {
    std::vector<std::pair<std::uint64_t, std::uint64_t>> out;
    out.reserve(ranges_.size() + 1);
    bool placed = false;
    for (auto r : ranges_) {
      if (r.second < begin) {
        out.push_back(r);
      } else if (end < r.first) {
        if (!placed) out.emplace_back(begin, end);
        placed = true;
        out.push_back(r);
      } else {
        begin = std::min(begin, r.first);
        end = std::max(end, r.second);
      }
    }
    if (!placed) out.emplace_back(begin, end);
    ranges_ = std::move(out);
  }
  bool covers(std::uint64_t begin, std::uint64_t end) const {
    for (auto r : ranges_) {
      if (r.first <= begin && end <= r.second) return true;
    }
    return false;
  }

 private:
  std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges_;
};

// A run of the store's address space holding tensor bytes [tensor_offset, + length).
struct Extent {
  std::uint64_t tensor_offset = 0;
  std::uint64_t address = 0;
  std::uint64_t length = 0;
};

// A contiguous part of a transfer on one file.
struct FilePiece {
  std::uint32_t file = 0;
  std::uint64_t file_offset = 0;
  std::uint64_t length = 0;
  std::uint64_t buffer_offset = 0;  // from the start of the transfer's buffer
};

struct InFlight {
  std::uint64_t id = 0;
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
  bool write = false;
};

struct Tensor {
  std::uint64_t bytes = 0;
  std::uint64_t padded = 0;
  std::vector<Extent> extents;
  std::vector<std::uint32_t> crcs;  // per stripe unit of the tensor (checksums only)
  ByteRanges written;               // padded tensor bytes that hold swapped-out data
  std::vector<InFlight> in_flight;
  std::optional<Status> lost;  // the failure of the last swap_out, until a whole rewrite
};

}  // namespace

struct SwapStore::Impl {
  Impl(const SwapStoreOptions& o, IoEngine& e) : options(o), engine(e) {}

  struct Op;

  SwapStoreOptions options;
  IoEngine& engine;
  std::uint32_t alignment = kMinAlignment;
  std::uint32_t stripe = 0;
  std::uint32_t file_count = 0;
  std::uint64_t file_bytes = 0;
  std::uint64_t capacity = 0;
  std::string where;  // the directories, for errors that concern the whole store

  std::vector<File> files;
  std::vector<FileId> ids;
  std::vector<std::string> paths;

  mutable std::mutex mu;
  std::condition_variable idle;
  std::optional<detail::RangeAllocator> space;      // in alignment blocks; guarded by mu
  std::unordered_map<std::string, Tensor> tensors;  // guarded by mu
  std::uint64_t ops_in_flight = 0;                  // guarded by mu
  std::uint64_t next_op_id = 1;                     // guarded by mu
  bool any_swap_out = false;                        // guarded by mu
  bool closed = false;                              // guarded by mu

  std::atomic<std::uint64_t> swaps_out{0};
  std::atomic<std::uint64_t> swaps_in{0};
  std::atomic<std::uint64_t> bytes_out{0};
  std::atomic<std::uint64_t> bytes_in{0};
  std::atomic<std::uint64_t> checksum_failures{0};
  std::atomic<std::uint64_t> failures{0};

  // Verifies swap_in checksums off the engine's threads (options.verify_threads > 0).
  // Declared last, after everything its work touches, so it is joined first on destruction;
  // close() has already waited for every swap, so it is idle by then.
  std::optional<boost::asio::thread_pool> verifier;

  void check_open() const {
    if (closed) throw UsageError("SwapStore: used after close()");
  }

  Tensor& find(const std::string& key, const char* op) {
    auto it = tensors.find(key);
    if (it == tensors.end()) {
      throw UsageError(std::string("SwapStore::") + op + ": unknown key '" + key + "'");
    }
    return it->second;
  }

  // Appends the file pieces of padded tensor bytes [begin, end) to `out`, buffer offsets
  // counted from `buffer_base` (the tensor offset where the transfer's buffer starts). Pieces
  // split at stripe boundaries and merge when they continue one another in one file and in
  // the buffer (always, with a single file).
  void map_range(const Tensor& t, std::uint64_t begin, std::uint64_t end, std::uint64_t buffer_base,
                 std::vector<FilePiece>& out) const {
    for (const Extent& e : t.extents) {
      std::uint64_t lo = std::max(begin, e.tensor_offset);
      const std::uint64_t hi = std::min(end, e.tensor_offset + e.length);
      std::uint64_t address = e.address + (lo - e.tensor_offset);
      while (lo < hi) {
        const std::uint64_t slot = address / stripe;
        const std::uint64_t within = address % stripe;
        const std::uint64_t n = std::min(hi - lo, stripe - within);
        FilePiece p{static_cast<std::uint32_t>(slot % file_count),
                    slot / file_count * stripe + within, n, lo - buffer_base};
        if (!out.empty()) {
          FilePiece& prev = out.back();
          if (prev.file == p.file && prev.file_offset + prev.length == p.file_offset &&
              prev.buffer_offset + prev.length == p.buffer_offset) {
            prev.length += n;
            p.length = 0;
          }
        }
        if (p.length > 0) out.push_back(p);
        lo += n;
        address += n;
      }
    }
  }

  // Checks a transfer's range and buffer under the rules of swap_store.h and returns the
  // padded end of the range.
  std::uint64_t check_range(const std::string& key, const Tensor& t, std::uint64_t offset,
                            std::uint64_t length, const std::byte* data, std::size_t size,
                            const char* op) const {
    auto fail = [&](const std::string& why) {
      throw UsageError(std::string("SwapStore::") + op + " of key '" + key + "' offset=" +
                       std::to_string(offset) + " length=" + std::to_string(length) + ": " + why);
    };
    if (length == 0) fail("length is 0");
    if (offset > t.bytes || length > t.bytes - offset) {
      fail("range ends past the tensor's " + std::to_string(t.bytes) + " bytes");
    }
    const bool to_end = offset + length == t.bytes;
    if (offset % alignment != 0) fail("offset is not a multiple of " + std::to_string(alignment));
    if (!to_end && length % alignment != 0) {
      fail("length is not a multiple of " + std::to_string(alignment) +
           " and the range does not end at the tensor's end");
    }
    if (options.checksums) {
      if (offset % stripe != 0 || (!to_end && (offset + length) % stripe != 0)) {
        fail("with checksums a range must cover whole stripe units of " + std::to_string(stripe) +
             " bytes (or end at the tensor's end)");
      }
    }
    const std::uint64_t padded = align_up(length, alignment);
    if (reinterpret_cast<std::uintptr_t>(data) % alignment != 0) {
      fail("buffer is not aligned to " + std::to_string(alignment) + " bytes");
    }
    if (size < padded) {
      fail("buffer of " + std::to_string(size) + " bytes is shorter than the padded length " +
           std::to_string(padded));
    }
    return offset + padded;
  }

  // Caller-side checksums (swap_in_unchecked / swap_out_summed): `expected` receives a
  // read's stored unit CRCs, `sums` gives a write's; empty spans: the store checks and sums.
  struct CallerSums {
    std::span<std::uint32_t> expected;
    std::span<const std::uint32_t> sums;
    bool active() const noexcept { return !expected.empty() || !sums.empty(); }
  };
  IoTicket swap(const std::string& key, bool write, bool whole, std::uint64_t offset,
                std::uint64_t length, std::byte* data, std::size_t size, IoCallback on_complete,
                CallerSums caller = {});

  // The corruption error of stripe unit `unit` (tensor bytes [unit_offset, + unit_length),
  // stored at `pieces`): one text for the store's own verification and the caller's.
  Status corrupt_status(const std::string& operation, const std::vector<FilePiece>& pieces,
                        std::uint64_t unit, std::uint64_t unit_offset, std::uint64_t unit_length,
                        std::uint32_t written, std::uint32_t read) const;

  void commit(Op& op, const Status& status) noexcept;
  Status close_files();
};

// One swap_out or swap_in. Shared by the submitting thread and the engine callbacks of its
// batches; the last of them to finish (see arrive) commits the result and completes `ticket`.
struct SwapStore::Impl::Op {
  Impl* store = nullptr;
  std::string key;
  std::uint64_t id = 0;
  bool write = false;
  bool whole = false;
  std::uint64_t begin = 0;  // padded tensor range
  std::uint64_t end = 0;
  std::byte* buffer = nullptr;
  std::shared_ptr<detail::TicketState> ticket = std::make_shared<detail::TicketState>();
  // Holds: one per batch, one per unit whose swap_out checksum is being computed, plus one for
  // the submitter until it has submitted everything.
  std::atomic<std::int64_t> pending{1};
  std::vector<IoTicket> batches;
  // Checksums: the first stripe unit of the range, the CRC per unit (a swap_out's computed
  // ones, a swap_in's expected ones) and each unit's pieces (for error text).
  std::uint64_t first_unit = 0;
  std::vector<std::uint32_t> crcs;
  std::vector<std::vector<FilePiece>> unit_pieces;
  // The caller verifies this swap_in's units, or has summed this swap_out's (CallerSums).
  bool caller_sums = false;

  std::string what() const {
    return std::string(write ? "swap_out" : "swap_in") + " of key '" + key + "'";
  }
  // Checks unit i of a swap_in against its stored CRC32C; records kCorrupt on a mismatch.
  void verify_unit(std::size_t i) noexcept;
  // Computes unit i's CRC32C for a swap_out (into crcs[i]).
  void sum_unit(std::size_t i) noexcept;
  void arrive() noexcept;
};

void SwapStore::Impl::Op::verify_unit(std::size_t i) noexcept {
  const std::uint64_t unit_offset = (first_unit + i) * store->stripe;
  const std::uint64_t unit_length = std::min(end, unit_offset + store->stripe) - unit_offset;
  const std::uint32_t found =
      crc32c(std::span<const std::byte>(buffer + (unit_offset - begin), unit_length));
  if (found == crcs[i]) return;
  store->checksum_failures.fetch_add(1, std::memory_order_relaxed);
  try {
    ticket->record_failure(store->corrupt_status(what(), unit_pieces[i], first_unit + i,
                                                 unit_offset, unit_length, crcs[i], found));
  } catch (...) {
    // Building the text failed (out of memory): the failure itself must still be recorded.
    ticket->record_failure(Status::error(ErrorCode::kCorrupt, "checksum mismatch"));
  }
}

Status SwapStore::Impl::corrupt_status(const std::string& operation,
                                       const std::vector<FilePiece>& pieces, std::uint64_t unit,
                                       std::uint64_t unit_offset, std::uint64_t unit_length,
                                       std::uint32_t written, std::uint32_t read) const {
  std::string where_stored;
  for (const FilePiece& p : pieces) {
    where_stored += (where_stored.empty() ? "" : ", ") + paths[p.file] +
                    " offset=" + std::to_string(p.file_offset) +
                    " length=" + std::to_string(p.length);
  }
  const FilePiece& first = pieces.front();
  return Status::error(ErrorCode::kCorrupt,
                       "checksum mismatch in stripe unit " + std::to_string(unit) +
                           " (tensor offset " + std::to_string(unit_offset) + " length " +
                           std::to_string(unit_length) + ", stored at " + where_stored +
                           "): crc32c written " + hex32(written) + ", read " + hex32(read))
      .with_operation(operation)
      .with_path(paths[first.file])
      .with_range(first.file_offset, unit_length);
}

void SwapStore::Impl::Op::sum_unit(std::size_t i) noexcept {
  const std::uint64_t unit_offset = (first_unit + i) * store->stripe;
  const std::uint64_t unit_length = std::min(end, unit_offset + store->stripe) - unit_offset;
  crcs[i] = crc32c(std::span<const std::byte>(buffer + (unit_offset - begin), unit_length));
}

void SwapStore::Impl::Op::arrive() noexcept {
  if (pending.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  // Last one in: every batch has completed and the submitter is done with `batches`/`crcs`.
  Status status;
  {
    std::lock_guard lock(ticket->mu);
    status = ticket->status;
  }
  std::uint64_t moved = 0;
  for (const IoTicket& t : batches) moved += t.bytes_done();
  store->commit(*this, status);  // the store may be gone after this returns
  ticket->bytes_done.store(moved, std::memory_order_relaxed);
  ticket->complete();
}

// Commits a finished swap to the key's state and lets close() proceed once nothing is in
// flight. Runs on an engine thread or the submitter; never throws (callers are noexcept).
void SwapStore::Impl::commit(Op& op, const Status& status) noexcept {
  const std::uint64_t bytes = op.end - op.begin;
  if (status.ok()) {
    (op.write ? swaps_out : swaps_in).fetch_add(1, std::memory_order_relaxed);
    (op.write ? bytes_out : bytes_in).fetch_add(bytes, std::memory_order_relaxed);
  } else {
    failures.fetch_add(1, std::memory_order_relaxed);
  }
  std::lock_guard lock(mu);
  auto it = tensors.find(op.key);
  ZINF_CHECK(it != tensors.end(), "SwapStore: a key was released with a swap in flight");
  Tensor& t = it->second;
  std::erase_if(t.in_flight, [&](const InFlight& f) { return f.id == op.id; });
  if (op.write) {
    try {
      if (status.ok()) {
        t.written.add(op.begin, op.end);
        if (options.checksums) {
          std::copy(op.crcs.begin(), op.crcs.end(),
                    t.crcs.begin() + static_cast<std::ptrdiff_t>(op.first_unit));
        }
        if (op.whole) t.lost.reset();
      } else {
        t.lost = status;
      }
    } catch (...) {
      // Only ByteRanges::add can throw (bad_alloc): treat the key as lost rather than guess.
      t.lost = Status::error(ErrorCode::kResource, "out of memory recording the swap_out")
                   .with_operation(op.what());
    }
  }
  if (--ops_in_flight == 0) idle.notify_all();
}

IoTicket SwapStore::Impl::swap(const std::string& key, bool write, bool whole, std::uint64_t offset,
                               std::uint64_t length, std::byte* data, std::size_t size,
                               IoCallback on_complete, CallerSums caller) {
  const char* op_name = caller.active() ? (write ? "swap_out_summed" : "swap_in_unchecked")
                        : write         ? (whole ? "swap_out" : "swap_out_range")
                                        : (whole ? "swap_in" : "swap_in_range");
  auto op = std::make_shared<Op>();
  op->store = this;
  op->key = key;
  op->write = write;
  op->whole = whole;
  op->buffer = data;
  op->caller_sums = caller.active();
  op->ticket->callback = std::move(on_complete);

  // Phase 1, under the lock: validate, check same-key conflicts, register the swap, and cut
  // the transfer into batches (one per stripe unit with checksums, so each unit is verified
  // as soon as it lands; else one).
  std::vector<std::vector<IoRequest>> batches;
  {
    std::lock_guard lock(mu);
    check_open();
    Tensor& t = find(key, op_name);
    if (whole) length = t.bytes;
    op->begin = offset;
    op->end = check_range(key, t, offset, length, data, size, op_name);
    for (const InFlight& f : t.in_flight) {
      if ((write || f.write) && f.begin < op->end && op->begin < f.end) {
        throw UsageError(std::string("SwapStore::") + op_name + " of key '" + key + "' bytes [" +
                         std::to_string(op->begin) + ", " + std::to_string(op->end) +
                         ") overlaps a " + (f.write ? "swap_out" : "swap_in") +
                         " of that key still in flight");
      }
    }
    if (!write) {
      if (t.lost) throw EngineFailed(*t.lost);
      if (!t.written.covers(op->begin, op->end)) {
        throw UsageError(std::string("SwapStore::") + op_name + " of key '" + key + "' bytes [" +
                         std::to_string(op->begin) + ", " + std::to_string(op->end) +
                         ") were never swapped out");
      }
    }
    auto to_requests = [&](const std::vector<FilePiece>& pieces) {
      std::vector<IoRequest> reqs;
      reqs.reserve(pieces.size());
      for (const FilePiece& p : pieces) {
        reqs.push_back(IoRequest{write ? IoOp::kWrite : IoOp::kRead, ids[p.file], p.file_offset,
                                 std::span<std::byte>(data + p.buffer_offset, p.length)});
      }
      return reqs;
    };
    if (caller.active()) {
      // Whole tensors only (the public calls); one unit count for the caller's span.
      if (!options.checksums) {
        throw UsageError(std::string("SwapStore::") + op_name + " of key '" + key +
                         "': the store keeps no checksums (SwapStoreOptions::checksums)");
      }
      const std::size_t units = t.crcs.size();
      const std::size_t given = write ? caller.sums.size() : caller.expected.size();
      if (given != units) {
        throw UsageError(std::string("SwapStore::") + op_name + " of key '" + key + "': " +
                         std::to_string(given) + " unit checksums given for its " +
                         std::to_string(units) + " stripe units");
      }
      // One batch, as without checksums: nothing waits for a unit to land.
      std::vector<FilePiece> pieces;
      map_range(t, op->begin, op->end, op->begin, pieces);
      batches.push_back(to_requests(pieces));
      if (write) {
        op->crcs.assign(caller.sums.begin(), caller.sums.end());
      } else {
        std::copy(t.crcs.begin(), t.crcs.end(), caller.expected.begin());
      }
    } else if (options.checksums) {
      op->first_unit = op->begin / stripe;
      for (std::uint64_t u = op->first_unit; u * stripe < op->end; ++u) {
        std::vector<FilePiece> pieces;
        map_range(t, u * stripe, std::min(op->end, (u + 1) * stripe), op->begin, pieces);
        batches.push_back(to_requests(pieces));
        op->unit_pieces.push_back(std::move(pieces));
        if (!write) op->crcs.push_back(t.crcs[u]);
      }
    } else {
      std::vector<FilePiece> pieces;
      map_range(t, op->begin, op->end, op->begin, pieces);
      batches.push_back(to_requests(pieces));
    }
    op->id = next_op_id++;
    t.in_flight.push_back(InFlight{op->id, op->begin, op->end, write});
    if (write) any_swap_out = true;
    ++ops_in_flight;
  }

  // Phase 2, unlocked (a callback may run inline and take the lock): submit. A batch's
  // callback records its failure, verifies a swap_in unit's CRC32C, and arrives.
  op->pending.store(static_cast<std::int64_t>(batches.size()) + 1, std::memory_order_relaxed);
  op->batches.reserve(batches.size());
  std::size_t submitted = 0;
  try {
    for (std::size_t i = 0; i < batches.size(); ++i) {
      op->batches.push_back(engine.submit(batches[i], [op, i](const Status& s) {
        Op& o = *op;
        if (!s.ok()) {
          o.ticket->record_failure(Status(s).with_operation(o.what() + ": " + s.operation()));
        } else if (!o.write && o.store->options.checksums && !o.caller_sums) {
          if (o.store->verifier) {
            // A hold for this thread while it is inside post(): the verify thread may finish
            // the unit, and with it the op, before post() returns, and the last op's end lets
            // close() destroy the pool that post() is still signalling.
            o.pending.fetch_add(1, std::memory_order_relaxed);
            try {
              boost::asio::post(*o.store->verifier, [op, i] {
                op->verify_unit(i);
                op->arrive();
              });
              o.arrive();  // this thread's hold
              return;
            } catch (...) {
              // Could not queue (out of memory): verify here rather than skip it.
              o.arrive();
            }
          }
          o.verify_unit(i);
        }
        o.arrive();
      }));
      ++submitted;
    }
  } catch (const std::exception& e) {
    if (submitted == 0) {
      // Nothing started: undo the registration and report to the caller directly.
      std::lock_guard lock(mu);
      Tensor& t = tensors.at(key);
      std::erase_if(t.in_flight, [&](const InFlight& f) { return f.id == op->id; });
      if (--ops_in_flight == 0) idle.notify_all();
      throw;
    }
    // Some batches are running on the caller's buffer: the ticket must cover them, so the
    // failure travels in it rather than as an exception that would let the buffer go.
    op->ticket->record_failure(Status::error(ErrorCode::kIo, e.what()).with_operation(op->what()));
    op->pending.fetch_sub(static_cast<std::int64_t>(batches.size() - submitted),
                          std::memory_order_acq_rel);
  }
  if (write && options.checksums && !op->caller_sums) {
    // Overlaps the writes already in flight (they only read the buffer). On the verify
    // threads, one task per unit, each holding the op like a batch: the submitter (the
    // optimizer's pipeline thread, between two Adam updates) returns at once instead of
    // spending a CRC pass per swap_out, and the units are summed in parallel while the data
    // just written by the caller is still in cache. Measured with `zinf bench step`
    // (docs/benchmarks.md).
    const std::uint64_t units = op->unit_pieces.size();
    op->crcs.resize(units);
    for (std::uint64_t i = 0; i < units; ++i) {
      op->pending.fetch_add(1, std::memory_order_relaxed);  // the submitter's hold is still on
      if (verifier) {
        try {
          boost::asio::post(*verifier, [op, i] {
            op->sum_unit(i);
            op->arrive();
          });
          continue;
        } catch (...) {
          // Could not queue (out of memory): sum it here rather than skip it.
        }
      }
      op->sum_unit(i);
      op->arrive();
    }
  }
  IoTicket ticket(op->ticket);
  op->arrive();
  return ticket;
}

Status SwapStore::Impl::close_files() {
  Status first;
  for (std::size_t i = 0; i < files.size(); ++i) {
    if (i < ids.size() && ids[i].valid()) {
      try {
        engine.detach(ids[i]);
      } catch (const std::exception& e) {
        if (first.ok()) {
          first =
              Status::error(ErrorCode::kIo, e.what()).with_operation("detach").with_path(paths[i]);
        }
      }
    }
    // The files have no name: closing the last descriptor frees their space.
    Status s = files[i].close();
    if (!s.ok() && first.ok()) first = s;
  }
  files.clear();
  ids.clear();
  return first;
}

SwapStore::SwapStore(const SwapStoreOptions& options, IoEngine& engine)
    : impl_(std::make_unique<Impl>(options, engine)) {
  Impl& s = *impl_;
  const auto& dirs = options.directories;
  if (dirs.empty()) throw UsageError("SwapStore: no directories given");
  if (options.capacity_bytes == 0) throw UsageError("SwapStore: capacity_bytes is 0");
  if (options.stripe_bytes == 0) throw UsageError("SwapStore: stripe_bytes is 0");
  for (const auto& d : dirs) s.where += (s.where.empty() ? "" : ",") + d;

  // Each directory is opened once; its file is created relative to that descriptor, so a
  // directory renamed or replaced by a link meanwhile cannot redirect it.
  std::vector<Dir> opened;
  opened.reserve(dirs.size());
  for (const auto& d : dirs) opened.push_back(Dir::open(d));

  // Alignment before anything is created, so a bad stripe size fails cleanly.
  s.alignment = kMinAlignment;
  if (options.direct_io) {
    for (const Dir& d : opened) s.alignment = std::max(s.alignment, probe_direct_io_alignment(d));
  }
  auto check_stripe = [&] {
    if (options.stripe_bytes % s.alignment != 0) {
      throw UsageError("SwapStore: stripe_bytes=" + std::to_string(options.stripe_bytes) +
                       " is not a multiple of the alignment " + std::to_string(s.alignment));
    }
  };
  check_stripe();
  s.stripe = options.stripe_bytes;
  s.file_count = static_cast<std::uint32_t>(dirs.size());
  const std::uint64_t row = std::uint64_t{s.stripe} * s.file_count;
  s.file_bytes = (options.capacity_bytes + row - 1) / row * s.stripe;
  s.capacity = s.file_bytes * s.file_count;

  // Free space, summed per file system: three directories on one drive need three files' room.
  struct Fs {
    std::string first_dir;
    std::uint64_t needed = 0;
    std::uint64_t free = 0;
    std::size_t files = 0;
  };
  std::map<dev_t, Fs> filesystems;
  const auto measure = [&] {
    filesystems.clear();
    for (const Dir& d : opened) {
      struct statvfs vfs {};
      struct stat st {};
      if (::fstat(d.fd(), &st) != 0 || ::fstatvfs(d.fd(), &vfs) != 0) {
        const int err = errno;
        throw IoError(Status::from_errno(err, "create swap store (statvfs)", d.path()));
      }
      Fs& fs = filesystems[st.st_dev];
      if (fs.files == 0) {
        fs.first_dir = d.path();
        fs.free = static_cast<std::uint64_t>(vfs.f_bavail) * vfs.f_frsize;
      }
      fs.needed += s.file_bytes;
      ++fs.files;
    }
    return std::all_of(filesystems.begin(), filesystems.end(),
                       [](const auto& kv) { return kv.second.needed <= kv.second.free; });
  };
  // A run killed just before this one (a restart) may still hold its unnamed swap files'
  // space for some milliseconds after it was reaped (io_uring drops its file references
  // late): wait a little for the space to come back before refusing.
  constexpr auto kSpaceWait = std::chrono::milliseconds(500);
  const auto space_deadline = std::chrono::steady_clock::now() + kSpaceWait;
  while (!measure() && std::chrono::steady_clock::now() < space_deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (const auto& [dev, fs] : filesystems) {
    if (fs.needed > fs.free) {
      std::string what =
          fs.files == 1 ? "its swap file"
                        : std::to_string(fs.files) + " swap files (directories on one file system)";
      throw IoError(Status::error(ErrorCode::kNoSpace,
                                  "needs " + std::to_string(fs.needed) + " bytes for " + what +
                                      " but only " + std::to_string(fs.free) +
                                      " bytes are free (after 0.5 s for the space of a process "
                                      "that just ended)")
                        .with_operation("create swap store")
                        .with_path(fs.first_dir));
    }
  }

  // Create, preallocate and attach. The files have no name (File::create_unnamed): nothing
  // planted in a directory can be opened in their place, no name can collide with a file a
  // killed process left (a restarted container reuses its pid), and a killed process leaves
  // nothing behind. The label only names them in messages; the sequence number tells the
  // stores of one process apart.
  static std::atomic<std::uint64_t> store_seq{0};
  const std::string stem = "zinf-swap-" + std::to_string(store_seq.fetch_add(1)) + ".";
  try {
    for (std::size_t i = 0; i < dirs.size(); ++i) {
      s.files.push_back(File::create_unnamed(
          opened[i], stem + std::to_string(i),
          FileOptions{.direct = options.direct_io, .preallocate_bytes = s.file_bytes}));
      s.paths.push_back(s.files.back().path());
      if (s.files.back().is_direct())
        s.alignment = std::max(s.alignment, s.files.back().alignment());
    }
    check_stripe();
    for (const File& f : s.files) s.ids.push_back(engine.attach(f));
  } catch (...) {
    for (FileId id : s.ids) engine.detach(id);
    s.ids.clear();
    s.files.clear();  // closes them, which frees their space
    throw;
  }
  s.space.emplace(s.capacity / s.alignment);
  // The same threads verify swap_ins and sum swap_outs.
  if (options.checksums && options.verify_threads > 0) s.verifier.emplace(options.verify_threads);
}

SwapStore::~SwapStore() {
  Status st = close();
  if (!st.ok()) log(LogLevel::kWarning, "SwapStore: " + st.to_string());
}

Status SwapStore::close() {
  Impl& s = *impl_;
  {
    std::unique_lock lock(s.mu);
    if (s.closed) return Status::ok_status();
    s.closed = true;
    s.idle.wait(lock, [&] { return s.ops_in_flight == 0; });
  }
  return s.close_files();
}

std::uint32_t SwapStore::alignment() const noexcept { return impl_->alignment; }
std::uint64_t SwapStore::padded_size(std::uint64_t bytes) const noexcept {
  return align_up(bytes, impl_->alignment);
}
std::uint32_t SwapStore::stripe_bytes() const noexcept { return impl_->stripe; }
bool SwapStore::checksums() const noexcept { return impl_->options.checksums; }
const std::vector<std::string>& SwapStore::file_paths() const noexcept { return impl_->paths; }

int SwapStore::file_descriptor(std::size_t index) const {
  const Impl& s = *impl_;
  std::lock_guard lock(s.mu);
  s.check_open();
  if (index >= s.files.size()) {
    throw UsageError("SwapStore::file_descriptor: no file " + std::to_string(index) +
                     " (the store has " + std::to_string(s.files.size()) + ")");
  }
  return s.files[index].fd();
}
std::uint64_t SwapStore::file_bytes() const noexcept { return impl_->file_bytes; }
std::uint64_t SwapStore::capacity_bytes() const noexcept { return impl_->capacity; }

std::uint64_t SwapStore::used_bytes() const {
  std::lock_guard lock(impl_->mu);
  return impl_->capacity - impl_->space->free_units() * impl_->alignment;
}

std::uint64_t SwapStore::free_bytes() const {
  std::lock_guard lock(impl_->mu);
  return impl_->space->free_units() * impl_->alignment;
}

SwapStoreStats SwapStore::stats() const {
  const Impl& s = *impl_;
  SwapStoreStats out;
  out.swaps_out = s.swaps_out.load(std::memory_order_relaxed);
  out.swaps_in = s.swaps_in.load(std::memory_order_relaxed);
  out.bytes_out = s.bytes_out.load(std::memory_order_relaxed);
  out.bytes_in = s.bytes_in.load(std::memory_order_relaxed);
  out.checksum_failures = s.checksum_failures.load(std::memory_order_relaxed);
  out.failures = s.failures.load(std::memory_order_relaxed);
  return out;
}

void SwapStore::allocate(const std::string& key, std::uint64_t bytes) {
  Impl& s = *impl_;
  std::lock_guard lock(s.mu);
  s.check_open();
  if (bytes == 0) throw UsageError("SwapStore::allocate: key '" + key + "' of 0 bytes");
  if (s.tensors.contains(key)) {
    throw UsageError("SwapStore::allocate: key '" + key + "' is already allocated");
  }
  // A size whose padding passes 2^64 is simply more than any store holds: "full" below.
  const std::uint64_t padded =
      checked_align_up(bytes, s.alignment).value_or(align_down(UINT64_MAX, s.alignment));
  const std::uint64_t blocks = padded / s.alignment;
  const std::uint64_t stripe_blocks = s.stripe / s.alignment;
  Tensor t;
  t.bytes = bytes;
  t.padded = padded;
  // One run where possible, starting on a stripe boundary for tensors of a stripe or more
  // (their units then map 1:1 onto file stripes); else any run; else scattered runs.
  std::optional<std::uint64_t> start;
  if (padded >= s.stripe) start = s.space->allocate(blocks, stripe_blocks);
  if (!start) start = s.space->allocate(blocks);
  if (start) {
    t.extents.push_back(Extent{0, *start * s.alignment, padded});
  } else if (auto runs = s.space->allocate_scattered(blocks)) {
    std::uint64_t at = 0;
    for (const detail::UnitRange& r : *runs) {
      t.extents.push_back(Extent{at, r.start * s.alignment, r.length * s.alignment});
      at += r.length * s.alignment;
    }
  } else {
    throw IoError(
        Status::error(ErrorCode::kNoSpace, "swap store is full: key '" + key + "' needs " +
                                               std::to_string(bytes) + " bytes (" +
                                               std::to_string(padded) + " padded), " +
                                               std::to_string(s.space->free_units() * s.alignment) +
                                               " bytes free of " + std::to_string(s.capacity))
            .with_operation("allocate")
            .with_path(s.where));
  }
  const std::vector<Extent> taken = t.extents;
  try {
    if (s.options.checksums) t.crcs.assign((padded + s.stripe - 1) / s.stripe, 0);
    s.tensors.emplace(key, std::move(t));
  } catch (...) {
    for (const Extent& e : taken) s.space->free(e.address / s.alignment, e.length / s.alignment);
    throw;
  }
}

void SwapStore::release(const std::string& key) {
  Impl& s = *impl_;
  std::lock_guard lock(s.mu);
  s.check_open();
  Tensor& t = s.find(key, "release");
  if (!t.in_flight.empty()) {
    throw UsageError("SwapStore::release: key '" + key + "' has a swap in flight");
  }
  for (const Extent& e : t.extents) s.space->free(e.address / s.alignment, e.length / s.alignment);
  s.tensors.erase(key);
}

bool SwapStore::contains(const std::string& key) const {
  std::lock_guard lock(impl_->mu);
  return impl_->tensors.contains(key);
}

std::uint64_t SwapStore::size_of(const std::string& key) const {
  std::lock_guard lock(impl_->mu);
  return impl_->find(key, "size_of").bytes;
}

IoTicket SwapStore::swap_out(const std::string& key, std::span<const std::byte> buffer,
                             IoCallback on_complete) {
  // Writes only read the buffer; the engine's request type is mutable for reads' sake.
  return impl_->swap(key, true, true, 0, 0, const_cast<std::byte*>(buffer.data()), buffer.size(),
                     std::move(on_complete));
}

IoTicket SwapStore::swap_in(const std::string& key, std::span<std::byte> buffer,
                            IoCallback on_complete) {
  return impl_->swap(key, false, true, 0, 0, buffer.data(), buffer.size(), std::move(on_complete));
}

IoTicket SwapStore::swap_out_range(const std::string& key, std::uint64_t offset,
                                   std::uint64_t length, std::span<const std::byte> buffer,
                                   IoCallback on_complete) {
  return impl_->swap(key, true, false, offset, length, const_cast<std::byte*>(buffer.data()),
                     buffer.size(), std::move(on_complete));
}

IoTicket SwapStore::swap_in_range(const std::string& key, std::uint64_t offset,
                                  std::uint64_t length, std::span<std::byte> buffer,
                                  IoCallback on_complete) {
  return impl_->swap(key, false, false, offset, length, buffer.data(), buffer.size(),
                     std::move(on_complete));
}

IoTicket SwapStore::swap_in_unchecked(const std::string& key, std::span<std::byte> buffer,
                                      std::span<std::uint32_t> expected, IoCallback on_complete) {
  if (expected.empty()) throw UsageError("SwapStore::swap_in_unchecked: no span for the sums");
  return impl_->swap(key, false, true, 0, 0, buffer.data(), buffer.size(), std::move(on_complete),
                     Impl::CallerSums{expected, {}});
}

IoTicket SwapStore::swap_out_summed(const std::string& key, std::span<const std::byte> buffer,
                                    std::span<const std::uint32_t> sums, IoCallback on_complete) {
  if (sums.empty()) throw UsageError("SwapStore::swap_out_summed: no unit checksums given");
  return impl_->swap(key, true, true, 0, 0, const_cast<std::byte*>(buffer.data()), buffer.size(),
                     std::move(on_complete), Impl::CallerSums{{}, sums});
}

std::uint64_t SwapStore::unit_count(const std::string& key) const {
  std::lock_guard lock(impl_->mu);
  const Impl& s = *impl_;
  auto it = s.tensors.find(key);
  if (it == s.tensors.end()) throw UsageError("SwapStore::unit_count: unknown key '" + key + "'");
  return (it->second.padded + s.stripe - 1) / s.stripe;
}

Status SwapStore::checksum_error(const std::string& key, std::uint64_t unit,
                                 std::uint32_t expected, std::uint32_t found) {
  Impl& s = *impl_;
  std::vector<FilePiece> pieces;
  std::uint64_t unit_offset = 0;
  std::uint64_t unit_length = 0;
  {
    std::lock_guard lock(s.mu);
    s.check_open();
    const Tensor& t = s.find(key, "checksum_error");
    unit_offset = unit * s.stripe;
    if (unit_offset >= t.padded) {
      throw UsageError("SwapStore::checksum_error: key '" + key + "' has no stripe unit " +
                       std::to_string(unit));
    }
    unit_length = std::min(t.padded, unit_offset + s.stripe) - unit_offset;
    s.map_range(t, unit_offset, unit_offset + unit_length, unit_offset, pieces);
  }
  s.checksum_failures.fetch_add(1, std::memory_order_relaxed);
  return s.corrupt_status("swap_in of key '" + key + "'", pieces, unit, unit_offset, unit_length,
                          expected, found);
}

StoredTensor SwapStore::locate(const std::string& key) const {
  const Impl& s = *impl_;
  std::lock_guard lock(s.mu);
  s.check_open();
  auto it = s.tensors.find(key);
  if (it == s.tensors.end()) throw UsageError("SwapStore::locate: unknown key '" + key + "'");
  const Tensor& t = it->second;
  for (const InFlight& f : t.in_flight) {
    if (f.write) throw UsageError("SwapStore::locate: key '" + key + "' has a swap_out in flight");
  }
  if (t.lost) throw EngineFailed(*t.lost);
  if (!t.written.covers(0, t.padded)) {
    throw UsageError("SwapStore::locate: key '" + key + "' was not written whole");
  }
  StoredTensor out;
  out.padded = t.padded;
  std::vector<FilePiece> pieces;
  s.map_range(t, 0, t.padded, 0, pieces);
  for (const FilePiece& p : pieces) {
    out.pieces.push_back({p.file, p.file_offset, p.length, p.buffer_offset});
  }
  if (s.options.checksums) out.unit_sums = t.crcs;
  return out;
}

void SwapStore::precondition() {
  Impl& s = *impl_;
  {
    std::lock_guard lock(s.mu);
    s.check_open();
    if (s.any_swap_out || s.ops_in_flight > 0) {
      throw UsageError(
          "SwapStore::precondition: must run before the first swap_out (it "
          "overwrites the files)");
    }
    // Counted as in flight so that close() waits for it.
    ++s.ops_in_flight;
  }
  struct Done {
    Impl& s;
    ~Done() {
      std::lock_guard lock(s.mu);
      if (--s.ops_in_flight == 0) s.idle.notify_all();
    }
  } done{s};
  const std::uint64_t chunk = std::min(kPreconditionChunk, s.file_bytes);
  // Fresh anonymous memory is zero: no need to clear it.
  BufferPool zeros(
      BufferPoolOptions{.budget_bytes = chunk, .alignment = s.alignment, .huge_pages = true});
  BufferLease lease = zeros.acquire(chunk);
  std::vector<IoRequest> reqs;
  for (std::size_t f = 0; f < s.ids.size(); ++f) {
    for (std::uint64_t off = 0; off < s.file_bytes; off += chunk) {
      const std::uint64_t n = std::min(chunk, s.file_bytes - off);
      reqs.push_back(IoRequest{IoOp::kWrite, s.ids[f], off, lease.span().first(n)});
    }
  }
  s.engine.submit(reqs).wait();
}

std::uint64_t capacity_for(std::span<const std::uint64_t> sizes, std::uint32_t stripe_bytes,
                           std::uint32_t alignment) {
  if (stripe_bytes == 0 || alignment == 0) {
    throw UsageError("capacity_for: stripe_bytes " + std::to_string(stripe_bytes) +
                     " and alignment " + std::to_string(alignment) + " must be > 0");
  }
  std::uint64_t total = 0;
  for (const std::uint64_t bytes : sizes) {
    const std::optional<std::uint64_t> padded = checked_align_up(bytes, alignment);
    const std::optional<std::uint64_t> striped =
        padded ? checked_align_up(*padded, stripe_bytes) : std::nullopt;
    if (!striped || *striped > UINT64_MAX - total) {
      throw UsageError("capacity_for: the tensors' padded sizes do not fit in 64 bits");
    }
    total += *striped;
  }
  return total;
}

std::uint32_t store_alignment(const std::vector<std::string>& directories, bool direct_io) {
  std::uint32_t alignment = kMinAlignment;
  if (!direct_io) return alignment;
  for (const std::string& d : directories) {
    alignment = std::max(alignment, probe_direct_io_alignment(d));
  }
  return alignment;
}

}  // namespace zinf::swap
