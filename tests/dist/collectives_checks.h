// SPDX-License-Identifier: Apache-2.0
// One body of checks for every Collectives backend on host memory, run by each rank of a group
// (threads for the callback adapter, processes under mpirun for MPI): every collective with
// exact expected values. Values are small integers stored as floats, so every sum and maximum
// is exact and the average is the one division both sides compute the same way.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "zinf/common/error.h"
#include "zinf/dist/collectives.h"

namespace zinf::dist::test {

/// Block sizes in elements: empty, one, odd, and one that is not a multiple of any SIMD width.
inline const std::vector<std::size_t> kBlockSizes = {0, 1, 3, 257, 4099};

/// The byte rank `rank` contributes at index `i`.
inline std::byte stamp(int rank, std::size_t i) {
  return static_cast<std::byte>((static_cast<std::size_t>(rank) * 131 + i * 7 + 1) & 0xff);
}

/// Element i of rank r's input to a reduction: an integer (exact in every type here).
template <class T>
T value(int rank, std::size_t i) {
  return static_cast<T>(static_cast<std::int64_t>((i % 97) + 3 * rank) -
                        (std::is_unsigned_v<T> ? 0 : 40));
}

inline void check_all_gather(Collectives& c) {
  const int n = c.size();
  const int r = c.rank();
  for (std::size_t bytes : std::vector<std::size_t>{0, 1, 3, 1001, (1u << 20) + 7}) {
    SCOPED_TRACE("all_gather bytes per rank " + std::to_string(bytes));
    std::vector<std::byte> send(bytes);
    for (std::size_t i = 0; i < bytes; ++i) send[i] = stamp(r, i);
    std::vector<std::byte> recv(bytes * static_cast<std::size_t>(n), std::byte{0xee});
    c.all_gather(send, recv);
    std::vector<std::byte> in_place(recv.size(), std::byte{0xee});
    std::copy(send.begin(), send.end(), in_place.begin() + static_cast<std::ptrdiff_t>(bytes * r));
    c.all_gather(std::span<const std::byte>(in_place).subspan(bytes * r, bytes), in_place);
    std::size_t wrong = 0;
    for (int q = 0; q < n; ++q) {
      for (std::size_t i = 0; i < bytes; ++i) {
        const std::size_t at = static_cast<std::size_t>(q) * bytes + i;
        wrong += recv[at] != stamp(q, i);
        wrong += in_place[at] != stamp(q, i);
      }
    }
    EXPECT_EQ(wrong, 0u) << "rank " << r;
  }
}

template <class T>
void check_reduce_scatter_of(Collectives& c, ReduceOp op) {
  const int n = c.size();
  const int r = c.rank();
  for (std::size_t block : kBlockSizes) {
    SCOPED_TRACE("reduce_scatter " + std::string(element_type_name(element_type_of<T>())) + " " +
                 std::string(reduce_op_name(op)) + " block " + std::to_string(block));
    std::vector<T> send(block * static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < send.size(); ++i) send[i] = value<T>(r, i);
    std::vector<T> recv(block, T{99});
    reduce_scatter<T>(c, send, recv, op);
    std::size_t wrong = 0;
    for (std::size_t j = 0; j < block; ++j) {
      const std::size_t i = static_cast<std::size_t>(r) * block + j;
      T expected = value<T>(0, i);
      for (int q = 1; q < n; ++q) {
        const T v = value<T>(q, i);
        if (op == ReduceOp::kSum || op == ReduceOp::kAvg) expected += v;
        if (op == ReduceOp::kMax) expected = std::max(expected, v);
        if (op == ReduceOp::kMin) expected = std::min(expected, v);
      }
      if (op == ReduceOp::kAvg) expected /= static_cast<T>(n);
      wrong += recv[j] != expected;
    }
    EXPECT_EQ(wrong, 0u) << "rank " << r;
  }
}

inline void check_reduce_scatter(Collectives& c) {
  check_reduce_scatter_of<float>(c, ReduceOp::kSum);
  check_reduce_scatter_of<float>(c, ReduceOp::kAvg);
  check_reduce_scatter_of<double>(c, ReduceOp::kAvg);
  check_reduce_scatter_of<std::int32_t>(c, ReduceOp::kSum);
  check_reduce_scatter_of<std::int64_t>(c, ReduceOp::kMax);
}

template <class T>
void check_all_reduce_of(Collectives& c, ReduceOp op) {
  const int n = c.size();
  const int r = c.rank();
  for (std::size_t count : kBlockSizes) {
    SCOPED_TRACE("all_reduce " + std::string(element_type_name(element_type_of<T>())) + " " +
                 std::string(reduce_op_name(op)) + " count " + std::to_string(count));
    std::vector<T> data(count);
    for (std::size_t i = 0; i < count; ++i) data[i] = value<T>(r, i);
    all_reduce<T>(c, data, op);
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < count; ++i) {
      T expected = value<T>(0, i);
      for (int q = 1; q < n; ++q) {
        const T v = value<T>(q, i);
        if (op == ReduceOp::kSum || op == ReduceOp::kAvg) expected += v;
        if (op == ReduceOp::kMax) expected = std::max(expected, v);
        if (op == ReduceOp::kMin) expected = std::min(expected, v);
      }
      if (op == ReduceOp::kAvg) expected /= static_cast<T>(n);
      wrong += data[i] != expected;
    }
    EXPECT_EQ(wrong, 0u) << "rank " << r;
  }
}

