// SPDX-License-Identifier: Apache-2.0
// The demo network: its gradients against central finite differences, determinism, the data
// and initialisation, bf16 rounding, misuse errors, and that the in-memory reference trainer
// actually learns the teacher.
#include "demo_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "zinf/common/error.h"

namespace zinf::tools::demo {
namespace {

using Params = std::vector<std::vector<float>>;

Params student_params(const MlpShape& shape, std::uint64_t seed) {
  Params p(shape.layers, std::vector<float>(layer_numel(shape.hidden)));
  for (std::size_t l = 0; l < shape.layers; ++l) init_student_layer(p[l], shape.hidden, seed, l);
  return p;
}

double loss_of(Mlp& net, const Params& p, std::span<const float> x, std::span<const float> t) {
  std::copy(x.begin(), x.end(), net.input().begin());
  for (std::size_t l = 0; l < p.size(); ++l) net.forward(l, p[l]);
  return net.loss(t);
}

TEST(DemoModel, GradientsMatchFiniteDifferences) {
  const MlpShape shape{3, 5, 4};
  const std::uint64_t seed = 7;
  Params p = student_params(shape, seed);
  // Non-zero biases, so their gradients and the tanh saturation are exercised too.
  for (std::size_t l = 0; l < shape.layers; ++l) {
    for (std::size_t o = 0; o < shape.hidden; ++o) {
      p[l][shape.hidden * shape.hidden + o] = 0.3f * uniform_pm1(seed, 99 + l, o);
    }
  }
  Mlp net(shape);
  const TrainingSet data = make_training_set(shape, seed);
  const std::vector<float>& target = data.targets;
  const std::vector<float>& x = data.inputs;

  Params grads(shape.layers, std::vector<float>(layer_numel(shape.hidden)));
  const double base = loss_of(net, p, x, target);
  ASSERT_GT(base, 0.0);
  for (std::size_t l = shape.layers; l-- > 0;) net.backward(l, p[l], grads[l]);

  // Central differences of the fp32 forward: error ~ (fp32 rounding of the loss) / h.
  const float h = 1e-3f;
  std::size_t checked = 0;
  for (std::size_t l = 0; l < shape.layers; ++l) {
    for (std::size_t k = 0; k < p[l].size(); ++k) {
      const float saved = p[l][k];
      p[l][k] = saved + h;
      const double up = loss_of(net, p, x, target);
      p[l][k] = saved - h;
      const double down = loss_of(net, p, x, target);
      p[l][k] = saved;
      const double numeric = (up - down) / (2.0 * h);
      EXPECT_NEAR(grads[l][k], numeric, 2e-4 + 1e-2 * std::abs(numeric))
          << "layer " << l << " element " << k;
      ++checked;
    }
  }
  EXPECT_EQ(checked, shape.layers * layer_numel(shape.hidden));
}

TEST(DemoModel, SameInputsGiveBitwiseSameResults) {
  const MlpShape shape{4, 16, 8};
  const Params p = student_params(shape, 3);
  std::vector<std::vector<float>> g1, g2;
  double loss1 = 0, loss2 = 0;
  for (int run = 0; run < 2; ++run) {
    Mlp net(shape);
    const TrainingSet data = make_training_set(shape, 3);
    const std::vector<float>& t = data.targets;
    std::copy(data.inputs.begin(), data.inputs.end(), net.input().begin());
    for (std::size_t l = 0; l < shape.layers; ++l) net.forward(l, p[l]);
    (run == 0 ? loss1 : loss2) = net.loss(t);
    auto& g = run == 0 ? g1 : g2;
    g.assign(shape.layers, std::vector<float>(layer_numel(shape.hidden)));
    for (std::size_t l = shape.layers; l-- > 0;) net.backward(l, p[l], g[l]);
  }
  EXPECT_EQ(loss1, loss2);
  EXPECT_EQ(g1, g2);
}

TEST(DemoModel, DataAndInitDependOnSeedLayerAndStepOnly) {
  std::vector<float> a(layer_numel(8)), b(layer_numel(8)), c(layer_numel(8));
  init_student_layer(a, 8, 1, 2);
  init_student_layer(b, 8, 1, 2);
  init_student_layer(c, 8, 1, 3);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  init_teacher_layer(c, 8, 1, 2);
  EXPECT_NE(a, c);
  // Student biases start at zero; weights lie within +-sqrt(3 / hidden).
  for (std::size_t o = 0; o < 8; ++o) EXPECT_EQ(a[64 + o], 0.0f);
  for (std::size_t i = 0; i < 64; ++i) EXPECT_LE(std::abs(a[i]), std::sqrt(3.0f / 8.0f));

  std::vector<float> x1(1000), x2(1000), x3(1000);
  make_inputs(x1, 4, 10);
  make_inputs(x2, 4, 10);
  make_inputs(x3, 4, 11);
  EXPECT_EQ(x1, x2);
  EXPECT_NE(x1, x3);
  double sum = 0;
  for (float v : x1) {
    EXPECT_GE(v, -1.0f);
    EXPECT_LT(v, 1.0f);
    sum += v;
  }
  EXPECT_LT(std::abs(sum / 1000.0), 0.1);
}

TEST(DemoModel, Bf16RoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bf16(-2.0f), 0xc000);
  // Halfway cases go to the even neighbour; anything above halfway rounds up.
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0x3f808000u)), 0x3f80);
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0x3f818000u)), 0x3f82);
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0x3f808001u)), 0x3f81);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::nanf("")))));
  EXPECT_EQ(bf16_to_float(0x3f80), 1.0f);
}

