// SPDX-License-Identifier: Apache-2.0
// SwapStore: tensors by key in a few large preallocated files, one per configured directory
// (one per NVMe drive), striped so that bandwidth adds up over drives, with a CRC32C per
// stripe unit (on by default). Asynchronous swap_out/swap_in through a caller-given IoEngine.
// Part of zinf::swap.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "zinf/common/status.h"
#include "zinf/swap/io_engine.h"

namespace zinf::swap {

struct SwapStoreOptions {
  /// One swap file is created in each directory (normally one per drive). The directories
  /// must exist; each is opened once, and its file created relative to that descriptor.
  /// Naming one directory twice gives it two files (and twice the bandwidth share).
  std::vector<std::string> directories;
  /// Bytes the store can hold in all, over all files; rounded up to whole stripe rows
  /// (stripe_bytes x directories). Each file is capacity / directories, preallocated.
  std::uint64_t capacity_bytes = 0;
  /// Striping unit: consecutive stripe_bytes of the store's address space go to consecutive
  /// files. A multiple of the store's alignment. 1 MiB: IoOptions::block_size's default (why:
  /// docs/benchmarks.md, "Figures behind the defaults").
  std::uint32_t stripe_bytes = 1u << 20;
  /// Keep a CRC32C per stripe unit of each tensor: computed on swap_out, verified when a
  /// swap_in (or swap_in_range) completes, before its ticket does. On by default: a byte that
  /// changed in the file (a drive's silent error, a stray write) then fails the swap_in with
  /// kCorrupt naming the key, file, offset, length and both CRCs, and is never returned as
  /// data. Cost: ~1 CRC32C pass over the bytes each way (swap_in verification runs on the
  /// verify threads, overlapping the reads still in flight) and 4 bytes of memory per stripe
  /// unit. A caller that passes over the bytes anyway can take both passes on itself
  /// (swap_in_unchecked / swap_out_summed; the optimizer does, inside its Adam update). With
  /// it, ranges must cover whole stripe units (see swap_out_range).
  /// false opts out: the store then hands back whatever the file holds.
  bool checksums = true;
  /// Threads that verify swap_in checksums and compute swap_out ones (0: verify on the
  /// engine's completion thread, sum on the submitting thread). Off the engine's thread,
  /// verification overlaps the reads still in flight; on it, it delays their reaping. Summing
  /// a swap_out here rather than on its submitter frees the submitter at once (the optimizer's
  /// pipeline thread goes on to the next update). Why 2: docs/benchmarks.md, "Figures behind
  /// the defaults".
  std::uint32_t verify_threads = 2;
  /// Open the files with O_DIRECT where the file system allows it (File falls back to
  /// buffered I/O, with one notice, where it does not, e.g. tmpfs).
  bool direct_io = true;
};

/// Counters since the store was made.
struct SwapStoreStats {
  std::uint64_t swaps_out = 0;
  std::uint64_t swaps_in = 0;
  std::uint64_t bytes_out = 0;          ///< bytes written by successful swap_outs (padded)
  std::uint64_t bytes_in = 0;           ///< bytes read by successful swap_ins (padded)
  std::uint64_t checksum_failures = 0;  ///< stripe units whose CRC32C did not match on swap_in
  std::uint64_t failures = 0;           ///< swaps that completed with an error
};

/// Where a tensor's stored bytes lie (SwapStore::locate): padded tensor bytes
/// [tensor_offset, + length) are at `file_offset` of file `file` (file_descriptor(file)).
struct StoredPiece {
  std::uint32_t file = 0;
  std::uint64_t file_offset = 0;
  std::uint64_t length = 0;
  std::uint64_t tensor_offset = 0;
};

/// A tensor's place in the files and its stripe units' CRC32Cs, as of its last swap_out.
struct StoredTensor {
  std::uint64_t padded = 0;              ///< padded_size() of the tensor: the pieces' total
  std::vector<StoredPiece> pieces;       ///< in tensor order, covering [0, padded)
  std::vector<std::uint32_t> unit_sums;  ///< one per stripe unit; empty without checksums
};

/// Maps tensor keys to extents of striped, preallocated swap files.
///
/// Layout. The store's address space is stripe_bytes-sized units dealt round-robin over the
/// files: byte `a` lives in file (a / stripe) % N at offset (a / stripe / N) * stripe +
/// a % stripe. A tensor gets one run of that space where one fits (starting on a stripe
/// boundary if it is at least a stripe long), else several; so a tensor's consecutive stripe
/// units go to consecutive files and a large swap keeps every drive busy.
///
/// Sizes and buffers. Any tensor size works: a tensor is stored padded to whole alignment()
/// blocks (padded_size(bytes)). Buffers passed to swap_out/swap_in must start on an alignment()
/// boundary and be at least the padded length of the transfer; exactly that many bytes move,
/// so the padding bytes of a swap_out buffer are written (and read back by swap_in) as they are.
/// The buffer must stay valid, and untouched for a swap_out, until its ticket completes.
///
/// Concurrency. Every member is thread-safe. Swaps of different keys may run concurrently
/// without limit. For one key: swap_ins of any ranges may overlap each other; a swap_out may
/// not overlap (in tensor bytes) any swap_in or swap_out of that key still in flight, and
/// release() needs no swap of the key in flight: both are refused with UsageError at submit,
/// so a race can never mix old and new bytes silently.
///
/// Failures. A swap's ticket fails with the first error: an IoError naming the key, the file,
/// offset, length and errno (failed write/read), or kCorrupt (checksum mismatch: key, file,
/// offset, length and both CRCs); its buffer is then not valid data. A failed swap_out leaves
/// the key's stored bytes undefined: later swap_ins of the key throw EngineFailed quoting that
/// failure until a whole-tensor swap_out succeeds. The store itself stays usable.
///
/// Files. The swap files have no name on disk (File::create_unnamed: O_TMPFILE, or a name
/// nobody can predict removed at once): no file or link planted in a directory is ever opened
/// or written, two stores (or a restarted process with the same pid) can never collide, and
/// the space is returned when the files are closed, also when the process is killed. Nothing
/// the store makes is ever visible in its directories.
///
/// Lifetime. The engine must outlive the store. The destructor waits for swaps in flight,
/// detaches and closes the files, which frees their space (the store is scratch space). Do not
/// close or destroy the store from a swap's on_complete callback (it may run on the store's own
/// verify thread, which the destructor joins).
class SwapStore {
 public:
  /// Opens every directory, checks that each has room for its file (statvfs, summed per file
  /// system), then creates, preallocates and opens the (unnamed) files and attaches them to
  /// `engine`. Throws: UsageError for bad options (no directories, zero capacity, stripe_bytes
  /// not a multiple of the alignment); IoError naming the directory if one cannot be opened
  /// (kNotFound, or ENOTDIR); IoError kNoSpace naming the directory, bytes needed and bytes
  /// free if one lacks room (before any file is created); IoError for a failed create or
  /// preallocation (files already created are closed, which frees them).
  SwapStore(const SwapStoreOptions& options, IoEngine& engine);
  ~SwapStore();
  SwapStore(const SwapStore&) = delete;
  SwapStore& operator=(const SwapStore&) = delete;

