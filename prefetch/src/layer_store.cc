// SPDX-License-Identifier: Apache-2.0
#include "zinf/prefetch/layer_store.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <utility>

#include "zinf/common/align.h"
#include "zinf/common/error.h"
#include "zinf/common/log.h"

namespace zinf::prefetch {

void LayerStore::FreeBytes::operator()(std::byte* p) const noexcept { std::free(p); }

class LayerStore::Suspension {
 public:
  Suspension(LayerPrefetcher* p, std::size_t layer) : p_(p), layer_(layer) {
    if (p_ != nullptr) p_->suspend(layer_);
  }
  ~Suspension() {
    if (p_ == nullptr) return;
    try {
      p_->resume(layer_);
    } catch (const std::exception& e) {
      log(LogLevel::kError, std::string("LayerStore: resume: ") + e.what());
    }
  }
  Suspension(const Suspension&) = delete;
  Suspension& operator=(const Suspension&) = delete;

 private:
  LayerPrefetcher* p_;
  std::size_t layer_;
};

LayerStore::LayerStore(const LayerStoreOptions& options, cuda::Device& device,
                       cuda::StreamRef compute)
    : keys_(options.keys), bytes_(options.bytes), device_(device), compute_(compute) {
  if (keys_.empty()) throw UsageError("LayerStore: no layers");
  if (keys_.size() != bytes_.size()) {
    throw UsageError("LayerStore: " + std::to_string(keys_.size()) + " keys but " +
                     std::to_string(bytes_.size()) + " sizes");
  }
  if (options.directories.empty()) throw UsageError("LayerStore: no directories");
  for (std::size_t l = 0; l < bytes_.size(); ++l) {
    if (bytes_[l] == 0) {
      throw UsageError("LayerStore: layer " + std::to_string(l) + " ('" + keys_[l] +
                       "') has no bytes");
    }
  }
  // The stripe unit: a layer of a stripe or more starts on a stripe boundary, and with
  // checksums each copy-out range covers whole stripe units (the engine sizes its sub-groups
  // to that), so it is the transfer size of every large read and write.
  swap::SwapStoreOptions so;
  so.directories = options.directories;
  so.checksums = options.checksums;
  so.direct_io = options.direct_io;
  const std::uint32_t alignment = options.alignment != 0
                                      ? options.alignment
                                      : swap::store_alignment(so.directories, so.direct_io);
  so.capacity_bytes = swap::capacity_for(bytes_, so.stripe_bytes, alignment);

  engine_ = swap::make_io_engine(options.io);
  store_ = std::make_unique<swap::SwapStore>(so, *engine_);
  if (options.precondition) store_->precondition();
  std::uint64_t largest = 0;
  for (std::size_t l = 0; l < keys_.size(); ++l) {
    store_->allocate(keys_[l], bytes_[l]);
    largest = std::max(largest, store_->padded_size(bytes_[l]));
  }

  // The window holds depth + 2 layers: the one in use, `depth` read ahead, one being recycled.
  const std::uint64_t window = (std::uint64_t{options.depth} + 2) * largest;
  PrefetcherOptions po;
  po.layer_keys = keys_;
  po.depth = options.depth;
  po.staging_bytes = options.staging_bytes != 0 ? options.staging_bytes : window;
  po.max_bytes = po.staging_bytes + (options.device_bytes != 0 ? options.device_bytes : window);
  po.huge_pages = options.huge_pages;
  // The engine is this store's alone: its fixed buffers can be the staging arena.
  po.register_with_engine = engine_.get();
  prefetcher_ = std::make_unique<LayerPrefetcher>(po, *store_, device_, compute_);
}

LayerStore::~LayerStore() = default;

std::uint64_t LayerStore::layer_bytes(std::size_t layer) const {
  check_layer(layer, "layer_bytes");
  return bytes_[layer];
}

void LayerStore::check_layer(std::size_t layer, const char* op) const {
  if (layer >= bytes_.size()) {
    throw UsageError(std::string("LayerStore::") + op + ": layer " + std::to_string(layer) +
                     " of " + std::to_string(bytes_.size()));
  }
}

void LayerStore::check_size(std::size_t layer, std::uint64_t bytes, const char* op) const {
  check_layer(layer, op);
  if (bytes != bytes_[layer]) {
    throw UsageError(std::string("LayerStore::") + op + ": layer " + std::to_string(layer) +
                     " ('" + keys_[layer] + "') holds " + std::to_string(bytes_[layer]) +
                     " bytes, got " + std::to_string(bytes));
  }
}

cuda::DeviceSpan LayerStore::acquire(std::size_t layer) { return prefetcher_->acquire(layer); }

void LayerStore::release(std::size_t layer) { prefetcher_->release(layer); }

void LayerStore::end_iteration() { prefetcher_->end_iteration(); }

void LayerStore::fetch_into(std::size_t layer, cuda::DeviceSpan dst) {
  check_size(layer, dst.size(), "fetch_into");
  const cuda::DeviceSpan src = acquire(layer);
  try {
    device_.copy_on_device(compute_, dst, src);
  } catch (...) {
    prefetcher_->release(layer);
    throw;
  }
  prefetcher_->release(layer);
}

std::span<std::byte> LayerStore::staging(std::uint64_t padded) {
  if (staging_size_ < padded) {
    staging_.reset();
    staging_size_ = 0;
    auto* p = static_cast<std::byte*>(std::aligned_alloc(store_->alignment(), padded));
    if (p == nullptr) throw std::bad_alloc();
    staging_.reset(p);
    staging_size_ = padded;
  }
  return {staging_.get(), padded};
}

void LayerStore::write(std::size_t layer,
                       const std::function<void(std::span<std::byte>)>& fill) {
  check_layer(layer, "write");
  const std::uint64_t bytes = bytes_[layer];
  const std::span<std::byte> buf = staging(store_->padded_size(bytes));
  fill(buf);
  std::memset(buf.data() + bytes, 0, buf.size() - bytes);
  {
    const Suspension suspended(prefetcher_.get(), layer);
    store_->swap_out(keys_[layer], buf).wait();
  }
  written_bytes_ += bytes;
}

void LayerStore::write(std::size_t layer, std::span<const std::byte> bytes) {
  check_size(layer, bytes.size(), "write");
  write(layer, [&](std::span<std::byte> buf) {
    std::memcpy(buf.data(), bytes.data(), bytes.size());
  });
}

void LayerStore::read(std::size_t layer, std::span<std::byte> out) {
  check_size(layer, out.size(), "read");
  const std::span<std::byte> buf = staging(store_->padded_size(out.size()));
  {
    const Suspension suspended(prefetcher_.get(), layer);
    store_->swap_in(keys_[layer], buf).wait();
  }
  std::memcpy(out.data(), buf.data(), out.size());
}

void LayerStore::suspend(std::size_t layer) { prefetcher_->suspend(layer); }
void LayerStore::resume(std::size_t layer) { prefetcher_->resume(layer); }

PrefetcherStats LayerStore::prefetch_stats() const { return prefetcher_->stats(); }

}  // namespace zinf::prefetch
