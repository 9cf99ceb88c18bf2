// SPDX-License-Identifier: Apache-2.0
// GradientStage (grad_stage.h): the staged step mode's copy of each layer's gradients, with
// their sum of squares, in pinned host memory or on NVMe behind a two-buffer ring.
#include "grad_stage.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "zinf/common/align.h"
#include "zinf/common/error.h"
#include "zinf/swap/file.h"

namespace zinf::offload::detail {
namespace {

constexpr std::uint64_t kHostAlign = 4096;
// Partial sums per layer: a fixed number of lanes, added in lane order, so the sum is the same
// on every run and machine (and the loop vectorises without reassociating anything).
constexpr std::size_t kLanes = 8;

float bf16_to_f32(std::uint16_t h) { return std::bit_cast<float>(std::uint32_t{h} << 16); }

// IEEE half to single: exact for every value (subnormals normalised, inf and NaN kept).
float f16_to_f32(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t{h & 0x8000u} << 16;
  std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t mant = h & 0x3ffu;
  std::uint32_t bits = 0;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {
    exp = 113;  // 2^-14, the smallest normal half's exponent, as a single's biased exponent
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --exp;
    }
    bits = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
  }
  return std::bit_cast<float>(bits);
}

// Widens `n` elements of `g` into `out` and returns the sum of their squares (double, lanes).
template <typename Convert>
double widen(const Convert& convert, std::size_t n, float* out) {
  double lane[kLanes] = {};
  std::size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (std::size_t k = 0; k < kLanes; ++k) {
      const float x = convert(i + k);
      out[i + k] = x;
      lane[k] += static_cast<double>(x) * static_cast<double>(x);
    }
  }
  for (; i < n; ++i) {
    const float x = convert(i);
    out[i] = x;
    lane[i % kLanes] += static_cast<double>(x) * static_cast<double>(x);
  }
  double sum = 0;
  for (double l : lane) sum += l;
  return sum;
}

double widen(const adam::GradView& g, float* out) {
  check_buffer_type(g.dtype, "GradientStage: gradients");
  switch (g.dtype) {
    case ElementType::kF32: {
      const auto* p = static_cast<const float*>(g.data);
      return widen([p](std::size_t i) { return p[i]; }, g.size, out);
    }
    case ElementType::kBF16: {
      const auto* p = static_cast<const std::uint16_t*>(g.data);
      return widen([p](std::size_t i) { return bf16_to_f32(p[i]); }, g.size, out);
    }
    case ElementType::kF16: {
      const auto* p = static_cast<const std::uint16_t*>(g.data);
      return widen([p](std::size_t i) { return f16_to_f32(p[i]); }, g.size, out);
    }
    default: break;
  }
  throw UsageError("GradientStage: unknown gradient dtype");
}

std::uint64_t largest_bytes(const std::vector<StagedLayer>& layers) {
  std::uint64_t largest = 0;
  for (const auto& l : layers) largest = std::max(largest, l.numel * kStagedBytesPerElement);
  return largest;
}

}  // namespace

std::uint64_t grad_stage_pinned_bytes(const std::vector<StagedLayer>& layers) {
  std::uint64_t total = 0;
  for (const auto& l : layers) total += align_up(l.numel * kStagedBytesPerElement, kHostAlign);
  return total;
}

std::uint64_t grad_stage_ring_bytes(const std::vector<StagedLayer>& layers,
                                    const std::vector<std::string>& directories) {
  return kStageRingSlots * align_up(largest_bytes(layers), swap::store_alignment(directories));
}

GradientStage::GradientStage(GradStageOptions options) {
  for (auto& l : options.layers) layers_.push_back({std::move(l), false, 0, {}});
  std::vector<StagedLayer> specs;
  for (const auto& l : layers_) specs.push_back(l.spec);
  swap::BufferPoolOptions bo;
  bo.huge_pages = true;
  if (!options.nvme) {
    bo.budget_bytes = grad_stage_pinned_bytes(specs);
    bo.alignment = static_cast<std::uint32_t>(kHostAlign);
    pool_ = std::make_unique<swap::BufferPool>(bo);
    for (auto& l : layers_) {
      l.pinned = pool_->acquire(align_up(l.spec.numel * kStagedBytesPerElement, kHostAlign));
    }
    return;
  }
  if (options.directories.empty()) {
    throw UsageError("GradientStage: NVMe staging needs at least one directory");
  }
  engine_ = swap::make_io_engine(options.io);
  swap::SwapStoreOptions so;
  so.directories = options.directories;
  std::vector<std::uint64_t> sizes;
  for (const auto& l : specs) sizes.push_back(l.numel * kStagedBytesPerElement);
  so.capacity_bytes =
      swap::capacity_for(sizes, so.stripe_bytes, swap::store_alignment(options.directories));
  so.checksums = options.checksums;
  so.direct_io = options.direct_io;
  store_ = std::make_unique<swap::SwapStore>(so, *engine_);
  for (const auto& l : specs) store_->allocate(l.name, l.numel * kStagedBytesPerElement);
  const std::uint64_t slot_bytes = store_->padded_size(largest_bytes(specs));
  bo.budget_bytes = kStageRingSlots * slot_bytes;
  bo.alignment = store_->alignment();
  pool_ = std::make_unique<swap::BufferPool>(bo);
  ring_.resize(kStageRingSlots);
  for (auto& s : ring_) s.buffer = pool_->acquire(slot_bytes);
}

