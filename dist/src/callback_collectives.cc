// SPDX-License-Identifier: Apache-2.0
// CallbackCollectives: the Collectives contract over the caller's std::function primitives.
// Checks each call, runs the callback, turns what it throws into a CollectiveError and fails
// the object; reduce_scatter is emulated with all_reduce where the caller has none.
#include "zinf/dist/callback_collectives.h"

#include <cstring>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "collectives_check.h"
#include "zinf/common/error.h"

namespace zinf::dist {
namespace {

class CallbackCollectives final : public Collectives {
 public:
  explicit CallbackCollectives(CollectiveCallbacks callbacks) : cb_(std::move(callbacks)) {}

  std::string_view name() const noexcept override { return cb_.name; }
  int rank() const noexcept override { return cb_.rank; }
  int size() const noexcept override { return cb_.size; }
  MemoryKind memory() const noexcept override { return cb_.memory; }

  void all_gather(std::span<const std::byte> send, std::span<std::byte> recv) override {
    failed_.throw_if_failed();
    detail::check_all_gather(who(), send, recv);
    run("all_gather", send.size(), [&] { cb_.all_gather(send, recv); });
  }

  void reduce_scatter(std::span<const std::byte> send, std::span<std::byte> recv, ElementType type,
                      ReduceOp op) override {
    failed_.throw_if_failed();
    detail::check_reduce_scatter(who(), send, recv, type, op);
    const ReduceOp wire = on_wire(op);
    run("reduce_scatter", send.size(), [&] {
      if (cb_.reduce_scatter) {
        cb_.reduce_scatter(send, recv, type, wire);
      } else {
        // Emulated: every rank reduces the whole buffer, then keeps its own block. A copy,
        // because send is const and the caller may still need it.
        std::vector<std::byte> whole(send.begin(), send.end());
        cb_.all_reduce(whole, type, wire);
        const std::size_t offset = static_cast<std::size_t>(cb_.rank) * recv.size();
        if (!recv.empty()) std::memcpy(recv.data(), whole.data() + offset, recv.size());
      }
    });
    if (op != wire) detail::divide_in_place(recv, type, cb_.size);
  }

  void all_reduce(std::span<std::byte> data, ElementType type, ReduceOp op) override {
    failed_.throw_if_failed();
    detail::check_all_reduce(who(), data, type, op);
    const ReduceOp wire = on_wire(op);
    run("all_reduce", data.size(), [&] { cb_.all_reduce(data, type, wire); });
    if (op != wire) detail::divide_in_place(data, type, cb_.size);
  }

  void broadcast(std::span<std::byte> data, int root) override {
    failed_.throw_if_failed();
    detail::check_broadcast(who(), root);
    run("broadcast", data.size(), [&] { cb_.broadcast(data, root); });
  }

  void barrier() override {
    failed_.throw_if_failed();
    run("barrier", 0, [&] { cb_.barrier(); });
  }

 private:
  // Host memory: an average is a sum divided here (gloo, for one, has no average). Device
  // memory cannot be divided on the host, so there the callback gets kAvg itself.
  ReduceOp on_wire(ReduceOp op) const {
    return op == ReduceOp::kAvg && cb_.memory == MemoryKind::kHost ? ReduceOp::kSum : op;
  }

  detail::Caller who() const { return {cb_.name, cb_.rank, cb_.size}; }

  // Runs one callback. Whatever it throws means the ranks may now disagree, so the object is
  // failed either way; a zinf::Error keeps its type, anything else is named as this collective.
  template <class F>
  void run(std::string_view op, std::size_t bytes, F&& call) {
    try {
      call();
    } catch (const Error&) {
      failed_.fail(status_from_current_exception());
      throw;
    } catch (const std::exception& e) {
      CollectiveError error = detail::collective_error(
          who(), op, bytes, ErrorCode::kIo, std::string("the callback threw: ") + e.what());
      failed_.fail(error.status());
      throw error;
    } catch (...) {
      CollectiveError error = detail::collective_error(who(), op, bytes, ErrorCode::kIo,
                                                       "the callback threw a non-exception");
      failed_.fail(error.status());
      throw error;
    }
  }

  CollectiveCallbacks cb_;
  detail::FailedState failed_;
};

}  // namespace

std::unique_ptr<Collectives> make_callback_collectives(CollectiveCallbacks callbacks) {
  std::string missing;
  auto need = [&missing](bool present, const char* what) {
    if (present) return;
    if (!missing.empty()) missing += ", ";
    missing += what;
  };
  need(static_cast<bool>(callbacks.all_gather), "all_gather");
  need(static_cast<bool>(callbacks.all_reduce), "all_reduce");
  need(static_cast<bool>(callbacks.broadcast), "broadcast");
  need(static_cast<bool>(callbacks.barrier), "barrier");
  if (!missing.empty()) {
    throw UsageError("callback collectives '" + callbacks.name +
                     "': missing callbacks: " + missing);
  }
  if (callbacks.size < 1 || callbacks.rank < 0 || callbacks.rank >= callbacks.size) {
    throw UsageError("callback collectives '" + callbacks.name + "': rank " +
                     std::to_string(callbacks.rank) + " is outside [0, size " +
                     std::to_string(callbacks.size) + ")");
  }
  if (callbacks.memory == MemoryKind::kDevice && !callbacks.reduce_scatter) {
    throw UsageError("callback collectives '" + callbacks.name +
                     "': device memory needs a reduce_scatter callback (the emulation copies "
                     "through host memory)");
  }
  return std::make_unique<CallbackCollectives>(std::move(callbacks));
}

}  // namespace zinf::dist
