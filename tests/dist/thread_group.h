// SPDX-License-Identifier: Apache-2.0
// Ranks as threads for the dist tests: callback collectives whose callbacks exchange through
// shared memory, so that a group of any size runs in one test process. They may declare device
// memory, each rank's a host simulation: every buffer a callback gets must then be an
// allocation of its rank's device.
#pragma once

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cstring>
#include <functional>
#include <memory>
#include <span>
#include <string_view>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "zinf/cuda/device.h"
#include "zinf/cuda/testing.h"
#include "zinf/dist/callback_collectives.h"
#include "zinf/dist/collectives.h"

namespace zinf::dist::test {

// Ranks as threads: each callback publishes this rank's buffer in its slot, waits for every
// rank (std::barrier), computes from all the slots, and waits again before returning so that
// no rank's buffer is released while another still reads it.
class ThreadGroup {
 public:
  explicit ThreadGroup(int size) : size_(size), slots_(size), sync_(size) {}

  // With `device` (a host simulation), the callbacks take device memory (so kAvg reaches them,
  // and reduce_scatter is native) and fail the test for any buffer that is not `device`'s.
  CollectiveCallbacks callbacks(int rank, bool native_reduce_scatter,
                                const cuda::Device* device = nullptr) {
    CollectiveCallbacks cb;
    cb.rank = rank;
    cb.size = size_;
    cb.name = "threads";
    if (device) {
      cb.memory = MemoryKind::kDevice;
      native_reduce_scatter = true;
    }
    auto mine = [device, rank](std::string_view op, std::span<const std::byte> bytes) {
      if (device && !bytes.empty() &&
          !cuda::test_hooks::host_device_owns(*device, bytes.data(), bytes.size())) {
        ADD_FAILURE() << "rank " << rank << ": " << op << " got " << bytes.size()
                      << " bytes that are not its device's memory";
      }
    };
    cb.all_gather = [this, rank, mine](std::span<const std::byte> send, std::span<std::byte> recv) {
      mine("all_gather", send);
      mine("all_gather", recv);
      publish(rank, send);
      for (int q = 0; q < size_; ++q) copy_slot(q, recv.subspan(q * send.size(), send.size()));
      sync_.arrive_and_wait();
    };
    cb.all_reduce = [this, rank, mine, device](std::span<std::byte> data, ElementType type,
                                               ReduceOp op) {
      if (!device) {
        EXPECT_NE(op, ReduceOp::kAvg) << "the adapter passed kAvg to a host callback";
      }
      mine("all_reduce", data);
      publish(rank, data);
      std::vector<std::byte> out = reduce_slots(0, data.size(), type, op);
      sync_.arrive_and_wait();
      if (!out.empty()) std::memcpy(data.data(), out.data(), out.size());
    };
    cb.broadcast = [this, rank, mine](std::span<std::byte> data, int root) {
      mine("broadcast", data);
      publish(rank, data);
      if (rank != root) copy_slot(root, data);
      sync_.arrive_and_wait();
    };
    cb.barrier = [this] { sync_.arrive_and_wait(); };
    if (native_reduce_scatter) {
      cb.reduce_scatter = [this, rank, mine](std::span<const std::byte> send,
                                             std::span<std::byte> recv, ElementType type,
                                             ReduceOp op) {
        mine("reduce_scatter", send);
        mine("reduce_scatter", recv);
        ++native_reduce_scatters_;
        publish(rank, send);
        std::vector<std::byte> out = reduce_slots(rank * recv.size(), recv.size(), type, op);
        sync_.arrive_and_wait();
        if (!out.empty()) std::memcpy(recv.data(), out.data(), out.size());
      };
    }
    return cb;
  }

  // Runs body(collectives) on `size` threads, one per rank.
  void run(bool native_reduce_scatter, const std::function<void(Collectives&)>& body) {
    std::vector<std::thread> threads;
    for (int r = 0; r < size_; ++r) {
      threads.emplace_back([this, r, native_reduce_scatter, &body] {
        auto c = make_callback_collectives(callbacks(r, native_reduce_scatter));
        body(*c);
      });
    }
    for (auto& t : threads) t.join();
  }