inline void check_all_reduce(Collectives& c) {
  check_all_reduce_of<float>(c, ReduceOp::kSum);
  check_all_reduce_of<float>(c, ReduceOp::kMax);
  check_all_reduce_of<float>(c, ReduceOp::kAvg);
  check_all_reduce_of<double>(c, ReduceOp::kSum);
  check_all_reduce_of<double>(c, ReduceOp::kMin);
  check_all_reduce_of<std::int32_t>(c, ReduceOp::kMax);
  check_all_reduce_of<std::int64_t>(c, ReduceOp::kSum);
  check_all_reduce_of<std::uint8_t>(c, ReduceOp::kMax);
  // What the engine will do with it: a global gradient norm and an overflow flag.
  std::vector<double> norm{static_cast<double>(c.rank() + 1) * (c.rank() + 1)};
  all_reduce<double>(c, norm, ReduceOp::kSum);
  const int n = c.size();
  EXPECT_EQ(norm[0], n * (n + 1) * (2 * n + 1) / 6.0);
  std::vector<std::uint8_t> overflow{static_cast<std::uint8_t>(c.rank() == n - 1 ? 1 : 0)};
  all_reduce<std::uint8_t>(c, overflow, ReduceOp::kMax);
  EXPECT_EQ(overflow[0], 1);
}

inline void check_broadcast(Collectives& c) {
  for (int root = 0; root < c.size(); ++root) {
    for (std::size_t bytes : std::vector<std::size_t>{0, 13, 65537}) {
      SCOPED_TRACE("broadcast root " + std::to_string(root) + " bytes " + std::to_string(bytes));
      std::vector<std::byte> data(bytes);
      for (std::size_t i = 0; i < bytes; ++i) data[i] = stamp(c.rank(), i);
      c.broadcast(data, root);
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < bytes; ++i) wrong += data[i] != stamp(root, i);
      EXPECT_EQ(wrong, 0u) << "rank " << c.rank();
    }
  }
}

/// Misuse that every rank makes alike (each refuses it locally, nothing is sent), then a
/// collective that must still work.
inline void check_misuse(Collectives& c) {
  const int n = c.size();
  const std::string who = "rank " + std::to_string(c.rank()) + " of " + std::to_string(n);
  std::vector<float> a(6), b(6 * static_cast<std::size_t>(n) + 1);
  try {
    all_gather<float>(c, a, b);
    ADD_FAILURE() << "all_gather with a wrong recv size did not throw";
  } catch (const UsageError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("all_gather (" + who), std::string::npos) << what;
    EXPECT_NE(what.find("recv is " + std::to_string(b.size() * 4) + " bytes"), std::string::npos)
        << what;
  }
  EXPECT_THROW(reduce_scatter<float>(c, b, a, ReduceOp::kSum), UsageError);
  std::vector<std::int32_t> ints(3);
  try {
    all_reduce<std::int32_t>(c, ints, ReduceOp::kAvg);
    ADD_FAILURE() << "an integer average did not throw";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("avg of i32 would round"), std::string::npos) << e.what();
  }
  // bf16 and fp16 are element types of zinf::cuda's Communicator too, but not reduced here.
  std::vector<std::uint16_t> halves(4);
  try {
    c.all_reduce(std::as_writable_bytes(std::span<std::uint16_t>(halves)), ElementType::kBF16,
                 ReduceOp::kSum);
    ADD_FAILURE() << "a bf16 all_reduce did not throw";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("bf16 is not reduced here"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(c.all_reduce(std::as_writable_bytes(std::span<float>(a)).subspan(0, 7),
                            ElementType::kF32, ReduceOp::kSum),
               UsageError);
  EXPECT_THROW(broadcast<float>(c, a, n), UsageError);
  EXPECT_THROW(broadcast<float>(c, a, -1), UsageError);
  // Overlapping buffers that are not an in-place all-gather.
  std::vector<std::byte> bytes(4 * static_cast<std::size_t>(n) + 1);
  EXPECT_THROW(
      c.all_gather(std::span<const std::byte>(bytes).subspan(1, 4),
                   std::span<std::byte>(bytes).subspan(0, 4 * static_cast<std::size_t>(n))),
      UsageError);
  // Still usable.
  std::vector<float> one{1.0f};
  all_reduce<float>(c, one, ReduceOp::kSum);
  EXPECT_EQ(one[0], static_cast<float>(n));
  c.barrier();
}

}  // namespace zinf::dist::test
