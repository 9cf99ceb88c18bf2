// SPDX-License-Identifier: Apache-2.0
// The model `zinf demo` trains: a stack of dense layers with tanh between them, learning to
// imitate a fixed random "teacher" network of the same shape under an MSE loss. Forward and
// backward in plain C++ (fp32 arithmetic, single-threaded, fixed summation order, so every
// result is reproducible bit for bit), plus the data, bf16 helpers and an in-memory reference
// trainer (CpuAdam without any offload) that the tests compare the engine against.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "zinf/adam/cpu_adam.h"

namespace zinf::tools::demo {

/// The network and batch sizes. layers >= 1, hidden >= 1, batch >= 1.
struct MlpShape {
  std::size_t layers = 8;
  std::size_t hidden = 1024;
  std::size_t batch = 32;
};

/// Returns the parameter count of one layer: hidden x hidden weights, then hidden biases.
/// Weight (i, o), connecting input i to output o, is element i * hidden + o (input-major, so
/// the forward pass runs over contiguous outputs).
std::size_t layer_numel(std::size_t hidden) noexcept;

/// Returns a value uniform in [-1, 1) determined by (seed, stream, index) alone (a counter-based
/// generator: the same for any order or thread that asks).
float uniform_pm1(std::uint64_t seed, std::uint64_t stream, std::uint64_t index) noexcept;

/// Fills one layer's parameters (layer_numel(hidden) elements): weights uniform with variance
/// gain^2 / hidden, biases uniform in [-bias_range, bias_range]. Depends on (seed, layer) only.
void init_layer(std::span<float> params, std::size_t hidden, std::uint64_t seed, std::size_t layer,
                float gain, float bias_range);
/// The student's initial parameters for `layer` (gain 1, zero biases).
void init_student_layer(std::span<float> params, std::size_t hidden, std::uint64_t seed,
                        std::size_t layer);
/// The teacher's parameters for `layer` (a different stream than the student's; biases
/// non-zero, so there is an offset to learn as well as a function).
void init_teacher_layer(std::span<float> params, std::size_t hidden, std::uint64_t seed,
                        std::size_t layer);

/// Fills `x` (batch x hidden, sample-major) with step `step`'s inputs, uniform in [-1, 1).
void make_inputs(std::span<float> x, std::uint64_t seed, std::uint64_t step);

/// Returns the bf16 bits of `x`, rounded to nearest even (NaN stays NaN).
std::uint16_t float_to_bf16(float x) noexcept;
/// Returns the float whose upper 16 bits are `bits` (exact).
inline float bf16_to_float(std::uint16_t bits) noexcept {
  return std::bit_cast<float>(std::uint32_t{bits} << 16);
}

/// The activations and scratch of one network over one batch. Call forward(0..L-1) in order,
/// then loss(), then backward(L-1..0) in order; each call reads the parameters of its layer
/// only, so a trainer can fetch and release layer by layer. Not thread-safe; single-threaded
/// arithmetic with a fixed order, so results do not depend on anything but the inputs.
class Mlp {
 public:
  /// Allocates the activations for `shape`. UsageError for a zero size.
  explicit Mlp(MlpShape shape);

  const MlpShape& shape() const noexcept { return shape_; }
  /// The batch's inputs (batch x hidden); write them before forward(0).
  std::span<float> input() noexcept;
  /// The last layer's outputs (batch x hidden) after forward(layers - 1).
  std::span<const float> output() const noexcept;

  /// Computes layer `layer`: z = x W + b, then tanh unless it is the last layer. `params` has
  /// layer_numel(hidden) elements. UsageError for a wrong layer or size.
  void forward(std::size_t layer, std::span<const float> params);
  /// forward() from bf16 parameter bits (converted exactly to fp32 first).
  void forward_bf16(std::size_t layer, std::span<const std::uint16_t> params);

  /// Returns the mean squared error over batch x hidden outputs against `target`, summed in
  /// double in a fixed order, and seeds backward with its gradient. UsageError for a wrong size.
  double loss(std::span<const float> target);

  /// Writes d loss / d params of `layer` into `grads` (layer_numel elements) and propagates the
  /// gradient to the layer's input. Layers in reverse order, after loss(). UsageError for a
  /// wrong layer or size.
  void backward(std::size_t layer, std::span<const float> params, std::span<float> grads);
  /// backward() from bf16 parameter bits.
  void backward_bf16(std::size_t layer, std::span<const std::uint16_t> params,
                     std::span<float> grads);

 private:
  std::span<float> act(std::size_t index) noexcept;
  std::span<const float> to_f32(std::span<const std::uint16_t> params);

  MlpShape shape_;
  std::vector<float> acts_;        // (layers + 1) x batch x hidden: input, then each layer's output
  std::vector<float> delta_;       // batch x hidden: d loss / d (current layer's output)
  std::vector<float> delta_in_;    // batch x hidden: the same for its input
  std::vector<float> transposed_;  // hidden x hidden: W^T for the input gradient
  std::vector<float> params_f32_;  // layer_numel: bf16 parameters widened
  std::size_t next_backward_ = 0;  // the layer backward() expects next, + 1 (0: none)
};

/// The training set: `batch` input samples (batch x hidden, uniform in [-1, 1)) and the
/// teacher's outputs for them. Every step trains on the whole set (full-batch training), so the
/// loss curve is the training loss itself, without sampling noise.
struct TrainingSet {
  std::vector<float> inputs;
  std::vector<float> targets;
};

/// Makes the training set for `shape` from `seed`: inputs from make_inputs(seed, 0), targets
/// from a forward pass of the teacher (init_teacher_layer for every layer). Deterministic.
TrainingSet make_training_set(MlpShape shape, std::uint64_t seed);

/// What a reference run gives: the loss of every step and the final fp32 master weights of
/// every layer.
struct ReferenceRun {
  std::vector<double> losses;
  std::vector<std::vector<float>> master;
};

/// A learning rate that replaces the run's from step `from_step` on (counting from 1): what a
/// run resumed at that step with `zinf demo --resume --lr` trains with.
struct RateChange {
  std::size_t from_step = 0;
  double lr = 0;
};

/// Trains the student for `steps` steps entirely in memory with CpuAdam (bf16 copy-out for the
/// forward/backward parameters, as the engine does), `hyper` giving lr, betas etc. (its step
/// field is set per step, counting from 1), and `change`, if given, a later rate. The
/// arithmetic the demo runs through the engine.
ReferenceRun train_reference(MlpShape shape, std::uint64_t seed, std::size_t steps,
                             adam::AdamParams hyper,
                             std::optional<RateChange> change = std::nullopt);

}  // namespace zinf::tools::demo
