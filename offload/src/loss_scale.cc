// SPDX-License-Identifier: Apache-2.0
// LossScaler: the static or dynamic fp16 loss scale (loss_scale.h states the rules).
#include "loss_scale.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace zinf::offload::detail {
namespace {

constexpr std::string_view kHeader = "zinf loss scale v1";
// Growth stops here: 1/2^126 is the smallest normal fp32, and the step's grad_scale (clip
// coefficient / scale) must stay representable.
constexpr double kMaxScale = 8.507059173023462e+37;  // 2^126

}  // namespace

LossScaler::LossScaler(const LossScaleConfig& config)
    : config_(config), dynamic_(config.enabled && config.loss_scale == 0) {
  if (!config.enabled) {
    state_.scale = 1;
  } else if (!dynamic_) {
    state_.scale = config.loss_scale;
  } else {
    state_.scale = std::max(std::ldexp(1.0, static_cast<int>(config.initial_scale_power)),
                            config.min_loss_scale);
  }
  state_.hysteresis_left = std::max<std::uint32_t>(config.hysteresis, 1);
}

void LossScaler::update(bool overflow) {
  if (!dynamic_) return;
  LossScaleState& s = state_;
  if (overflow) {
    s.good_steps = 0;
    if (s.hysteresis_left > 1) {
      --s.hysteresis_left;  // tolerated: the scale stays
    } else {
      // Spent: halve, and keep halving at each further overflow until a refill.
      s.scale = std::max(s.scale / 2, config_.min_loss_scale);
    }
    return;
  }
  if (config_.consecutive_hysteresis) s.hysteresis_left = config_.hysteresis;
  if (++s.good_steps == config_.loss_scale_window) {
    s.good_steps = 0;
    s.scale = std::min(s.scale * 2, kMaxScale);
    s.hysteresis_left = config_.hysteresis;
  }
}

bool LossScaler::restore(const LossScaleState& state) {
  if (!(state.scale > 0) || !std::isfinite(state.scale) || state.hysteresis_left == 0 ||
      state.hysteresis_left > std::max<std::uint32_t>(config_.hysteresis, 1)) {
    return false;
  }
  state_ = state;
  return true;
}

std::string LossScaler::to_text(const LossScaleState& state) {
  char scale[64];
  std::snprintf(scale, sizeof scale, "%a", state.scale);  // exact, locale-independent digits
  std::ostringstream os;
  os << kHeader << "\nscale " << scale << "\nhysteresis_left " << state.hysteresis_left
     << "\ngood_steps " << state.good_steps << "\n";
  return os.str();
}

std::optional<LossScaleState> LossScaler::from_text(std::string_view text) {
  // Line by line: "<key> <value>" after the header, each key once, in to_text's order.
  const auto next_line = [&text]() -> std::optional<std::string_view> {
    const std::size_t end = text.find('\n');
    if (end == std::string_view::npos) return std::nullopt;
    const std::string_view line = text.substr(0, end);
    text.remove_prefix(end + 1);
    return line;
  };
  const auto value_of = [&](std::string_view key) -> std::optional<std::string> {
    const auto line = next_line();
    if (!line || line->substr(0, key.size()) != key || line->size() <= key.size() + 1 ||
        (*line)[key.size()] != ' ') {
      return std::nullopt;
    }
    return std::string(line->substr(key.size() + 1));
  };
  const auto header = next_line();
  if (!header || *header != kHeader) return std::nullopt;
  LossScaleState s;
  const auto scale = value_of("scale");
  const auto hyst = value_of("hysteresis_left");
  const auto good = value_of("good_steps");
  if (!scale || !hyst || !good || !text.empty()) return std::nullopt;
  char* end = nullptr;
  s.scale = std::strtod(scale->c_str(), &end);
  if (end != scale->c_str() + scale->size()) return std::nullopt;
  const auto parse_uint = [](const std::string& v, auto& out) {
    const auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
    return ec == std::errc() && p == v.data() + v.size();
  };
  if (!parse_uint(*hyst, s.hysteresis_left) || !parse_uint(*good, s.good_steps)) {
    return std::nullopt;
  }
  return s;
}

}  // namespace zinf::offload::detail
