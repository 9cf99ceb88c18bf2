// SPDX-License-Identifier: Apache-2.0
// NcclCommunicator: the Communicator over NCCL on a CudaDevice's streams. Every NCCL call is
// checked; a failure names the call, the error and NCCL's last message. Private to zinf::cuda;
// built only where NCCL is found (ZINF_HAVE_NCCL).
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <string>

#include "cuda_check.h"
#include "cuda_device.h"
#include "zinf/common/error.h"
#include "zinf/common/log.h"
#include "zinf/cuda/communicator.h"

namespace zinf::cuda {
namespace detail {
namespace {

static_assert(sizeof(CommunicatorId{}.bytes) == sizeof(ncclUniqueId),
              "CommunicatorId holds an ncclUniqueId");

std::string nccl_error_text(ncclResult_t rc, const char* call, ncclComm_t comm) {
  std::string text = std::string(call) + " failed: " + ncclGetErrorString(rc);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && last[0] != '\0') text += " (" + std::string(last) + ")";
  return text;
}

// Throws DeviceError for a failed NCCL call. Asynchronous errors of enqueued collectives
// surface on the stream like any device error.
#define ZINF_NCCL_CHECK(call, comm)                                                         \
  do {                                                                                      \
    const ncclResult_t zinf_nccl_rc_ = (call);                                              \
    if (zinf_nccl_rc_ != ncclSuccess) [[unlikely]]                                          \
      throw DeviceError(::zinf::cuda::detail::nccl_error_text(zinf_nccl_rc_, #call, comm)); \
  } while (0)

ncclDataType_t nccl_type(ElementType type) {
  switch (type) {
    case ElementType::kF32: return ncclFloat32;
    case ElementType::kF16: return ncclFloat16;
    case ElementType::kBF16: return ncclBfloat16;
    case ElementType::kU8: return ncclUint8;
    case ElementType::kF64: return ncclFloat64;
    case ElementType::kI32: return ncclInt32;
    case ElementType::kI64: return ncclInt64;
  }
  return ncclUint8;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kAvg: return ncclAvg;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kMin: return ncclMin;
  }
  return ncclSum;
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(CudaDevice& device, const CommunicatorOptions& options)
      : device_(device), rank_(options.rank), world_size_(options.world_size) {
    ncclUniqueId id;
    std::memcpy(&id, options.id.bytes.data(), sizeof id);
    ZINF_CUDA_CHECK(cudaSetDevice(device_.index()));
    ZINF_NCCL_CHECK(ncclCommInitRank(&comm_, world_size_, id, rank_), nullptr);
  }

  ~NcclCommunicator() override {
    if (comm_ == nullptr) return;
    ZINF_CUDA_CHECK_NOTHROW(cudaSetDevice(device_.index()));
    const ncclResult_t rc = ncclCommDestroy(comm_);
    if (rc != ncclSuccess) {
      log(LogLevel::kWarning, nccl_error_text(rc, "ncclCommDestroy(comm_)", nullptr));
    }
  }

  std::string_view name() const noexcept override { return "nccl"; }
  int rank() const noexcept override { return rank_; }
  int world_size() const noexcept override { return world_size_; }

  void all_gather(StreamRef stream, DeviceSpan send, DeviceSpan recv) override {
    check(stream, send, recv, "all_gather");
    const auto world = static_cast<std::size_t>(world_size_);
    if (recv.size() != send.size() * world) {
      throw UsageError("all_gather: recv is " + std::to_string(recv.size()) +
                       " bytes, expected send (" + std::to_string(send.size()) +
                       ") x world_size (" + std::to_string(world_size_) + ")");
    }
    ZINF_CUDA_CHECK(cudaSetDevice(device_.index()));
    ZINF_NCCL_CHECK(ncclAllGather(send.data(), recv.data(), send.size(), ncclUint8, comm_,
                                  CudaDevice::native_stream(stream)),
                    comm_);
  }

  void reduce_scatter(StreamRef stream, DeviceSpan send, DeviceSpan recv, ElementType type,
                      ReduceOp op) override {
    check(stream, send, recv, "reduce_scatter");
    const auto world = static_cast<std::size_t>(world_size_);
    if (send.size() != recv.size() * world) {
      throw UsageError("reduce_scatter: send is " + std::to_string(send.size()) +
                       " bytes, expected recv (" + std::to_string(recv.size()) +
                       ") x world_size (" + std::to_string(world_size_) + ")");
    }
    if (recv.size() % element_size(type) != 0) {
      throw UsageError("reduce_scatter: recv is " + std::to_string(recv.size()) +
                       " bytes, not a whole number of " + std::to_string(element_size(type)) +
                       "-byte elements");
    }
    ZINF_CUDA_CHECK(cudaSetDevice(device_.index()));
    ZINF_NCCL_CHECK(
        ncclReduceScatter(send.data(), recv.data(), recv.size() / element_size(type),
                          nccl_type(type), nccl_op(op), comm_, CudaDevice::native_stream(stream)),
        comm_);
  }

  void all_reduce(StreamRef stream, DeviceSpan data, ElementType type, ReduceOp op) override {
    check(stream, data, data, "all_reduce");
    if (data.size() % element_size(type) != 0) {
      throw UsageError("all_reduce: data is " + std::to_string(data.size()) +
                       " bytes, not a whole number of " + std::to_string(element_size(type)) +
                       "-byte elements");
    }
    ZINF_CUDA_CHECK(cudaSetDevice(device_.index()));
    ZINF_NCCL_CHECK(
        ncclAllReduce(data.data(), data.data(), data.size() / element_size(type), nccl_type(type),
                      nccl_op(op), comm_, CudaDevice::native_stream(stream)),
        comm_);
  }

  void broadcast(StreamRef stream, DeviceSpan data, int root) override {
    check(stream, data, data, "broadcast");
    if (root < 0 || root >= world_size_) {
      throw UsageError("broadcast: root " + std::to_string(root) + " is outside [0, " +
                       std::to_string(world_size_) + ")");
    }
    ZINF_CUDA_CHECK(cudaSetDevice(device_.index()));
    ZINF_NCCL_CHECK(ncclBroadcast(data.data(), data.data(), data.size(), ncclUint8, root, comm_,
                                  CudaDevice::native_stream(stream)),
                    comm_);
  }

 private:
  void check(StreamRef stream, DeviceSpan send, DeviceSpan recv, const char* op) const {
    if (stream.empty() || stream.device() != &device_) {
      throw UsageError(std::string(op) + ": the stream is not a stream of " +
                       std::string(device_.name()));
    }
    if (send.device() != &device_ || recv.device() != &device_) {
      throw UsageError(std::string(op) + ": send and recv must be memory of " +
                       std::string(device_.name()));
    }
  }

  CudaDevice& device_;
  const int rank_;
  const int world_size_;
  ncclComm_t comm_ = nullptr;
};

}  // namespace
}  // namespace detail

std::string nccl_unavailable_reason() { return {}; }

CommunicatorId make_communicator_id() {
  ncclUniqueId id;
  ZINF_NCCL_CHECK(ncclGetUniqueId(&id), nullptr);
  CommunicatorId out;
  std::memcpy(out.bytes.data(), &id, sizeof id);
  return out;
}

std::unique_ptr<Communicator> make_nccl_communicator(Device& device,
                                                     const CommunicatorOptions& options) {
  if (device.kind() != DeviceKind::kCuda) {
    throw UsageError("the NCCL communicator needs a CUDA device; '" + std::string(device.name()) +
                     "' is not one");
  }
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    throw UsageError("communicator rank " + std::to_string(options.rank) + " is outside [0, " +
                     std::to_string(options.world_size) + ")");
  }
  return std::make_unique<detail::NcclCommunicator>(static_cast<detail::CudaDevice&>(device),
                                                    options);
}

}  // namespace zinf::cuda
