// SPDX-License-Identifier: Apache-2.0
// ParamStore: the NVMe tier of zinf.torch.offload_parameters. Each unit's parameters (one flat
// byte range per unit) are a SwapStore key; reads go through a LayerPrefetcher on the host
// simulation device, which traces the order of the first iteration and reads the next `depth`
// units ahead on the engine's threads while Python computes. A read copies the unit out of the
// prefetcher's window into caller memory (a torch tensor) and releases it at once, so no torch
// tensor ever points into memory the window recycles (autograd may keep views of a parameter
// until backward). A write puts a unit's updated bytes back (suspend, swap_out, resume).
// One calling thread at a time (zinf.torch's hooks run on the training thread).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <pybind11/stl.h>

#include "native.h"
#include "zinf/common/error.h"
#include "zinf/common/log.h"
#include "zinf/cuda/device.h"
#include "zinf/prefetch/layer_prefetcher.h"
#include "zinf/swap/io_engine.h"
#include "zinf/swap/swap_store.h"

namespace zinf::python {
namespace {

struct FreeDeleter {
  void operator()(std::byte* p) const noexcept { std::free(p); }
};

class ParamStore {
 public:
  ParamStore(const std::vector<std::uint64_t>& unit_bytes,
             const std::vector<std::string>& directories, std::size_t depth, bool checksums,
             const swap::IoOptions& io)
      : unit_bytes_(unit_bytes), depth_(depth) {
    if (unit_bytes.empty()) throw UsageError("ParamStore: no units");
    if (directories.empty()) throw UsageError("ParamStore: no directories");
    engine_ = swap::make_io_engine(io);
    // Capacity: every unit padded to a whole stripe, so a unit never shares a stripe unit
    // with another (checksums are per stripe unit), plus one spare stripe per directory.
    constexpr std::uint64_t kStripe = 1u << 20;
    std::uint64_t capacity = kStripe * directories.size();
    std::uint64_t largest = 0;
    for (std::size_t u = 0; u < unit_bytes.size(); ++u) {
      if (unit_bytes[u] == 0) {
        throw UsageError("ParamStore: unit " + std::to_string(u) + " has no bytes");
      }
      capacity += (unit_bytes[u] + kStripe - 1) / kStripe * kStripe;
      largest = std::max(largest, unit_bytes[u]);
    }
    swap::SwapStoreOptions so;
    so.directories = directories;
    so.capacity_bytes = capacity;
    so.stripe_bytes = kStripe;
    so.checksums = checksums;
    store_ = std::make_unique<swap::SwapStore>(so, *engine_);
    for (std::size_t u = 0; u < unit_bytes.size(); ++u) store_->allocate(key(u), unit_bytes[u]);
    staging_bytes_ = store_->padded_size(largest);
    staging_.reset(
        static_cast<std::byte*>(std::aligned_alloc(store_->alignment(), staging_bytes_)));
    if (!staging_) throw std::bad_alloc();
    written_.assign(unit_bytes.size(), false);
    cuda::DeviceOptions d;
    d.kind = cuda::DeviceKind::kHost;
    device_ = cuda::make_device(d);
    compute_ = device_->create_stream();
  }

  ~ParamStore() {
    prefetcher_.reset();  // waits for its reads before the store goes
    compute_ = {};
  }

  std::size_t unit_count() const { return unit_bytes_.size(); }

  /// Stores `bytes` bytes from `address` as unit `u` (blocking). The prefetcher drops any copy
  /// of the unit it holds and reads it anew afterwards.
  void write(std::size_t u, std::uintptr_t address, std::uint64_t bytes) {
    check(u, bytes, "write");
    py::gil_scoped_release nogil;
    const std::lock_guard lk(staging_mu_);
    const Suspended suspended(prefetcher_.get(), u);
    const std::uint64_t padded = store_->padded_size(bytes);
    std::memcpy(staging_.get(), reinterpret_cast<const void*>(address), bytes);
    std::memset(staging_.get() + bytes, 0, padded - bytes);
    const Status s =
        store_->swap_out(key(u), std::span<const std::byte>(staging_.get(), padded)).wait_status();
    if (!s.ok()) throw IoError(s);
    written_[u] = true;
  }

  /// Copies unit `u` into `address` (blocking until its read is done: at once when the
  /// prefetcher read it ahead).
  void read(std::size_t u, std::uintptr_t address, std::uint64_t bytes) {
    check(u, bytes, "read");
    check_written("read");
    py::gil_scoped_release nogil;
    if (!prefetcher_) {
      prefetch::PrefetcherOptions o;
      for (std::size_t i = 0; i < unit_bytes_.size(); ++i) o.layer_keys.push_back(key(i));
      o.depth = depth_;
      // Room for the window (depth + 1 units) plus one being handed out, each a staging lease
      // and a "device" copy, at the largest unit's padded size.
      o.max_bytes = (depth_ + 3) * 2 * staging_bytes_;
      o.huge_pages = false;  // small windows; the staging arena is sized to them
      prefetcher_ =
          std::make_unique<prefetch::LayerPrefetcher>(o, *store_, *device_, compute_.ref());
    }
    const cuda::DeviceSpan span = prefetcher_->acquire(u);
    // The host simulation's "device" is host memory: wait for the copy into it, take the bytes,
    // give the unit back to the window.
    device_->synchronize(compute_.ref());
    std::memcpy(reinterpret_cast<void*>(address), span.data(), bytes);
    prefetcher_->release(u);
  }