  /// Returns the alignment of buffers, offsets and the padding unit: the largest direct-I/O
  /// alignment of the files, at least 4096.
  std::uint32_t alignment() const noexcept;
  /// Returns `bytes` rounded up to whole alignment() blocks: the buffer size a whole-tensor
  /// swap needs and the space the tensor takes. `bytes` above 2^64 - alignment() (larger than
  /// any tensor a store can hold) is a bug and aborts rather than wrapping to a small size.
  std::uint64_t padded_size(std::uint64_t bytes) const noexcept;
  std::uint32_t stripe_bytes() const noexcept;
  bool checksums() const noexcept;

  /// Reserves space for `key` of `bytes` (> 0) bytes. Non-blocking. Throws UsageError for a
  /// duplicate key or zero bytes, and IoError kNoSpace naming the key, the bytes requested and
  /// the bytes free when the store cannot hold it.
  void allocate(const std::string& key, std::uint64_t bytes);
  /// Frees `key`'s space. Throws UsageError for an unknown key or one with a swap in flight.
  void release(const std::string& key);
  bool contains(const std::string& key) const;
  /// Returns the byte size `key` was allocated with; UsageError for an unknown key.
  std::uint64_t size_of(const std::string& key) const;

  /// Writes the whole tensor from `buffer` (aligned, at least padded_size(size_of(key)) bytes)
  /// and returns at once. `on_complete`, if given, runs once on an engine thread (or on this
  /// one) after the ticket has completed, as with IoEngine::submit. Throws UsageError for an
  /// unknown key, a bad buffer or a same-key conflict, before anything is submitted.
  IoTicket swap_out(const std::string& key, std::span<const std::byte> buffer,
                    IoCallback on_complete = {});
  /// Reads the whole tensor into `buffer` (as swap_out). Also throws UsageError if part of the
  /// tensor was never swapped out, and EngineFailed if its last swap_out failed.
  IoTicket swap_in(const std::string& key, std::span<std::byte> buffer,
                   IoCallback on_complete = {});

  /// Writes tensor bytes [offset, offset + length) from `buffer`. Rules: offset is a multiple
  /// of alignment(); length > 0 and offset + length <= size_of(key); length is a multiple of
  /// alignment() unless the range ends at the tensor's end (then the padding moves too);
  /// buffer is aligned and at least padded_size(length) long. With checksums, offset and the
  /// range's end must also fall on stripe_bytes boundaries of the tensor (or the end at the
  /// tensor's end), so that every stripe unit touched is written whole. UsageError otherwise.
  IoTicket swap_out_range(const std::string& key, std::uint64_t offset, std::uint64_t length,
                          std::span<const std::byte> buffer, IoCallback on_complete = {});
  /// Reads tensor bytes [offset, offset + length) into `buffer`, under swap_out_range's rules
  /// (with checksums, whole stripe units so that each can be verified).
  IoTicket swap_in_range(const std::string& key, std::uint64_t offset, std::uint64_t length,
                         std::span<std::byte> buffer, IoCallback on_complete = {});