  // Runs body(collectives, device) on `size` threads, one per rank, each with a device of its
  // own: with kDevice a host simulation whose memory the collectives take (and check), with
  // kHost the device make_device picks (CUDA where one is visible).
  void run(MemoryKind memory, const std::function<void(Collectives&, cuda::Device&)>& body) {
    std::vector<std::thread> threads;
    for (int r = 0; r < size_; ++r) {
      threads.emplace_back([this, r, memory, &body] {
        cuda::DeviceOptions o;
        if (memory == MemoryKind::kDevice) o.kind = cuda::DeviceKind::kHost;
        std::unique_ptr<cuda::Device> device = cuda::make_device(o);
        auto c = make_callback_collectives(
            callbacks(r, false, memory == MemoryKind::kDevice ? device.get() : nullptr));
        body(*c, *device);
      });
    }
    for (auto& t : threads) t.join();
  }

  std::atomic<int> native_reduce_scatters_{0};

 private:
  void publish(int rank, std::span<const std::byte> bytes) {
    slots_[rank] = bytes;
    sync_.arrive_and_wait();
  }
  // Skips a slot that is `to` itself (this rank's block of an in-place all-gather): copying it
  // onto itself would write memory the other ranks are reading.
  void copy_slot(int q, std::span<std::byte> to) {
    if (!to.empty() && to.data() != slots_[q].data()) {
      std::memcpy(to.data(), slots_[q].data(), to.size());
    }
  }

  template <class T>
  static void reduce_into(std::vector<std::byte>& acc, std::span<const std::byte> in, ReduceOp op) {
    for (std::size_t off = 0; off < acc.size(); off += sizeof(T)) {
      T a, b;
      std::memcpy(&a, acc.data() + off, sizeof a);
      std::memcpy(&b, in.data() + off, sizeof b);
      if (op == ReduceOp::kSum || op == ReduceOp::kAvg) a = static_cast<T>(a + b);
      if (op == ReduceOp::kMax) a = std::max(a, b);
      if (op == ReduceOp::kMin) a = std::min(a, b);
      std::memcpy(acc.data() + off, &a, sizeof a);
    }
  }

  template <class T>
  void divide(std::vector<std::byte>& acc) const {
    for (std::size_t off = 0; off < acc.size(); off += sizeof(T)) {
      T v;
      std::memcpy(&v, acc.data() + off, sizeof v);
      v /= static_cast<T>(size_);
      std::memcpy(acc.data() + off, &v, sizeof v);
    }
  }

  // Bytes [offset, offset + bytes) of every slot reduced in rank order.
  std::vector<std::byte> reduce_slots(std::size_t offset, std::size_t bytes, ElementType type,
                                      ReduceOp op) {
    std::vector<std::byte> acc(slots_[0].begin() + offset, slots_[0].begin() + offset + bytes);
    for (int q = 1; q < size_; ++q) {
      auto in = slots_[q].subspan(offset, bytes);
      switch (type) {
        case ElementType::kF32: reduce_into<float>(acc, in, op); break;
        case ElementType::kF64: reduce_into<double>(acc, in, op); break;
        case ElementType::kI32: reduce_into<std::int32_t>(acc, in, op); break;
        case ElementType::kI64: reduce_into<std::int64_t>(acc, in, op); break;
        case ElementType::kU8: reduce_into<std::uint8_t>(acc, in, op); break;
        case ElementType::kBF16:  // refused by the adapter's checks before any callback
        case ElementType::kF16: break;
      }
    }
    // kAvg (device memory only): the sum divided as the host adapter divides it, bitwise.
    if (op == ReduceOp::kAvg && type == ElementType::kF32) divide<float>(acc);
    if (op == ReduceOp::kAvg && type == ElementType::kF64) divide<double>(acc);
    return acc;
  }

  const int size_;
  std::vector<std::span<const std::byte>> slots_;
  std::barrier<> sync_;
};

}  // namespace zinf::dist::test
