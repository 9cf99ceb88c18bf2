// SPDX-License-Identifier: Apache-2.0
// The demo network's arithmetic. Every sum runs in one fixed order on one thread; the inner
// loops are written as a[:] += s * b[:] over contiguous outputs (each output keeps its own
// running sum), which the compiler vectorises without reordering any sum.
#include "demo_model.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "zinf/common/error.h"

namespace zinf::tools::demo {
namespace {

// splitmix64's finaliser (Steele, Lea, Flood 2014): a bijective mix with full avalanche, used
// as a counter-based generator over (seed, stream, index).
std::uint64_t mix64(std::uint64_t z) noexcept {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Streams of the generator, so that student, teacher and data never share numbers.
constexpr std::uint64_t kStudentStream = 1;
constexpr std::uint64_t kTeacherStream = 2;
constexpr std::uint64_t kInputStream = 3;

// The teacher's weights are variance-preserving (gain 1) like the student's; its biases give an
// offset to learn as well. (A chaotic teacher, gain 1.5, is much slower to imitate: measured
// with train_reference at 8 x 256.)
constexpr float kTeacherGain = 1.0f;
constexpr float kTeacherBiasRange = 0.5f;

void require(bool ok, const std::string& what) {
  if (!ok) throw UsageError("demo model: " + what);
}

}  // namespace

std::size_t layer_numel(std::size_t hidden) noexcept { return hidden * hidden + hidden; }

float uniform_pm1(std::uint64_t seed, std::uint64_t stream, std::uint64_t index) noexcept {
  const std::uint64_t r = mix64(mix64(mix64(seed) ^ stream) ^ index);
  // The top 24 bits give a float in [0, 1) exactly; scale to [-1, 1).
  return static_cast<float>(r >> 40) * 0x1p-23f - 1.0f;
}

void init_layer(std::span<float> params, std::size_t hidden, std::uint64_t seed, std::size_t layer,
                float gain, float bias_range) {
  require(params.size() == layer_numel(hidden), "init_layer: wrong parameter count");
  // Uniform in [-a, a) has variance a^2 / 3, so a = gain * sqrt(3 / hidden).
  const float a = gain * std::sqrt(3.0f / static_cast<float>(hidden));
  const std::size_t weights = hidden * hidden;
  const std::uint64_t stream_seed = mix64(seed + layer);
  for (std::size_t i = 0; i < weights; ++i) params[i] = a * uniform_pm1(stream_seed, 0, i);
  for (std::size_t o = 0; o < hidden; ++o) {
    params[weights + o] = bias_range * uniform_pm1(stream_seed, 1, o);
  }
}

void init_student_layer(std::span<float> params, std::size_t hidden, std::uint64_t seed,
                        std::size_t layer) {
  init_layer(params, hidden, mix64(seed ^ kStudentStream), layer, 1.0f, 0.0f);
}

void init_teacher_layer(std::span<float> params, std::size_t hidden, std::uint64_t seed,
                        std::size_t layer) {
  init_layer(params, hidden, mix64(seed ^ kTeacherStream), layer, kTeacherGain, kTeacherBiasRange);
}

void make_inputs(std::span<float> x, std::uint64_t seed, std::uint64_t step) {
  const std::uint64_t s = mix64(mix64(seed ^ kInputStream) + step);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = uniform_pm1(s, 0, i);
}

std::uint16_t float_to_bf16(float x) noexcept {
  const auto u = std::bit_cast<std::uint32_t>(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40);
  // Round to nearest even: add 0x7fff plus the lowest kept bit, then truncate.
  const std::uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(rounded >> 16);
}

Mlp::Mlp(MlpShape shape) : shape_(shape) {
  require(shape.layers > 0 && shape.hidden > 0 && shape.batch > 0,
          "layers, hidden and batch must be > 0");
  const std::size_t plane = shape.batch * shape.hidden;
  acts_.assign((shape.layers + 1) * plane, 0.0f);
  delta_.assign(plane, 0.0f);
  delta_in_.assign(plane, 0.0f);
  transposed_.assign(shape.hidden * shape.hidden, 0.0f);
}

std::span<float> Mlp::act(std::size_t index) noexcept {
  const std::size_t plane = shape_.batch * shape_.hidden;
  return {acts_.data() + index * plane, plane};
}

std::span<float> Mlp::input() noexcept { return act(0); }

std::span<const float> Mlp::output() const noexcept {
  const std::size_t plane = shape_.batch * shape_.hidden;
  return {acts_.data() + shape_.layers * plane, plane};
}

std::span<const float> Mlp::to_f32(std::span<const std::uint16_t> params) {
  params_f32_.resize(params.size());
  for (std::size_t i = 0; i < params.size(); ++i) params_f32_[i] = bf16_to_float(params[i]);
  return params_f32_;
}

void Mlp::forward(std::size_t layer, std::span<const float> params) {
  const std::size_t h = shape_.hidden;
  require(layer < shape_.layers, "forward: layer " + std::to_string(layer) + " out of range");
  require(params.size() == layer_numel(h), "forward: wrong parameter count");
  const float* w = params.data();
  const float* bias = w + h * h;
  const std::span<float> in = act(layer);
  const std::span<float> out = act(layer + 1);
  for (std::size_t b = 0; b < shape_.batch; ++b) {
    const float* x = in.data() + b * h;
    float* z = out.data() + b * h;
    for (std::size_t o = 0; o < h; ++o) z[o] = bias[o];
    for (std::size_t i = 0; i < h; ++i) {
      const float xi = x[i];
      const float* wi = w + i * h;
      for (std::size_t o = 0; o < h; ++o) z[o] += xi * wi[o];
    }
    if (layer + 1 < shape_.layers) {
      for (std::size_t o = 0; o < h; ++o) z[o] = std::tanh(z[o]);
    }
  }
  next_backward_ = 0;
}

void Mlp::forward_bf16(std::size_t layer, std::span<const std::uint16_t> params) {
  forward(layer, to_f32(params));
}

double Mlp::loss(std::span<const float> target) {
  const std::span<const float> y = output();
  require(target.size() == y.size(), "loss: wrong target size");
  double sum = 0;
  const auto n = static_cast<float>(y.size());
  for (std::size_t k = 0; k < y.size(); ++k) {
    const float d = y[k] - target[k];
    sum += static_cast<double>(d) * d;
    delta_[k] = 2.0f * d / n;  // d mean((y - t)^2) / dy
  }
  next_backward_ = shape_.layers;
  return sum / static_cast<double>(y.size());
}

void Mlp::backward(std::size_t layer, std::span<const float> params, std::span<float> grads) {
  const std::size_t h = shape_.hidden;
  require(next_backward_ == layer + 1,
          "backward: layer " + std::to_string(layer) + " out of order (after loss(), last first)");
  require(params.size() == layer_numel(h) && grads.size() == layer_numel(h),
          "backward: wrong parameter or gradient count");
  const float* w = params.data();
  const std::span<float> in = act(layer);
  const std::span<float> out = act(layer + 1);
  // delta_ holds d loss / d (this layer's output); through tanh' = 1 - tanh^2 it becomes
  // d loss / dz (the last layer has no tanh).
  if (layer + 1 < shape_.layers) {
    for (std::size_t k = 0; k < delta_.size(); ++k) delta_[k] *= 1.0f - out[k] * out[k];
  }
  // dW(i, :) = sum_b x(b, i) * dz(b, :), db = sum_b dz(b, :): samples added in order.
  float* gw = grads.data();
  float* gb = gw + h * h;
  for (std::size_t k = 0; k < h * h + h; ++k) gw[k] = 0.0f;
  for (std::size_t b = 0; b < shape_.batch; ++b) {
    const float* x = in.data() + b * h;
    const float* dz = delta_.data() + b * h;
    for (std::size_t i = 0; i < h; ++i) {
      const float xi = x[i];
      float* gwi = gw + i * h;
      for (std::size_t o = 0; o < h; ++o) gwi[o] += xi * dz[o];
    }
    for (std::size_t o = 0; o < h; ++o) gb[o] += dz[o];
  }
  // dx(b, :) = sum_o dz(b, o) * W(:, o): with W transposed, again contiguous outputs.
  if (layer > 0) {
    for (std::size_t i = 0; i < h; ++i) {
      for (std::size_t o = 0; o < h; ++o) transposed_[o * h + i] = w[i * h + o];
    }
    for (std::size_t b = 0; b < shape_.batch; ++b) {
      const float* dz = delta_.data() + b * h;
      float* dx = delta_in_.data() + b * h;
      for (std::size_t i = 0; i < h; ++i) dx[i] = 0.0f;
      for (std::size_t o = 0; o < h; ++o) {
        const float d = dz[o];
        const float* wo = transposed_.data() + o * h;
        for (std::size_t i = 0; i < h; ++i) dx[i] += d * wo[i];
      }
    }
    delta_.swap(delta_in_);
  }
  next_backward_ = layer;
}

void Mlp::backward_bf16(std::size_t layer, std::span<const std::uint16_t> params,
                        std::span<float> grads) {
  backward(layer, to_f32(params), grads);
}

TrainingSet make_training_set(MlpShape shape, std::uint64_t seed) {
  Mlp teacher(shape);
  make_inputs(teacher.input(), seed, 0);
  std::vector<float> params(layer_numel(shape.hidden));
  for (std::size_t l = 0; l < shape.layers; ++l) {
    init_teacher_layer(params, shape.hidden, seed, l);
    teacher.forward(l, params);
  }
  TrainingSet set;
  set.inputs.assign(teacher.input().begin(), teacher.input().end());
  set.targets.assign(teacher.output().begin(), teacher.output().end());
  return set;
}

ReferenceRun train_reference(MlpShape shape, std::uint64_t seed, std::size_t steps,
                             adam::AdamParams hyper, std::optional<RateChange> change) {
  const std::size_t n = layer_numel(shape.hidden);
  ReferenceRun run;
  run.master.resize(shape.layers);
  std::vector<std::vector<float>> m(shape.layers, std::vector<float>(n, 0.0f));
  std::vector<std::vector<float>> v = m;
  std::vector<std::vector<std::uint16_t>> low(shape.layers, std::vector<std::uint16_t>(n));
  std::vector<std::vector<float>> grads(shape.layers, std::vector<float>(n));
  for (std::size_t l = 0; l < shape.layers; ++l) {
    run.master[l].resize(n);
    init_student_layer(run.master[l], shape.hidden, seed, l);
    for (std::size_t k = 0; k < n; ++k) low[l][k] = float_to_bf16(run.master[l][k]);
  }
  Mlp net(shape);
  const TrainingSet data = make_training_set(shape, seed);
  std::copy(data.inputs.begin(), data.inputs.end(), net.input().begin());
  adam::CpuAdam adam;
  for (std::size_t s = 0; s < steps; ++s) {
    for (std::size_t l = 0; l < shape.layers; ++l) net.forward_bf16(l, low[l]);
    run.losses.push_back(net.loss(data.targets));
    for (std::size_t l = shape.layers; l-- > 0;) net.backward_bf16(l, low[l], grads[l]);
    hyper.step = s + 1;
    if (change && s + 1 >= change->from_step) hyper.lr = change->lr;
    for (std::size_t l = 0; l < shape.layers; ++l) {
      adam.step(hyper, run.master[l], m[l], v[l], adam::GradView::f32(grads[l]),
                adam::CopyOut::bf16(low[l]));
    }
  }
  return run;
}

}  // namespace zinf::tools::demo