TEST(DemoModel, RejectsMisuse) {
  EXPECT_THROW(Mlp(MlpShape{0, 4, 4}), UsageError);
  Mlp net(MlpShape{2, 4, 2});
  std::vector<float> p(layer_numel(4)), g(layer_numel(4));
  EXPECT_THROW(net.forward(2, p), UsageError);
  EXPECT_THROW(net.forward(0, std::span<const float>(p).first(3)), UsageError);
  net.forward(0, p);
  net.forward(1, p);
  // backward before loss(), or not last-first, names the order.
  try {
    net.backward(1, p, g);
    FAIL() << "backward before loss() accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("out of order"), std::string::npos) << e.what();
  }
  std::vector<float> t(8);
  (void)net.loss(t);
  EXPECT_THROW(net.backward(0, p, g), UsageError);
  net.backward(1, p, g);
  net.backward(0, p, g);
}

TEST(DemoModel, TrainingSetIsTheTeachersOutputOnFixedInputs) {
  const MlpShape shape{2, 8, 3};
  const TrainingSet a = make_training_set(shape, 11);
  const TrainingSet b = make_training_set(shape, 11);
  EXPECT_EQ(a.inputs, b.inputs);
  EXPECT_EQ(a.targets, b.targets);
  ASSERT_EQ(a.targets.size(), 24u);
  // The targets are the teacher's forward pass, recomputed here by hand.
  Mlp teacher(shape);
  std::copy(a.inputs.begin(), a.inputs.end(), teacher.input().begin());
  std::vector<float> p(layer_numel(8));
  for (std::size_t l = 0; l < 2; ++l) {
    init_teacher_layer(p, 8, 11, l);
    teacher.forward(l, p);
  }
  EXPECT_TRUE(std::equal(a.targets.begin(), a.targets.end(), teacher.output().begin()));
  EXPECT_NE(make_training_set(shape, 12).targets, a.targets);
}

TEST(DemoModel, ReferenceTrainingLearnsTheTeacher) {
  adam::AdamParams hyper;
  hyper.lr = 1e-2;
  const ReferenceRun run = train_reference(MlpShape{3, 32, 16}, 1, 60, hyper);
  ASSERT_EQ(run.losses.size(), 60u);
  ASSERT_EQ(run.master.size(), 3u);
  EXPECT_EQ(run.master, train_reference(MlpShape{3, 32, 16}, 1, 60, hyper).master);
  EXPECT_LT(run.losses.back(), 0.5 * run.losses.front())
      << "first " << run.losses.front() << " last " << run.losses.back();
}

}  // namespace
}  // namespace zinf::tools::demo