  /// Copies unit `u` into `address` straight from the store, outside the traced order: the
  /// prefetcher neither counts nor learns it (a copy of the unit in its window is dropped, so
  /// the next traced read of it goes to the drive). Blocks for the read.
  void read_untraced(std::size_t u, std::uintptr_t address, std::uint64_t bytes) {
    check(u, bytes, "read_untraced");
    check_written("read_untraced");
    py::gil_scoped_release nogil;
    const std::lock_guard lk(staging_mu_);
    const Suspended suspended(prefetcher_.get(), u);
    const Status s =
        store_->swap_in(key(u), std::span<std::byte>(staging_.get(), store_->padded_size(bytes)))
            .wait_status();
    if (!s.ok()) throw IoError(s);
    std::memcpy(reinterpret_cast<void*>(address), staging_.get(), bytes);
  }

  void end_iteration() {
    if (prefetcher_) prefetcher_->end_iteration();
  }

  py::dict stats() const {
    py::dict d;
    prefetch::PrefetcherStats s;
    if (prefetcher_) s = prefetcher_->stats();
    const auto seconds = [](std::chrono::nanoseconds n) {
      return std::chrono::duration<double>(n).count();
    };
    d["acquires"] = s.acquires;
    d["hits"] = s.hits;
    d["on_demand"] = s.on_demand;
    d["retraces"] = s.retraces;
    d["layers_issued"] = s.layers_issued;
    d["evictions"] = s.evictions;
    d["bytes_read"] = s.bytes_read;
    d["read_busy_seconds"] = seconds(s.read_busy_time);
    d["acquire_blocked_seconds"] = seconds(s.acquire_blocked_time);
    d["peak_held_bytes"] = s.peak_held_bytes;
    d["bytes_written"] = store_->stats().bytes_out;
    return d;
  }

  std::vector<std::string> file_paths() const { return store_->file_paths(); }
  std::string engine_name() const { return std::string(engine_->name()); }
  py::dict io() const { return io_dict(engine_->name(), engine_->options()); }

 private:
  static std::string key(std::size_t u) { return "unit" + std::to_string(u); }

  // A unit taken out of the prefetcher's window while the store's copy is read or written
  // directly (the store refuses a swap overlapping one of the window's), resumed whatever
  // happens: a unit left suspended could never be read again.
  class Suspended {
   public:
    Suspended(prefetch::LayerPrefetcher* p, std::size_t u) : p_(p), u_(u) {
      if (p_ != nullptr) p_->suspend(u_);
    }
    ~Suspended() {
      if (p_ == nullptr) return;
      try {
        p_->resume(u_);
      } catch (const std::exception& e) {
        log(LogLevel::kError, std::string("ParamStore: resume: ") + e.what());
      }
    }
    Suspended(const Suspended&) = delete;
    Suspended& operator=(const Suspended&) = delete;

   private:
    prefetch::LayerPrefetcher* p_;
    std::size_t u_;
  };

  void check_written(const char* what) const {
    for (std::size_t i = 0; i < written_.size(); ++i) {
      if (!written_[i]) {
        throw UsageError(std::string("ParamStore.") + what + ": unit " + std::to_string(i) +
                         " was never written");
      }
    }
  }

  void check(std::size_t u, std::uint64_t bytes, const char* what) const {
    if (u >= unit_bytes_.size()) {
      throw UsageError(std::string("ParamStore.") + what + ": unit " + std::to_string(u) + " of " +
                       std::to_string(unit_bytes_.size()));
    }
    if (bytes != unit_bytes_[u]) {
      throw UsageError(std::string("ParamStore.") + what + ": unit " + std::to_string(u) +
                       " holds " + std::to_string(unit_bytes_[u]) + " bytes, got " +
                       std::to_string(bytes));
    }
  }

  std::vector<std::uint64_t> unit_bytes_;
  std::size_t depth_;
  // Acquisition order: the engine, the store over it, the device and stream, the prefetcher
  // over all three (destroyed first).
  std::unique_ptr<swap::IoEngine> engine_;
  std::unique_ptr<swap::SwapStore> store_;
  std::uint64_t staging_bytes_ = 0;
  std::mutex staging_mu_;  // write and read_untraced share the staging buffer
  std::unique_ptr<std::byte, FreeDeleter> staging_;
  std::vector<bool> written_;
  std::unique_ptr<cuda::Device> device_;
  cuda::Stream compute_;
  std::unique_ptr<prefetch::LayerPrefetcher> prefetcher_;
};

}  // namespace

void bind_param_store(py::module_& m) {
  using namespace pybind11::literals;
  py::class_<ParamStore>(m, "ParamStore",
                         "Units of parameters on NVMe, read ahead in traced order; see "
                         "zinf.torch.offload_parameters.")
      .def(py::init([](const std::vector<std::uint64_t>& unit_bytes,
                       const std::vector<std::string>& directories, std::size_t depth,
                       bool checksums, const swap::IoOptions& io) {
             py::gil_scoped_release nogil;
             return std::make_unique<ParamStore>(unit_bytes, directories, depth, checksums, io);
           }),
           "unit_bytes"_a, "directories"_a, "depth"_a, "checksums"_a = true,
           "io"_a = swap::IoOptions{})
      .def("io", [](const ParamStore& s) { return s.io(); })
      .def("write", &ParamStore::write, "unit"_a, "address"_a, "nbytes"_a)
      .def("read", &ParamStore::read, "unit"_a, "address"_a, "nbytes"_a)
      .def("read_untraced", &ParamStore::read_untraced, "unit"_a, "address"_a, "nbytes"_a)
      .def("end_iteration",
           [](ParamStore& s) {
             py::gil_scoped_release nogil;
             s.end_iteration();
           })
      .def("stats", &ParamStore::stats)
      .def("unit_count", &ParamStore::unit_count)
      .def("file_paths", &ParamStore::file_paths)
      .def("engine_name", &ParamStore::engine_name);
}

}  // namespace zinf::python
