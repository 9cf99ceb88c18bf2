// SPDX-License-Identifier: Apache-2.0
// TicketState's failure record and completion (ticket_state.h).
#include "ticket_state.h"

#include <chrono>
#include <exception>
#include <string>
#include <utility>

#include "zinf/common/log.h"

namespace zinf::swap::detail {

void TicketState::record_failure(const Status& failure) {
  std::lock_guard lock(mu);
  if (status.ok()) status = failure;
}

void TicketState::complete() noexcept {
  completed_at_ns.store(std::chrono::duration_cast<std::chrono::nanoseconds>(
                            std::chrono::steady_clock::now().time_since_epoch())
                            .count(),
                        std::memory_order_release);
  try {
    IoCallback cb = std::move(callback);
    if (cb) {
      Status copy;
      {
        std::lock_guard lock(mu);
        copy = status;
      }
      cb(copy);
    }
  } catch (const std::exception& e) {
    log(LogLevel::kError, std::string("IoEngine completion callback threw (ignored): ") + e.what());
  } catch (...) {
    log(LogLevel::kError, "IoEngine completion callback threw a non-exception (ignored)");
  }
  {
    std::lock_guard lock(mu);
    done = true;
    done_flag.store(true, std::memory_order_release);
  }
  cv.notify_all();
}

}  // namespace zinf::swap::detail
