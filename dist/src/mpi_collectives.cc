// SPDX-License-Identifier: Apache-2.0
// MpiCollectives: the Collectives contract over a duplicate of the caller's MPI communicator.
// Every collective is the nonblocking MPI_I* form polled with MPI_Test until a deadline, and
// every MPI return code is checked (the duplicate has MPI_ERRORS_RETURN). Private to
// zinf::dist; built only where MPI is found (ZINF_HAVE_MPI).
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "collectives_check.h"
#include "zinf/common/error.h"
#include "zinf/common/log.h"
#include "zinf/dist/mpi_collectives.h"

namespace zinf::dist {
namespace {

using Clock = std::chrono::steady_clock;

std::string mpi_error_text(int rc) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  if (MPI_Error_string(rc, text, &length) != MPI_SUCCESS) return "MPI error " + std::to_string(rc);
  return std::string(text, static_cast<std::size_t>(length)) + " (MPI error " + std::to_string(rc) +
         ")";
}

MPI_Datatype mpi_type(ElementType type) {
  switch (type) {
    case ElementType::kF32: return MPI_FLOAT;
    case ElementType::kF64: return MPI_DOUBLE;
    case ElementType::kI32: return MPI_INT32_T;
    case ElementType::kI64: return MPI_INT64_T;
    case ElementType::kU8: return MPI_UINT8_T;
    case ElementType::kBF16:  // refused by the argument checks (collectives_check.h)
    case ElementType::kF16: break;
  }
  return MPI_BYTE;
}

// kAvg goes over the wire as a sum (MPI has no average) and is divided afterwards.
MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return MPI_SUM;
    case ReduceOp::kAvg: return MPI_SUM;
    case ReduceOp::kMax: return MPI_MAX;
    case ReduceOp::kMin: return MPI_MIN;
  }
  return MPI_SUM;
}

// Polls `request` with MPI_Test until it completes or `deadline` passes. Returns MPI_SUCCESS,
// MPI_ERR_PENDING for the deadline, or MPI_Test's error. The first polls spin (a collective
// between live ranks usually completes within microseconds), then the pause doubles up to 1 ms
// so that a rank waiting on a slow peer does not take a core from it; MPI progresses only
// inside MPI calls, so the pause is also the most a completion can be noticed late. `between`
// (if any) runs before each pause: the adapter answers its peers' liveness probes there.
template <class Between>
int poll_until(MPI_Request& request, Clock::time_point deadline, Between&& between) {
  constexpr int kSpinPolls = 64;
  constexpr auto kMaxPause = std::chrono::microseconds(1000);
  auto pause = std::chrono::microseconds(1);
  for (int polls = 0;; ++polls) {
    int done = 0;
    const int rc = MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return rc;
    if (done) return MPI_SUCCESS;
    const auto now = Clock::now();
    if (now >= deadline) return MPI_ERR_PENDING;
    if (polls < kSpinPolls) continue;
    between();
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - now));
    pause = std::min(pause * 2, kMaxPause);
  }
}

int poll_until(MPI_Request& request, Clock::time_point deadline) {
  return poll_until(request, deadline, [] {});
}

// The liveness probe's messages, on a communicator of their own (never matched by a
// collective's traffic): a rank whose collective timed out sends kPing to every other rank,
// and every rank polling a collective answers kPong.
constexpr int kPingTag = 1;
constexpr int kPongTag = 2;
// How long a timed-out rank waits for the answers: ranks that are alive and inside a
// collective answer within a poll (at most 1 ms late); this leaves room for a loaded machine.
constexpr auto kProbeGrace = std::chrono::milliseconds(2000);

std::string rank_list(const std::vector<int>& ranks) {
  std::string text;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    text += (i == 0 ? "" : i + 1 == ranks.size() ? " and " : ", ") + std::to_string(ranks[i]);
  }
  return text;
}

// `peers`: what the liveness probe found (MpiCollectives::probe_peers), or "" without one.
std::string timeout_text(std::string_view op, std::chrono::milliseconds timeout,
                         const std::string& peers = {}) {
  return "timed out after " + std::to_string(timeout.count()) + " ms waiting for the other ranks" +
         " in " + std::string(op) +
         (peers.empty() ? " (a peer died, hangs, or called another collective)" : "; " + peers) +
         "; MPI cannot cancel it: the communicator is unusable and the job must abort "
         "(MPI_Abort)";
}

