// SPDX-License-Identifier: Apache-2.0
// The parts of zinf::dist every backend shares (argument checks, errors, the failed state) and
// LocalCollectives, the group of one rank.
#include "zinf/dist/collectives.h"

#include <cstdint>
#include <cstring>
#include <string>

#include "collectives_check.h"
#include "zinf/common/error.h"

namespace zinf::dist {

namespace detail {
namespace {

std::string where(const Caller& who, std::string_view op) {
  return std::string(op) + " (rank " + std::to_string(who.rank) + " of " +
         std::to_string(who.size) + ", backend " + std::string(who.backend) + "): ";
}

bool overlap(std::span<const std::byte> a, std::span<const std::byte> b) {
  if (a.empty() || b.empty()) return false;
  const auto a0 = reinterpret_cast<std::uintptr_t>(a.data());
  const auto b0 = reinterpret_cast<std::uintptr_t>(b.data());
  return a0 < b0 + b.size() && b0 < a0 + a.size();
}

void check_type(const Caller& who, std::string_view op, std::size_t bytes, std::string_view what,
                ElementType type, ReduceOp reduce) {
  if (bytes % element_size(type) != 0) {
    throw UsageError(where(who, op) + std::string(what) + " is " + std::to_string(bytes) +
                     " bytes, not a whole number of " + std::to_string(element_size(type)) +
                     "-byte " + std::string(element_type_name(type)) + " elements");
  }
  if (type == ElementType::kBF16 || type == ElementType::kF16) {
    throw UsageError(where(who, op) + std::string(element_type_name(type)) +
                     " is not reduced here; widen it to fp32 first");
  }
  const bool floating = type == ElementType::kF32 || type == ElementType::kF64;
  if (reduce == ReduceOp::kAvg && !floating) {
    throw UsageError(where(who, op) + "avg of " + std::string(element_type_name(type)) +
                     " would round; average fp32 or fp64, or sum and divide");
  }
}

template <class T>
void divide(std::span<std::byte> data, int divisor) {
  // memcpy per element: the caller's buffer need not be aligned for T.
  const T d = static_cast<T>(divisor);
  for (std::size_t off = 0; off + sizeof(T) <= data.size(); off += sizeof(T)) {
    T v;
    std::memcpy(&v, data.data() + off, sizeof v);
    v /= d;
    std::memcpy(data.data() + off, &v, sizeof v);
  }
}

}  // namespace

void check_all_gather(const Caller& who, std::span<const std::byte> send,
                      std::span<const std::byte> recv) {
  const auto n = static_cast<std::size_t>(who.size);
  if (recv.size() != send.size() * n) {
    throw UsageError(where(who, "all_gather") + "recv is " + std::to_string(recv.size()) +
                     " bytes, expected send (" + std::to_string(send.size()) + ") x size (" +
                     std::to_string(who.size) + ") = " + std::to_string(send.size() * n));
  }
  const bool in_place =
      send.data() == recv.data() + static_cast<std::size_t>(who.rank) * send.size();
  if (!in_place && overlap(send, recv)) {
    throw UsageError(where(who, "all_gather") +
                     "send overlaps recv but is not this rank's block of it (block " +
                     std::to_string(who.rank) + " at offset " +
                     std::to_string(static_cast<std::size_t>(who.rank) * send.size()) + ")");
  }
}

void check_reduce_scatter(const Caller& who, std::span<const std::byte> send,
                          std::span<const std::byte> recv, ElementType type, ReduceOp op) {
  const auto n = static_cast<std::size_t>(who.size);
  if (send.size() != recv.size() * n) {
    throw UsageError(where(who, "reduce_scatter") + "send is " + std::to_string(send.size()) +
                     " bytes, expected recv (" + std::to_string(recv.size()) + ") x size (" +
                     std::to_string(who.size) + ") = " + std::to_string(recv.size() * n));
  }
  check_type(who, "reduce_scatter", recv.size(), "recv", type, op);
  if (overlap(send, recv)) {
    throw UsageError(where(who, "reduce_scatter") + "send (" + std::to_string(send.size()) +
                     " bytes) and recv (" + std::to_string(recv.size()) +
                     " bytes) overlap; give recv its own memory");
  }
}

void check_all_reduce(const Caller& who, std::span<const std::byte> data, ElementType type,
                      ReduceOp op) {
  check_type(who, "all_reduce", data.size(), "data", type, op);
}

void check_broadcast(const Caller& who, int root) {
  if (root < 0 || root >= who.size) {
    throw UsageError(where(who, "broadcast") + "root " + std::to_string(root) + " is outside [0, " +
                     std::to_string(who.size) + ")");
  }
}

CollectiveError collective_error(const Caller& who, std::string_view op, std::size_t bytes,
                                 ErrorCode code, const std::string& detail) {
  return CollectiveError(Status::error(code, "rank " + std::to_string(who.rank) + " of " +
                                                 std::to_string(who.size) + ": " + detail)
                             .with_operation(std::string(op))
                             .with_backend(std::string(who.backend))
                             .with_range(Status::kUnset, bytes));
}

void divide_in_place(std::span<std::byte> data, ElementType type, int divisor) {
  if (type == ElementType::kF32) divide<float>(data, divisor);
  if (type == ElementType::kF64) divide<double>(data, divisor);
}

void FailedState::throw_if_failed() const {
  if (cause_) throw EngineFailed(*cause_);
}

void FailedState::fail(const Status& status) {
  if (!cause_) cause_ = status;
}

}  // namespace detail

namespace {

// Size 1: every collective is the identity, so only the copies between distinct buffers are
// left. The checks still run, so that misuse shows up before the first multi-rank run.
class LocalCollectives final : public Collectives {
 public:
  std::string_view name() const noexcept override { return "local"; }
  int rank() const noexcept override { return 0; }
  int size() const noexcept override { return 1; }
  MemoryKind memory() const noexcept override { return MemoryKind::kHost; }

  void all_gather(std::span<const std::byte> send, std::span<std::byte> recv) override {
    detail::check_all_gather(kWho, send, recv);
    copy(send, recv);
  }
  void reduce_scatter(std::span<const std::byte> send, std::span<std::byte> recv, ElementType type,
                      ReduceOp op) override {
    detail::check_reduce_scatter(kWho, send, recv, type, op);
    copy(send, recv);
  }
  void all_reduce(std::span<std::byte> data, ElementType type, ReduceOp op) override {
    detail::check_all_reduce(kWho, data, type, op);
  }
  void broadcast(std::span<std::byte> /*data*/, int root) override {
    detail::check_broadcast(kWho, root);
  }
  void barrier() override {}

 private:
  static constexpr detail::Caller kWho{"local", 0, 1};

  static void copy(std::span<const std::byte> from, std::span<std::byte> to) {
    if (from.data() != to.data() && !from.empty()) std::memcpy(to.data(), from.data(), from.size());
  }
};

}  // namespace

std::unique_ptr<Collectives> make_local_collectives() {
  return std::make_unique<LocalCollectives>();
}

}  // namespace zinf::dist
