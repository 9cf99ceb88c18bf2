// SPDX-License-Identifier: Apache-2.0
// NcclCollectives: the blocking Collectives contract over a cuda::Communicator's
// stream-ordered collectives: enqueue, record an event, poll it until the deadline. Built in
// every configuration (it needs only the Communicator interface, not nccl.h), so the host
// simulation's tests exercise it with a stand-in communicator.
#include "zinf/dist/nccl_collectives.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>

#include "collectives_check.h"
#include "zinf/common/error.h"
#include "zinf/cuda/cuda_interop.h"

namespace zinf::dist {
namespace {

using Clock = std::chrono::steady_clock;

class NcclCollectives final : public Collectives {
 public:
  NcclCollectives(cuda::Device& device, cuda::Communicator& communicator, cuda::StreamRef stream,
                  std::chrono::milliseconds timeout)
      : device_(device),
        comm_(communicator),
        stream_(stream),
        timeout_(timeout),
        barrier_(device.allocate(4)),
        done_(device.create_event()) {}

  std::string_view name() const noexcept override { return comm_.name(); }
  int rank() const noexcept override { return comm_.rank(); }
  int size() const noexcept override { return comm_.world_size(); }
  MemoryKind memory() const noexcept override { return MemoryKind::kDevice; }

  void all_gather(std::span<const std::byte> send, std::span<std::byte> recv) override {
    failed_.throw_if_failed();
    detail::check_all_gather(who(), send, recv);
    run("all_gather", send.size(), [&] { comm_.all_gather(stream_, adopt(send), adopt(recv)); });
  }

  void reduce_scatter(std::span<const std::byte> send, std::span<std::byte> recv, ElementType type,
                      ReduceOp op) override {
    failed_.throw_if_failed();
    detail::check_reduce_scatter(who(), send, recv, type, op);
    run("reduce_scatter", send.size(),
        [&] { comm_.reduce_scatter(stream_, adopt(send), adopt(recv), type, op); });
  }

  void all_reduce(std::span<std::byte> data, ElementType type, ReduceOp op) override {
    failed_.throw_if_failed();
    detail::check_all_reduce(who(), data, type, op);
    run("all_reduce", data.size(), [&] { comm_.all_reduce(stream_, adopt(data), type, op); });
  }

  void broadcast(std::span<std::byte> data, int root) override {
    failed_.throw_if_failed();
    detail::check_broadcast(who(), root);
    run("broadcast", data.size(), [&] { comm_.broadcast(stream_, adopt(data), root); });
  }

  void barrier() override {
    failed_.throw_if_failed();
    run("barrier", 0,
        [&] { comm_.all_reduce(stream_, barrier_.span(), ElementType::kI32, ReduceOp::kSum); });
  }

 private:
  detail::Caller who() const { return {comm_.name(), comm_.rank(), comm_.world_size()}; }

  // The Communicator takes DeviceSpans; the contract's spans are addresses of device_'s memory
  // (adopt_device_memory checks the start on CUDA).
  cuda::DeviceSpan adopt(std::span<const std::byte> bytes) const {
    return cuda::adopt_device_memory(device_, const_cast<std::byte*>(bytes.data()), bytes.size());
  }

  // Enqueues through `enqueue`, then waits on an event until the deadline. The first polls
  // spin, then the pause doubles up to 1 ms (the most a completion is noticed late). Whatever
  // fails after the enqueue leaves the ranks in an unknown state, so the object is failed.
  template <class F>
  void run(std::string_view op, std::size_t bytes, F&& enqueue) {
    try {
      enqueue();
      device_.record(done_, stream_);
      const auto deadline = Clock::now() + timeout_;
      auto pause = std::chrono::microseconds(1);
      for (int polls = 0; !done_.query(); ++polls) {
        const auto now = Clock::now();
        if (now >= deadline) {
          throw detail::collective_error(
              who(), op, bytes, ErrorCode::kTimedOut,
              "timed out after " + std::to_string(timeout_.count()) +
                  " ms waiting for the collective on the stream (a peer died, hangs, or called "
                  "another collective; earlier work on the stream counts); it cannot be "
                  "withdrawn: the communicator is unusable and the job must abort");
        }
        if (polls < 64) continue;
        std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - now));
        pause = std::min(pause * 2, std::chrono::microseconds(1000));
      }
    } catch (const UsageError&) {
      throw;  // refused before anything was enqueued (adopt_device_memory): nothing to undo
    } catch (const Error&) {
      failed_.fail(status_from_current_exception());
      throw;
    }
  }

  cuda::Device& device_;
  cuda::Communicator& comm_;
  const cuda::StreamRef stream_;
  const std::chrono::milliseconds timeout_;
  cuda::DeviceBuffer barrier_;
  cuda::Event done_;
  detail::FailedState failed_;
};

}  // namespace

std::unique_ptr<Collectives> make_nccl_collectives(cuda::Device& device,
                                                   cuda::Communicator& communicator,
                                                   cuda::StreamRef stream,
                                                   const NcclCollectivesOptions& options) {
  if (stream.empty() || stream.device() != &device) {
    throw UsageError("nccl collectives: the stream is not a stream of " +
                     std::string(device.name()));
  }
  if (options.timeout.count() <= 0) {
    throw UsageError("nccl collectives: timeout must be positive, not " +
                     std::to_string(options.timeout.count()) + " ms");
  }
  return std::make_unique<NcclCollectives>(device, communicator, stream, options.timeout);
}

}  // namespace zinf::dist