class MpiCollectives final : public Collectives {
 public:
  MpiCollectives(MPI_Comm comm, MPI_Comm probe, int rank, int size,
                 std::chrono::milliseconds timeout)
      : comm_(comm), probe_(probe), rank_(rank), size_(size), timeout_(timeout) {}

  ~MpiCollectives() override {
    // A failed communicator may still have a collective in flight, and freeing it then is
    // undefined; after MPI_Finalize nothing may be freed. Both are left to the process's end.
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (failed_.failed() || finalized) return;
    for (MPI_Comm* c : {&comm_, &probe_}) {
      if (const int rc = MPI_Comm_free(c); rc != MPI_SUCCESS) {
        log(LogLevel::kWarning, "mpi collectives: MPI_Comm_free failed: " + mpi_error_text(rc));
      }
    }
  }

  std::string_view name() const noexcept override { return "mpi"; }
  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return size_; }
  MemoryKind memory() const noexcept override { return MemoryKind::kHost; }

  void all_gather(std::span<const std::byte> send, std::span<std::byte> recv) override {
    failed_.throw_if_failed();
    detail::check_all_gather(who(), send, recv);
    const int count = to_count("all_gather", send.size(), "send bytes");
    const bool in_place =
        send.data() == recv.data() + static_cast<std::size_t>(rank_) * send.size();
    MPI_Request request = MPI_REQUEST_NULL;
    const int rc = MPI_Iallgather(in_place ? MPI_IN_PLACE : send.data(), count, MPI_BYTE,
                                  recv.data(), count, MPI_BYTE, comm_, &request);
    finish("all_gather", send.size(), "MPI_Iallgather", rc, request);
  }

  void reduce_scatter(std::span<const std::byte> send, std::span<std::byte> recv, ElementType type,
                      ReduceOp op) override {
    failed_.throw_if_failed();
    detail::check_reduce_scatter(who(), send, recv, type, op);
    const int count = to_count("reduce_scatter", recv.size() / element_size(type), "recv elements");
    MPI_Request request = MPI_REQUEST_NULL;
    const int rc = MPI_Ireduce_scatter_block(send.data(), recv.data(), count, mpi_type(type),
                                             mpi_op(op), comm_, &request);
    finish("reduce_scatter", send.size(), "MPI_Ireduce_scatter_block", rc, request);
    if (op == ReduceOp::kAvg) detail::divide_in_place(recv, type, size_);
  }

  void all_reduce(std::span<std::byte> data, ElementType type, ReduceOp op) override {
    failed_.throw_if_failed();
    detail::check_all_reduce(who(), data, type, op);
    const int count = to_count("all_reduce", data.size() / element_size(type), "elements");
    MPI_Request request = MPI_REQUEST_NULL;
    const int rc = MPI_Iallreduce(MPI_IN_PLACE, data.data(), count, mpi_type(type), mpi_op(op),
                                  comm_, &request);
    finish("all_reduce", data.size(), "MPI_Iallreduce", rc, request);
    if (op == ReduceOp::kAvg) detail::divide_in_place(data, type, size_);
  }

  void broadcast(std::span<std::byte> data, int root) override {
    failed_.throw_if_failed();
    detail::check_broadcast(who(), root);
    const int count = to_count("broadcast", data.size(), "bytes");
    MPI_Request request = MPI_REQUEST_NULL;
    const int rc = MPI_Ibcast(data.data(), count, MPI_BYTE, root, comm_, &request);
    finish("broadcast", data.size(), "MPI_Ibcast", rc, request);
  }

  void barrier() override {
    failed_.throw_if_failed();
    MPI_Request request = MPI_REQUEST_NULL;
    const int rc = MPI_Ibarrier(comm_, &request);
    finish("barrier", 0, "MPI_Ibarrier", rc, request);
  }

 private:
  detail::Caller who() const { return {"mpi", rank_, size_}; }

  int to_count(std::string_view op, std::size_t count, std::string_view what) const {
    if (count > static_cast<std::size_t>(INT_MAX)) {
      throw UsageError(std::string(op) + " (rank " + std::to_string(rank_) + " of " +
                       std::to_string(size_) + ", backend mpi): " + std::to_string(count) + " " +
                       std::string(what) + " exceed MPI's count limit " + std::to_string(INT_MAX) +
                       "; split the call");
    }
    return static_cast<int>(count);
  }

  // Waits for the collective `start_call` began (returning `start_rc`) until the timeout;
  // throws CollectiveError and fails the object if it could not start, failed or timed out.
  void finish(std::string_view op, std::size_t bytes, const char* start_call, int start_rc,
              MPI_Request& request) {
    if (start_rc != MPI_SUCCESS) {
      fail(op, bytes, ErrorCode::kIo, std::string(start_call) + ": " + mpi_error_text(start_rc));
    }
    const int rc = poll_until(request, Clock::now() + timeout_, [this] { answer_probes(); });
    if (rc == MPI_ERR_PENDING) {
      fail(op, bytes, ErrorCode::kTimedOut, timeout_text(op, timeout_, probe_peers()));
    }
    if (rc != MPI_SUCCESS) {
      fail(op, bytes, ErrorCode::kIo, std::string("MPI_Test: ") + mpi_error_text(rc));
    }
  }

  // Answers every liveness probe that has arrived. Best effort: an error here (a peer gone
  // while its probe was in flight) only means one answer fewer.
  void answer_probes() {
    for (;;) {
      int arrived = 0;
      MPI_Status status;
      if (MPI_Iprobe(MPI_ANY_SOURCE, kPingTag, probe_, &arrived, &status) != MPI_SUCCESS ||
          !arrived) {
        return;
      }
      unsigned char ping = 0;
      if (MPI_Recv(&ping, 1, MPI_BYTE, status.MPI_SOURCE, kPingTag, probe_, MPI_STATUS_IGNORE) !=
          MPI_SUCCESS) {
        return;
      }
      // One byte goes out eagerly; the request is released at once and MPI completes it.
      MPI_Request request = MPI_REQUEST_NULL;
      if (MPI_Isend(&kProbeByte, 1, MPI_BYTE, status.MPI_SOURCE, kPongTag, probe_, &request) ==
          MPI_SUCCESS) {
        MPI_Request_free(&request);
      }
    }
  }

  // After a timeout: which peers are still there? Sends a probe to every other rank and waits
  // up to kProbeGrace for the answers, which ranks inside a collective (their own, or the
  // same one timing out) give as they poll. Returns the sentence for the error: the ranks that
  // did not answer (a lost node, a killed process, or a rank busy outside any collective) or,
  // if all did, that the cause is a rank in another collective or one slower than the timeout.
  std::string probe_peers() {
    std::vector<bool> answered(static_cast<std::size_t>(size_), false);
    answered[static_cast<std::size_t>(rank_)] = true;
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_) continue;
      MPI_Request request = MPI_REQUEST_NULL;
      if (MPI_Isend(&kProbeByte, 1, MPI_BYTE, peer, kPingTag, probe_, &request) == MPI_SUCCESS) {
        MPI_Request_free(&request);
      }
    }
    const auto deadline = Clock::now() + kProbeGrace;
    int missing = size_ - 1;
    while (missing > 0 && Clock::now() < deadline) {
      answer_probes();
      int arrived = 0;
      MPI_Status status;
      if (MPI_Iprobe(MPI_ANY_SOURCE, kPongTag, probe_, &arrived, &status) != MPI_SUCCESS) break;
      if (!arrived) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        continue;
      }
      unsigned char pong = 0;
      if (MPI_Recv(&pong, 1, MPI_BYTE, status.MPI_SOURCE, kPongTag, probe_, MPI_STATUS_IGNORE) !=
          MPI_SUCCESS) {
        break;
      }
      auto seen = answered.begin() + status.MPI_SOURCE;
      if (!*seen) --missing;
      *seen = true;
    }
    std::vector<int> silent;
    for (int peer = 0; peer < size_; ++peer) {
      if (!answered[static_cast<std::size_t>(peer)]) silent.push_back(peer);
    }
    const std::string grace = std::to_string(kProbeGrace.count()) + " ms";
    if (silent.empty()) {
      return "every other rank answered a liveness probe, so one of them is in another "
             "collective or slower than the timeout";
    }
    return std::string(silent.size() == 1 ? "rank " : "ranks ") + rank_list(silent) +
           " did not answer a liveness probe within " + grace +
           " (lost: its node or process is gone, or it is busy outside any collective)";
  }

  [[noreturn]] void fail(std::string_view op, std::size_t bytes, ErrorCode code,
                         const std::string& detail) {
    CollectiveError error = detail::collective_error(who(), op, bytes, code, detail);
    failed_.fail(error.status());
    throw error;
  }

  static constexpr unsigned char kProbeByte = 0;

  MPI_Comm comm_;
  MPI_Comm probe_;  // the liveness probes' (answer_probes, probe_peers)
  const int rank_;
  const int size_;
  const std::chrono::milliseconds timeout_;
  detail::FailedState failed_;
};

}  // namespace