  /// Caller-side checksums, for a caller that passes over the bytes anyway and folds the
  /// CRC32C into that pass (the optimizer sums inside its Adam update) rather than have the
  /// store make a pass of its own. Whole tensors, stores with checksums on, only. Stripe unit
  /// i of a tensor is its padded bytes [i * stripe_bytes(), min(padded, (i + 1) *
  /// stripe_bytes())); unit_count(key) units in all.
  ///
  /// swap_in_unchecked: swap_in whose ticket completes WITHOUT verifying. `expected` (exactly
  /// unit_count(key) entries) receives each unit's stored CRC32C before this returns. The
  /// caller must compute every unit's CRC32C of the bytes read and, before acting on any of
  /// them (writing them anywhere, handing them on), compare, and turn a difference into
  /// checksum_error(). UsageError for a store without checksums or a wrong span size.
  IoTicket swap_in_unchecked(const std::string& key, std::span<std::byte> buffer,
                             std::span<std::uint32_t> expected, IoCallback on_complete = {});
  /// swap_out with each unit's CRC32C given by the caller (`sums`, unit_count(key) entries),
  /// stored as given: a wrong sum is never silent, the next swap_in fails with kCorrupt.
  IoTicket swap_out_summed(const std::string& key, std::span<const std::byte> buffer,
                           std::span<const std::uint32_t> sums, IoCallback on_complete = {});
  /// The number of stripe units of `key`. UsageError for an unknown key.
  std::uint64_t unit_count(const std::string& key) const;
  /// Returns the kCorrupt error for unit `unit` of `key` whose bytes summed to `found` where
  /// swap_in_unchecked gave `expected`: the same text, file, offset and length as swap_in's
  /// own verification, and counted in stats().checksum_failures. UsageError for an unknown
  /// key or unit.
  Status checksum_error(const std::string& key, std::uint64_t unit, std::uint32_t expected,
                        std::uint32_t found);

  /// Where `key`'s bytes are stored and the CRC32C of each stripe unit, for a caller that
  /// copies them by other means than a swap_in (the optimizer's checkpoint clones them with
  /// FICLONERANGE). The answer holds as long as no swap_out of the key starts and the key is
  /// not released: the caller must make sure of that for as long as it uses the pieces. Every
  /// offset and length is a multiple of alignment(). Throws UsageError for an unknown key, a
  /// swap_out of it in flight, or a key not written whole yet; EngineFailed if its last
  /// swap_out failed.
  StoredTensor locate(const std::string& key) const;

  /// Writes every block of every file once (zeros), so that later swap_outs overwrite written
  /// blocks rather than fill unwritten extents (faster on most drives; docs/benchmarks.md,
  /// "Figures behind the defaults").
  /// Blocks until done; throws IoError on failure. Call before the first swap_out (UsageError
  /// afterwards, or while any swap is in flight): it destroys stored data.
  void precondition();

  /// The swap files' display paths, in stripe order: "<directories[i]>/zinf-swap-<n>.<i>
  /// (unlinked)", where n numbers the stores of this process. For messages only: the files
  /// have no name on disk, so nothing can be opened at these paths (errors name them so).
  const std::vector<std::string>& file_paths() const noexcept;
  /// The open descriptor of file `index`, for tools and tests that inspect or damage a file
  /// behind the store's back (e.g. through "/proc/self/fd/<fd>"). Owned by the store: never
  /// close it; valid until close(). UsageError for a bad index or a closed store.
  int file_descriptor(std::size_t index) const;
  /// Bytes of each file.
  std::uint64_t file_bytes() const noexcept;
  /// Total capacity after rounding, bytes held by allocations (padded), and bytes free.
  std::uint64_t capacity_bytes() const noexcept;
  std::uint64_t used_bytes() const;
  std::uint64_t free_bytes() const;
  SwapStoreStats stats() const;

  /// Waits for swaps in flight, detaches and closes the files (freeing them), reporting the
  /// first error. Later calls (other than close and the destructor) throw UsageError.
  Status close();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// The capacity_bytes a store with `stripe_bytes` stripe units and buffers aligned to
/// `alignment` needs to hold tensors of `sizes` bytes at once, in any allocation order: each
/// tensor padded to the alignment and rounded to whole stripes (a tensor of a stripe or more
/// starts on a stripe boundary). The one place that sum is made, for every store sized to
/// its keys. UsageError for a zero alignment or stripe, or a sum beyond 64 bits.
std::uint64_t capacity_for(std::span<const std::uint64_t> sizes, std::uint32_t stripe_bytes,
                           std::uint32_t alignment);

/// The direct-I/O alignment a store over `directories` will have (SwapStore::alignment():
/// the largest of the directories' probed alignments, at least 4096), known before the store
/// is made; 4096 without direct I/O. Creates no file.
std::uint32_t store_alignment(const std::vector<std::string>& directories, bool direct_io = true);

}  // namespace zinf::swap
