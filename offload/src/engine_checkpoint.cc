// SPDX-License-Identifier: Apache-2.0
// OffloadEngine's checkpoints: the layer table and the dynamic loss scale's state beside the
// optimizer's checkpoint (save, save_async, load), and reading that state back for load and
// for the seams (engine_seams.cc).
#include <cstdint>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "engine_impl.h"
#include "zinf/common/error.h"
#include "zinf/common/log.h"

namespace zinf::offload {
namespace {

constexpr const char* kManifestName = "zinf-engine-layers";
constexpr const char* kManifestHeader = "zinf engine layers v1";
// A line per layer; far more than any model's table, small enough to read whole.
constexpr std::uint64_t kMaxLayerTableBytes = std::uint64_t{64} << 20;
// The dynamic loss scale's state (a few lines), inside each optimizer checkpoint version
// (OffloadedOptimizer::set_checkpoint_file), committed with the state it belongs to.
constexpr const char* kLossScaleFile = "loss_scale";
// Where checkpoints saved before that kept it: next to the layer table, replaced before the
// optimizer's checkpoint, so a save that failed or was killed in between left a scale one
// save newer than the state. Read only for such checkpoints.
constexpr const char* kLossScaleName = "zinf-engine-loss-scale";
constexpr std::uint64_t kMaxLossScaleBytes = 4096;

// "" + "/" + name would be a file at the root of the file system, not in a checkpoint.
void check_checkpoint_dir(const std::string& dir, const char* function) {
  if (dir.empty()) {
    throw UsageError(std::string(function) +
                     ": the checkpoint directory is empty (\"\"); give "
                     "a directory");
  }
}

std::string manifest_text(const std::vector<LayerSpec>& layers) {
  std::ostringstream os;
  os << kManifestHeader << "\n" << layers.size() << "\n";
  for (const auto& l : layers)
    os << l.numel << " " << element_type_name(l.param_dtype) << " " << l.name << "\n";
  return os.str();
}

}  // namespace

void OffloadEngine::save(const std::string& dir) { impl_->save(&dir, nullptr, /*async=*/false); }

void OffloadEngine::save(const swap::Dir& dir) { impl_->save(nullptr, &dir, /*async=*/false); }

void OffloadEngine::save_async(const std::string& dir) {
  impl_->save(&dir, nullptr, /*async=*/true);
}

void OffloadEngine::wait_save() { impl_->optimizer->wait_save(); }

bool OffloadEngine::save_in_flight() const { return impl_->optimizer->save_in_flight(); }

SaveSnapshot OffloadEngine::last_save_snapshot() const noexcept {
  return impl_->optimizer->last_save_snapshot();
}

void OffloadEngine::Impl::save(const std::string* path, const swap::Dir* given, bool async,
                               optim::SupersededVersions superseded) {
  const char* function = async ? "OffloadEngine::save_async" : "OffloadEngine::save";
  if (path) check_checkpoint_dir(*path, function);
  Impl& m = *this;
  m.check_usable();
  m.check_outside_step(async ? "save_async" : "save");
  // A save in flight first (its error, if any, is thrown here): the files below belong to the
  // checkpoint it is about to commit.
  m.optimizer->wait_save();
  // The optimizer's directory, created if missing and locked for it: the layer table is
  // written under the same lock, through the same descriptor.
  const swap::Dir& d = path ? m.optimizer->checkpoint_directory(*path, /*create=*/true)
                            : m.optimizer->checkpoint_directory(*given);
  // The layer table first: it never changes for an engine, so a crash between it and the
  // optimizer's checkpoint leaves a table that matches the previous checkpoint too.
  swap::replace_file_durably(d, kManifestName, manifest_text(m.layers));
  // The dynamic loss scale's state goes inside the optimizer's new version, committed with
  // the state it belongs to: a save that fails or is killed leaves both as they were.
  m.optimizer->set_checkpoint_file(
      kLossScaleFile,
      m.scaler.dynamic() ? std::optional<std::string>(detail::LossScaler::to_text(m.scaler.state()))
                         : std::nullopt);
  if (async) {
    m.optimizer->save_async(*path);
  } else if (path) {
    m.optimizer->save(*path);
  } else {
    m.optimizer->save(*given, superseded);
  }
}

// The current version's own (`<d>/<version>/loss_scale`), else, for a checkpoint saved before
// the scale moved into the version, `<d>/zinf-engine-loss-scale`; neither in a checkpoint saved
// without dynamic loss scaling.
std::optional<OffloadEngine::Impl::ScaleText> OffloadEngine::Impl::read_scale_text(
    const swap::Dir& d, std::string_view who) const {
  const optim::OffloadedOptimizer& opt = *optimizer;
  std::string shown;
  if (auto text = opt.read_checkpoint_file(d, kLossScaleFile, &shown)) {
    return ScaleText{std::move(*text), shown};
  }
  // A version that records its run was saved with the scale inside it, if with any: an old
  // file beside it belongs to an earlier save and is not read.
  if (!opt.read_checkpoint_file(d, "run")) {
    shown = d.path_of(kLossScaleName);
    try {
      return ScaleText{swap::read_small_file(d, kLossScaleName, kMaxLossScaleBytes), shown};
    } catch (const IoError& e) {
      if (e.code() != ErrorCode::kNotFound) throw;
    }
  }
  log(LogLevel::kNotice, std::string(who) + ": " + shown +
                             " is missing (a checkpoint without dynamic loss scaling); the loss "
                             "scale stays " +
                             std::to_string(scaler.scale()));
  return std::nullopt;
}

detail::LossScaleState OffloadEngine::Impl::check_scale_text(const std::string& text,
                                                             const std::string& path,
                                                             std::string_view who) const {
  const std::optional<detail::LossScaleState> parsed = detail::LossScaler::from_text(text);
  if (!parsed) {
    throw IoError(Status::error(
        ErrorCode::kCorrupt, std::string(who) + ": " + path + " is not a zinf loss scale state"));
  }
  detail::LossScaler probe = scaler;
  if (!probe.restore(*parsed)) {
    throw UsageError(std::string(who) + ": the loss scale state in " + path +
                     " cannot come from this engine's fp16 loss scaling config "
                     "(hysteresis or scale out of its range)");
  }
  return *parsed;
}

void OffloadEngine::load(const std::string& dir) {
  check_checkpoint_dir(dir, "OffloadEngine::load");
  impl_->load(&dir, nullptr);
}

void OffloadEngine::load(const swap::Dir& dir) { impl_->load(nullptr, &dir); }

void OffloadEngine::Impl::load(const std::string* path, const swap::Dir* given) {
  Impl& m = *this;
  m.check_usable();
  m.check_outside_step("load");
  m.optimizer->wait_save();
  const swap::Dir& d = path ? m.optimizer->checkpoint_directory(*path, /*create=*/false)
                            : m.optimizer->checkpoint_directory(*given);
  const std::string table = d.path_of(kManifestName);
  const std::string want = manifest_text(m.layers);
  if (swap::read_small_file(d, kManifestName, kMaxLayerTableBytes) != want) {
    throw UsageError("OffloadEngine::load: the checkpoint's layer table " + table +
                     " differs from this engine's layers (names, element counts, dtypes)");
  }
  // The loss scale's state is read and checked before anything changes.
  std::optional<detail::LossScaleState> scale_state;
  if (m.scaler.dynamic()) {
    if (const auto text = m.read_scale_text(d, "OffloadEngine::load")) {
      scale_state = m.check_scale_text(text->text, text->shown, "OffloadEngine::load");
    }
  }
  if (path) {
    m.optimizer->load(*path);
  } else {
    m.optimizer->load(*given);
  }
  if (scale_state) (void)m.scaler.restore(*scale_state);
  // Every layer's low-precision copy from the restored masters, one layer at a time.
  std::vector<float> masters;
  for (std::size_t i = 0; i < m.layers.size(); ++i) {
    masters.assign(static_cast<std::size_t>(m.layers[i].numel), 0.0f);
    m.optimizer->read_state(i, masters, {}, {});
    m.state[i].master_set = false;
    m.write_low_precision(i, masters);
    m.state[i].master_set = true;
  }
}

}  // namespace zinf::offload