std::string mpi_unavailable_reason() { return {}; }

std::unique_ptr<Collectives> make_mpi_collectives(const MpiCollectivesOptions& options) {
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) {
    throw UsageError(std::string("mpi collectives: MPI is ") +
                     (finalized ? "already finalized" : "not initialized") +
                     "; call MPI_Init before make_mpi_collectives and MPI_Finalize after "
                     "destroying it");
  }
  if (options.timeout.count() <= 0) {
    throw UsageError("mpi collectives: timeout must be positive, not " +
                     std::to_string(options.timeout.count()) + " ms");
  }
  const MPI_Comm parent = options.fortran_comm
                              ? MPI_Comm_f2c(static_cast<MPI_Fint>(*options.fortran_comm))
                              : MPI_COMM_WORLD;
  const std::string handle =
      "mpi collectives: fortran_comm " + std::to_string(options.fortran_comm.value_or(-1));
  if (parent == MPI_COMM_NULL) {
    throw UsageError(handle + " is MPI_COMM_NULL; pass a communicator of the ranks (e.g. " +
                     "MPI_Comm_c2f(MPI_COMM_WORLD))");
  }
  // Where MPI_Comm is a pointer (Open MPI), MPI_Comm_f2c answers a handle that names no
  // communicator with a null pointer, and passing that on would raise MPI_COMM_WORLD's error
  // handler (by default: abort the job) instead of returning an error.
  bool named = true;
  if constexpr (std::is_pointer_v<MPI_Comm>) named = parent != nullptr;
  int rank = 0;
  int size = 0;
  int inter = 0;
  if (!named || MPI_Comm_rank(parent, &rank) != MPI_SUCCESS ||
      MPI_Comm_size(parent, &size) != MPI_SUCCESS ||
      MPI_Comm_test_inter(parent, &inter) != MPI_SUCCESS) {
    throw UsageError(handle + " is not a valid communicator handle");
  }
  if (inter) {
    throw UsageError(handle + " is an intercommunicator; zinf's collectives need an " +
                     "intracommunicator");
  }
  // A duplicate, so that the error handler set below and zinf's traffic never touch the
  // caller's communicator. MPI_Comm_idup rather than MPI_Comm_dup: it is collective too, and a
  // rank that never arrives must fail it within the timeout like any other collective.
  // Two: one for the collectives, one for the liveness probes that name a lost peer.
  const detail::Caller who{"mpi", rank, size};
  const auto deadline = Clock::now() + options.timeout;
  MPI_Comm comms[2] = {MPI_COMM_NULL, MPI_COMM_NULL};
  for (MPI_Comm& comm : comms) {
    MPI_Request request = MPI_REQUEST_NULL;
    int rc = MPI_Comm_idup(parent, &comm, &request);
    if (rc == MPI_SUCCESS) rc = poll_until(request, deadline);
    if (rc == MPI_ERR_PENDING) {
      throw detail::collective_error(who, "comm_dup", 0, ErrorCode::kTimedOut,
                                     timeout_text("comm_dup", options.timeout));
    }
    if (rc == MPI_SUCCESS) rc = MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    if (rc != MPI_SUCCESS) {
      throw detail::collective_error(who, "comm_dup", 0, ErrorCode::kIo,
                                     "duplicating the communicator: " + mpi_error_text(rc));
    }
  }
  return std::make_unique<MpiCollectives>(comms[0], comms[1], rank, size, options.timeout);
}

}  // namespace zinf::dist
