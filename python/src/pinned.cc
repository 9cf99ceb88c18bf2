// SPDX-License-Identifier: Apache-2.0
// Pinned host buffers for Python: leases of one process-wide BufferPool (huge pages, a byte
// budget), exposed through the buffer protocol so that torch.frombuffer() makes a tensor over
// them without a copy. The tensor holds a reference to the buffer object, so the memory is
// returned to the pool when the last tensor over it is freed, never before. Where a CUDA device
// is visible the pool's arena is registered with it (cudaHostRegister), so copies between
// these tensors and the GPU are asynchronous.
#include <cstring>
#include <memory>
#include <mutex>
#include <string>

#include "native.h"
#include "zinf/common/error.h"
#include "zinf/common/log.h"
#include "zinf/cuda/device.h"
#include "zinf/swap/buffer_pool.h"

namespace zinf::python {
namespace {

constexpr std::uint32_t kAlign = 4096;

// The pool, made at the first allocation with the budget set before it (set_pinned_budget).
struct Pool {
  std::unique_ptr<cuda::Device> device;  // CUDA only; destroyed after the registration
  std::unique_ptr<swap::BufferPool> pool;
  cuda::PinnedRegistration registration;
  ~Pool() { registration = {}; }
};

std::mutex pool_mu;
std::uint64_t pool_budget = std::uint64_t{2} << 30;
std::shared_ptr<Pool> the_pool;

std::shared_ptr<Pool> pool() {
  std::lock_guard lk(pool_mu);
  if (!the_pool) {
    auto p = std::make_shared<Pool>();
    swap::BufferPoolOptions o;
    o.budget_bytes = pool_budget;
    o.alignment = kAlign;
    o.huge_pages = true;
    p->pool = std::make_unique<swap::BufferPool>(o);
    if (cuda::probe_cuda().available()) {
      cuda::DeviceOptions d;
      d.kind = cuda::DeviceKind::kCuda;
      p->device = cuda::make_device(d);
      p->registration = p->device->register_host(p->pool->arena());
    }
    the_pool = std::move(p);
  }
  return the_pool;
}

// One lease, alive while any Python object (a tensor via frombuffer) refers to it.
class PinnedBuffer {
 public:
  PinnedBuffer(std::shared_ptr<Pool> pool, swap::BufferLease lease, std::size_t bytes)
      : pool_(std::move(pool)), lease_(std::move(lease)), bytes_(bytes) {}
  ~PinnedBuffer() { lease_ = {}; }  // back to the pool before the pool reference goes
  std::byte* data() const { return lease_.data(); }
  std::size_t size() const { return bytes_; }

 private:
  std::shared_ptr<Pool> pool_;
  swap::BufferLease lease_;
  std::size_t bytes_;
};

std::unique_ptr<PinnedBuffer> allocate(std::size_t bytes, bool zero) {
  std::shared_ptr<Pool> p = pool();
  // At least one granule: a zero-element tensor still gets a valid, aligned address.
  const std::size_t want = bytes == 0 ? kAlign : bytes;
  swap::BufferLease lease = p->pool->try_acquire(want);
  if (lease.data() == nullptr) {
    throw IoError(Status::error(ErrorCode::kResource,
                                "zinf pinned memory: " + std::to_string(bytes) +
                                    " bytes requested, the pool's budget of " +
                                    std::to_string(p->pool->budget_bytes()) +
                                    " bytes is in use; free pinned tensors or set a larger "
                                    "budget with zinf.set_pinned_budget() before the first "
                                    "allocation")
                      .with_operation("pinned allocation"));
  }
  if (zero) std::memset(lease.data(), 0, lease.size());
  return std::make_unique<PinnedBuffer>(std::move(p), std::move(lease), bytes);
}

}  // namespace

void bind_pinned(py::module_& m) {
  using namespace pybind11::literals;
  py::class_<PinnedBuffer>(m, "PinnedBuffer", py::buffer_protocol(),
                           "Pinned host memory from zinf's pool (buffer protocol, bytes).")
      .def_buffer([](PinnedBuffer& b) {
        return py::buffer_info(b.data(), 1, py::format_descriptor<std::uint8_t>::format(), 1,
                               {b.size()}, {1});
      })
      .def_property_readonly("address",
                             [](const PinnedBuffer& b) {
                               return reinterpret_cast<std::uintptr_t>(b.data());
                             })
      .def("__len__", &PinnedBuffer::size);
  m.def("pinned_alloc", &allocate, "nbytes"_a, "zero"_a = false,
        "A PinnedBuffer of nbytes (4096-byte aligned) from the pool; zeroed if zero.");
  m.def(
      "set_pinned_budget",
      [](std::uint64_t bytes) {
        std::lock_guard lk(pool_mu);
        if (the_pool) {
          throw UsageError("set_pinned_budget: the pinned pool exists already (budget " +
                           std::to_string(pool_budget) + " bytes); set it before the first "
                                                         "pinned allocation");
        }
        if (bytes < kAlign) {
          throw UsageError("set_pinned_budget: at least 4096 bytes, got " +
                           std::to_string(bytes));
        }
        pool_budget = bytes;
      },
      "nbytes"_a);
  m.def("pinned_budget", [] {
    std::lock_guard lk(pool_mu);
    return pool_budget;
  });
  m.def(
      "pinned_in_use",
      [] {
        std::lock_guard lk(pool_mu);
        return the_pool ? the_pool->pool->bytes_in_use() : std::uint64_t{0};
      },
      "Bytes of the pinned pool held by live buffers (0 before the first allocation).");
  m.def("pinned_contains", [](std::uintptr_t address) {
    std::lock_guard lk(pool_mu);
    if (!the_pool) return false;
    const auto arena = the_pool->pool->arena();
    const auto a = reinterpret_cast<const std::byte*>(address);
    return a >= arena.data() && a < arena.data() + arena.size();
  });
}

}  // namespace zinf::python