GradientStage::~GradientStage() {
  // The ring's buffers are in the store's writes: wait for them before either goes.
  for (auto& s : ring_) s.write.wait_status().ignore("destroying the gradient staging");
}

void GradientStage::stage(std::size_t index, adam::GradView grads) {
  Layer& l = layers_[index];
  if (grads.size != l.spec.numel || grads.data == nullptr) {
    throw UsageError("GradientStage::stage: layer '" + l.spec.name + "' has " +
                     std::to_string(l.spec.numel) + " elements, got " + std::to_string(grads.size));
  }
  if (!store_) {
    l.sum_sq = widen(grads, reinterpret_cast<float*>(l.pinned.data()));
    l.staged = true;
    return;
  }
  Slot& slot = ring_[next_slot_];
  next_slot_ = (next_slot_ + 1) % ring_.size();
  // The slot's previous write must be over before its bytes change; its failure is the
  // step's (replay reports it), not this call's.
  const Status prev = slot.write.wait_status();
  slot.write = {};
  if (!prev.ok() && write_error_.ok()) write_error_ = prev;
  const std::uint64_t bytes = l.spec.numel * kStagedBytesPerElement;
  std::byte* buf = slot.buffer.data();
  l.sum_sq = widen(grads, reinterpret_cast<float*>(buf));
  // The padding is written too: zero it, so the stored bytes (and their CRCs) are determined.
  const std::uint64_t padded = store_->padded_size(bytes);
  std::memset(buf + bytes, 0, padded - bytes);
  l.staged = true;
  try {
    slot.write = store_->swap_out(l.spec.name, slot.buffer.span().first(padded));
    bytes_written_ += padded;
  } catch (const std::exception&) {
    if (write_error_.ok()) write_error_ = status_from_current_exception();
  }
}

double GradientStage::sum_of_squares() const {
  double sum = 0;
  for (const auto& l : layers_) {
    if (l.staged) sum += l.sum_sq;
  }
  return sum;
}

bool GradientStage::overflow() const { return !std::isfinite(sum_of_squares()); }

void GradientStage::wait_writes() {
  for (auto& s : ring_) {
    const Status st = s.write.wait_status();
    s.write = {};
    if (!st.ok() && write_error_.ok()) write_error_ = st;
  }
}

void GradientStage::flush() {
  wait_writes();
  if (!write_error_.ok()) throw IoError(write_error_);
}

void GradientStage::replay(
    const std::function<void(std::size_t, adam::GradView, std::function<void()>)>& use) {
  if (!store_) {
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      const Layer& l = layers_[i];
      if (!l.staged) continue;
      use(i, {l.pinned.data(), static_cast<std::size_t>(l.spec.numel), ElementType::kF32}, {});
    }
    return;
  }
  flush();
  std::size_t handed = 0;
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    const Layer& l = layers_[i];
    if (!l.staged) continue;
    const std::size_t si = handed % ring_.size();
    Slot& slot = ring_[si];
    {
      // The layer that had this buffer must be done with it.
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return !slot.busy; });
    }
    const std::uint64_t padded = store_->padded_size(l.spec.numel * kStagedBytesPerElement);
    store_->swap_in(l.spec.name, slot.buffer.span().first(padded)).wait();  // IoError as is
    bytes_read_ += padded;
    ++handed;
    {
      std::lock_guard lk(mu_);
      slot.busy = true;
    }
    const auto consumed = [this, si] {
      {
        std::lock_guard lk(mu_);
        ring_[si].busy = false;
      }
      cv_.notify_all();
    };
    try {
      use(i, {slot.buffer.data(), static_cast<std::size_t>(l.spec.numel), ElementType::kF32},
          consumed);
    } catch (...) {
      consumed();  // `use` threw: it will never call it
      throw;
    }
  }
}

void GradientStage::clear() {
  wait_writes();
  write_error_ = Status();
  next_slot_ = 0;
  {
    std::lock_guard lk(mu_);
    for (auto& slot : ring_) slot.busy = false;
  }
  for (auto& l : layers_) {
    l.staged = false;
    l.sum_sq = 0;
  }
}

std::uint64_t GradientStage::pinned_bytes() const noexcept { return pool_->budget_bytes(); }

}  // namespace zinf::offload::detail
