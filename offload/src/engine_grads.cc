// SPDX-License-Identifier: Apache-2.0
// OffloadEngine's gradient intake: set_gradients from host memory, and from device memory
// through zinf.grad_staging_buffers pinned buffers (a copy stream behind the compute stream,
// each buffer free again once the optimizer has read it). On arrival each layer's update is
// queued at once; in the staged mode the gradients are staged for step().
#include <algorithm>
#include <chrono>
#include <string>
#include <utility>

#include "engine_impl.h"
#include "zinf/common/align.h"
#include "zinf/common/error.h"
#include "zinf/common/log.h"

namespace zinf::offload {

using detail::in_quotes;
using Clock = detail::EngineClock;

OffloadEngine::Impl::Layer& OffloadEngine::Impl::check_gradients(std::size_t index,
                                                                 std::size_t size,
                                                                 const char* unit) {
  check_usable();
  Layer& st = layer_at(index, "set_gradients");
  const LayerSpec& spec = layers[index];
  if (st.fetched) {
    throw UsageError("OffloadEngine::set_gradients: layer " + in_quotes(spec.name) +
                     " is fetched (release it first)");
  }
  if (st.has_grads) {
    throw UsageError("OffloadEngine::set_gradients: layer " + in_quotes(spec.name) +
                     " already has gradients in this step");
  }
  if (!st.master_set) {
    throw UsageError("OffloadEngine::set_gradients: layer " + in_quotes(spec.name) +
                     " has no weights yet (set_master_weights or load first)");
  }
  if (size != spec.numel) {
    throw UsageError("OffloadEngine::set_gradients: layer " + in_quotes(spec.name) + " has " +
                     std::to_string(spec.numel) + " elements, got " + std::to_string(size) + unit);
  }
  return st;
}

void OffloadEngine::Impl::queue_update(std::size_t index, adam::GradView grads, GradHooks hooks) {
  if (!step_open) {
    optimizer->begin_step();
    step_open = true;
  }
  params->queue_update(*optimizer, index, grads, std::move(hooks));
  state[index].has_grads = true;
}

std::size_t OffloadEngine::Impl::acquire_grad_slot() {
  if (grad_slots.empty()) {
    // First device-gradient call: the staging the budget check counted, pinned for DMA.
    swap::BufferPoolOptions bo;
    bo.budget_bytes = grad_slot_bytes * config.zinf.grad_staging_buffers;
    bo.alignment = static_cast<std::uint32_t>(detail::kHostAlign);
    bo.huge_pages = true;
    auto pool = std::make_unique<swap::BufferPool>(bo);
    cuda::PinnedRegistration pinned = device.register_host(pool->arena());
    std::vector<GradSlot> slots(config.zinf.grad_staging_buffers);
    for (auto& s : slots) {
      s.buffer = pool->acquire(grad_slot_bytes);
      s.copied = device.create_event();
    }
    copy_stream = device.create_stream();
    grads_written = device.create_event();
    grad_pool = std::move(pool);
    grad_pinned = std::move(pinned);
    grad_slots = std::move(slots);
  }
  std::unique_lock lk(grad_mu);
  const auto free_slot = [&] {
    return std::find_if(grad_slots.begin(), grad_slots.end(),
                        [](const GradSlot& s) { return !s.busy; });
  };
  if (free_slot() == grad_slots.end()) {
    // Every buffer holds gradients the optimizer has yet to read; it reads them in order.
    const auto t0 = Clock::now();
    grad_cv.wait(lk, [&] { return free_slot() != grad_slots.end(); });
    grad_wait_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
  }
  const auto it = free_slot();
  it->busy = true;
  return static_cast<std::size_t>(it - grad_slots.begin());
}

void OffloadEngine::Impl::release_grad_slot(std::size_t slot) {
  {
    std::lock_guard lk(grad_mu);
    grad_slots[slot].busy = false;
  }
  grad_cv.notify_all();
}

void OffloadEngine::set_gradients(std::size_t index, adam::GradView grads) {
  Impl& m = *impl_;
  check_buffer_type(grads.dtype, "OffloadEngine::set_gradients: gradients");
  Impl::Layer& st = m.check_gradients(index, grads.data == nullptr ? 0 : grads.size, " gradients");
  if (m.stage) {
    m.stage->stage(index, grads);  // staged mode: a copy; the update waits for step()
    st.has_grads = true;
    return;
  }
  m.queue_update(index, grads, {});
}

void OffloadEngine::set_gradients(std::size_t index, cuda::DeviceSpan grads, ElementType dtype) {
  Impl& m = *impl_;
  check_buffer_type(dtype, "OffloadEngine::set_gradients: gradients in device memory");
  const std::size_t elem = element_size(dtype);
  Impl::Layer& st = m.check_gradients(index, grads.size() / elem, " gradients in device memory");
  const LayerSpec& spec = m.layers[index];
  if (grads.size() % elem != 0 || grads.empty()) {
    throw UsageError("OffloadEngine::set_gradients: layer " + in_quotes(spec.name) + " has " +
                     std::to_string(spec.numel) + " elements, got " + std::to_string(grads.size()) +
                     " bytes of " + std::string(element_type_name(dtype)) +
                     " gradients in device memory");
  }
  if (grads.device() != &m.device) {
    throw UsageError("OffloadEngine::set_gradients: layer " + in_quotes(spec.name) +
                     ": the gradients are not in the memory of device " +
                     std::string(m.device.name()));
  }
  if (m.config.zinf.grad_staging_buffers == 0) {
    throw UsageError(
        "OffloadEngine::set_gradients: gradients in device memory need "
        "zinf.grad_staging_buffers >= 1 (it is 0: host gradients only)");
  }
  const std::size_t slot = m.acquire_grad_slot();
  Impl::GradSlot& s = m.grad_slots[slot];
  try {
    // After the compute that wrote the gradients, on the copy stream: backward goes on.
    m.device.record(m.grads_written, m.compute);
    m.device.wait(m.copy_stream, m.grads_written);
    m.device.copy_to_host(m.copy_stream, s.buffer.span().first(grads.size()), grads);
    m.device.record(s.copied, m.copy_stream);
    m.grad_to_host += grads.size();
    if (m.stage) {
      // Staged mode: the squares are summed from the copy, so the host waits for it to land
      // (this mode does not overlap the copies with backward), then the buffer is free.
      s.copied.synchronize();
      m.stage->stage(index, {s.buffer.data(), static_cast<std::size_t>(spec.numel), dtype});
      m.release_grad_slot(slot);
      st.has_grads = true;
      return;
    }
    cuda::Event* copied = &s.copied;
    m.queue_update(
        index, {s.buffer.data(), static_cast<std::size_t>(spec.numel), dtype},
        {[copied] { copied->synchronize(); }, [&m, slot] { m.release_grad_slot(slot); }});
  } catch (...) {
    // Nothing was queued (the hooks run only for a queued update): the buffer is free once its
    // copy, if one was enqueued, is over.
    try {
      s.copied.synchronize();
    } catch (const std::exception& e) {
      // The error being thrown is the one the caller needs; this one only frees the buffer.
      log(LogLevel::kDebug, std::string("OffloadEngine::set_gradients: staging copy: ") + e.what());
    }
    m.release_grad_slot(slot);
    throw;
  }
}

}  // namespace zinf::offload
