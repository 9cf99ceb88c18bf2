// SPDX-License-Identifier: Apache-2.0
// check_update_tensors and step_tensors: the door every binding's update goes through (zinf's
// Python doors: zinf.torch's Adam/AdamW, DeepSpeedCPUAdam, the DeepSpeed cpu_adam op). Each
// refused case uses real buffers of the sizes a caller gave: without the check, the kernel
// would write past the short one, which ASan (the asan preset runs this test) reports. And
// check_rollback_params, what a rollback cannot invert.
#include "zinf/adam/update_tensors.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "zinf/common/error.h"

namespace zinf::adam {
namespace {

// A tensor described as the Python binding describes a torch tensor.
struct Desc {
  void* data;
  std::string dtype;
  std::vector<std::int64_t> sizes;
  std::vector<std::int64_t> strides;
  std::string device = "cpu";

  TensorArg arg() const { return {data, dtype, sizes, strides, device}; }
};

Desc flat(void* data, const char* dtype, std::int64_t n) { return {data, dtype, {n}, {1}}; }

// step_tensors' error text, or "no error".
std::string step_error(const Desc& p, const Desc& g, const Desc& m, const Desc& v,
                       const Desc* out = nullptr) {
  CpuAdam adam({.threads = 1, .isa = Isa::kScalar});
  const TensorArg o = out != nullptr ? out->arg() : TensorArg{};
  try {
    step_tensors(adam, "adam_update", AdamParams{}, p.arg(), g.arg(), m.arg(), v.arg(),
                 out != nullptr ? &o : nullptr);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "no error";
}

constexpr std::int64_t kBig = std::int64_t{1} << 20;

// Issue #52 item 2: a 16-element exp_avg (or gradient) for 1M parameters. Everything must be
// as it was: the kernel never ran.
TEST(UpdateTensors, ShortMomentOrGradientIsRefusedBeforeAnyWrite) {
  std::vector<float> p(kBig, 1.0f), g(kBig, 0.5f), m(kBig, 0.0f), v(kBig, 0.0f);
  std::vector<float> small(16, 7.0f);
  EXPECT_EQ(step_error(flat(p.data(), "torch.float32", kBig), flat(g.data(), "float32", kBig),
                       flat(small.data(), "float32", 16), flat(v.data(), "float32", kBig)),
            "adam_update: exp_avg has 16 elements, params has 1048576");
  EXPECT_EQ(step_error(flat(p.data(), "float32", kBig), flat(small.data(), "float32", 16),
                       flat(m.data(), "float32", kBig), flat(v.data(), "float32", kBig)),
            "adam_update: grads has 16 elements, params has 1048576");
  EXPECT_EQ(step_error(flat(p.data(), "float32", kBig), flat(g.data(), "float32", kBig),
                       flat(m.data(), "float32", kBig), flat(small.data(), "float32", 16)),
            "adam_update: exp_avg_sq has 16 elements, params has 1048576");
  for (float x : small) ASSERT_EQ(x, 7.0f);
  for (float x : p) ASSERT_EQ(x, 1.0f);
  for (float x : m) ASSERT_EQ(x, 0.0f);
}

// Issue #52 item 2: fp32 exp_avg with bf16 exp_avg_sq (half the bytes), and int64 moments.
TEST(UpdateTensors, MomentDtypesMustBeOneFloatType) {
  std::vector<float> p(64), g(64), m(64), v(64);
  std::vector<std::uint16_t> v16(64);
  std::vector<std::int64_t> m64(64), v64(64);
  EXPECT_EQ(step_error(flat(p.data(), "float32", 64), flat(g.data(), "float32", 64),
                       flat(m.data(), "float32", 64), flat(v16.data(), "bfloat16", 64)),
            "adam_update: exp_avg is fp32 and exp_avg_sq bf16: the moments must have one dtype");
  EXPECT_EQ(step_error(flat(p.data(), "float32", 64), flat(g.data(), "float32", 64),
                       flat(m64.data(), "torch.int64", 64), flat(v64.data(), "torch.int64", 64)),
            "adam_update: exp_avg is torch.int64, must be float32, bfloat16 or float16");
  EXPECT_EQ(step_error(flat(p.data(), "float32", 64), flat(g.data(), "torch.float64", 64),
                       flat(m.data(), "float32", 64), flat(m.data(), "float32", 64)),
            "adam_update: grads is torch.float64, must be float32, bfloat16 or float16");
  // The kernel's own limits at its door: an fp32 master, fp32 or bf16 moments.
  std::vector<std::uint16_t> p16(64), m16(64);
  // (Every buffer as large as it is described: a 2-byte buffer described as fp32 would
  // reach past its end, and its neighbour in the heap read as an overlap.)
  EXPECT_EQ(step_error(flat(p16.data(), "bfloat16", 64), flat(g.data(), "float32", 64),
                       flat(m.data(), "float32", 64), flat(v.data(), "float32", 64)),
            "adam_update: params is bf16, the kernel updates float32 (widen it into an fp32 "
            "master and pass the parameter as out)");
  EXPECT_EQ(step_error(flat(p.data(), "float32", 64), flat(g.data(), "float32", 64),
                       flat(m16.data(), "float16", 64), flat(v16.data(), "float16", 64)),
            "adam_update: exp_avg and exp_avg_sq are fp16, the kernel keeps float32 or bfloat16 "
            "moments (update float32 copies)");
}

// Issue #52 items 3 and 4: an expanded moment (one element of storage) and a transposed one.
TEST(UpdateTensors, ExpandedAndTransposedTensorsAreRefused) {
  std::vector<float> p(32, 1.0f), g(32, 1.0f), v(32), one(1, 3.0f), t(32);
  const Desc expanded{one.data(), "float32", {4, 8}, {0, 0}};
  EXPECT_EQ(step_error(flat(p.data(), "float32", 32), flat(g.data(), "float32", 32), expanded,
                       flat(v.data(), "float32", 32)),
            "adam_update: exp_avg is not contiguous (sizes [4, 8], strides [0, 0]): the kernel "
            "reads memory in order, so an expanded (stride 0) or transposed tensor must be made "
            "contiguous first (.contiguous())");
  EXPECT_EQ(one[0], 3.0f);
  const Desc transposed{t.data(), "float32", {4, 8}, {1, 4}};
  EXPECT_EQ(step_error(flat(p.data(), "float32", 32), flat(g.data(), "float32", 32),
                       flat(v.data(), "float32", 32), transposed),
            "adam_update: exp_avg_sq is not contiguous (sizes [4, 8], strides [1, 4]): the "
            "kernel reads memory in order, so an expanded (stride 0) or transposed tensor must "
            "be made contiguous first (.contiguous())");
  // As torch's is_contiguous(): a dimension of one element may have any stride.
  std::vector<float> m(32);
  const Desc shaped{m.data(), "float32", {1, 4, 1, 8}, {99, 8, 0, 1}};
  EXPECT_EQ(step_error(flat(p.data(), "float32", 32), flat(g.data(), "float32", 32), shaped,
                       Desc{v.data(), "float32", {4, 8}, {8, 1}}),
            "no error");
  EXPECT_NE(p[0], 1.0f);  // updated
}

TEST(UpdateTensors, DeviceNullAndOverlapAreRefused) {
  std::vector<float> p(64), g(64), m(64), v(64);
  Desc cuda = flat(m.data(), "float32", 64);
  cuda.device = "cuda";
  EXPECT_EQ(step_error(flat(p.data(), "float32", 64), flat(g.data(), "float32", 64), cuda,
                       flat(v.data(), "float32", 64)),
            "adam_update: exp_avg is on device 'cuda', must be 'cpu'");
  EXPECT_EQ(step_error(flat(p.data(), "float32", 64), flat(nullptr, "float32", 64),
                       flat(m.data(), "float32", 64), flat(v.data(), "float32", 64)),
            "adam_update: grads is null with 64 elements");
  // exp_avg_sq starting inside exp_avg: each has 64 elements, the memory holds 64 + 32.
  std::vector<float> mv(96);
  EXPECT_EQ(step_error(flat(p.data(), "float32", 64), flat(g.data(), "float32", 64),
                       flat(mv.data(), "float32", 64), flat(mv.data() + 32, "float32", 64)),
            "adam_update: exp_avg and exp_avg_sq overlap");
  // A bf16 copy-out whose bytes are the gradient's second half.
  std::vector<std::uint16_t> g16(128);
  const Desc out = flat(g16.data() + 64, "bfloat16", 64);
  EXPECT_EQ(step_error(flat(p.data(), "float32", 64), flat(g16.data(), "float32", 64),
                       flat(m.data(), "float32", 64), flat(v.data(), "float32", 64), &out),
            "adam_update: grads and out overlap");
}

TEST(UpdateTensors, SizesThatOverflowAreRefused) {
  std::vector<float> p(4), g(4);
  const Desc huge{g.data(), "float32", {std::int64_t{1} << 40, std::int64_t{1} << 40}, {1, 1}};
  const Desc pd = flat(p.data(), "float32", 4);
  try {
    check_update_tensors("step", pd.arg(), huge.arg(), nullptr, nullptr);
    ADD_FAILURE() << "no error";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(),
                 "step: grads has more elements than can be addressed [1099511627776, "
                 "1099511627776]");
  }
}

TEST(UpdateTensors, CheckReportsTheTypesAndTakesMissingMoments) {
  std::vector<float> p(10);
  std::vector<std::uint16_t> g(10);
  const Desc pd = flat(p.data(), "float32", 10);
  const Desc gd = flat(g.data(), "float16", 10);
  const UpdateTensors t = check_update_tensors("step", pd.arg(), gd.arg(), nullptr, nullptr);
  EXPECT_EQ(t.numel, 10u);
  EXPECT_EQ(t.params, ElementType::kF32);
  EXPECT_EQ(t.grads, ElementType::kF16);
  const TensorArg m = pd.arg();
  try {
    check_update_tensors("step", pd.arg(), gd.arg(), &m, nullptr);
    ADD_FAILURE() << "no error";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(), "step: exp_avg and exp_avg_sq come together (one was not given)");
  }
}

// The fp32 result through the door is the kernel's own, bit for bit.
TEST(UpdateTensors, StepTensorsIsTheKernelStep) {
  std::vector<float> p(100), g(100), m(100), v(100);
  for (int i = 0; i < 100; ++i) {
    p[i] = 0.01f * static_cast<float>(i);
    g[i] = 0.5f - 0.01f * static_cast<float>(i);
  }
  std::vector<float> p2 = p, g2 = g, m2 = m, v2 = v;
  EXPECT_EQ(step_error(flat(p.data(), "float32", 100), flat(g.data(), "float32", 100),
                       flat(m.data(), "float32", 100), flat(v.data(), "float32", 100)),
            "no error");
  CpuAdam adam({.threads = 1, .isa = Isa::kScalar});
  adam.step(AdamParams{}, p2, m2, v2, GradView::f32(g2));
  EXPECT_EQ(std::memcmp(p.data(), p2.data(), 400), 0);
  EXPECT_EQ(std::memcmp(m.data(), m2.data(), 400), 0);
  EXPECT_EQ(std::memcmp(v.data(), v2.data(), 400), 0);
}

// Issue #52 item 10: what a rollback would divide by zero with is refused by name.
TEST(RollbackParams, RefusesWhatCannotBeInverted) {
  AdamParams hp;
  EXPECT_FALSE(check_rollback_params(hp).has_value());
  hp.beta1 = 0;
  auto bad = check_rollback_params(hp);
  ASSERT_TRUE(bad.has_value());
  EXPECT_EQ(bad->field, "beta1");
  EXPECT_EQ(bad->what,
            "must not be 0 for a rollback (the old exp_avg is (exp_avg - (1 - beta1) * grad) / "
            "beta1), got 0");
  EXPECT_FALSE(check_adam_params(hp).has_value());  // valid for the update itself
  hp.beta1 = 1e-50;                                 // 0 once rounded to fp32
  ASSERT_TRUE(check_rollback_params(hp).has_value());
  hp.beta1 = 0.9;
  hp.beta2 = 0;
  bad = check_rollback_params(hp);
  ASSERT_TRUE(bad.has_value());
  EXPECT_EQ(bad->field, "beta2");
  hp.beta2 = 0.999;
  hp.mode = AdamMode::kAdamW;
  hp.lr = 0.5;
  hp.weight_decay = 2;
  bad = check_rollback_params(hp);
  ASSERT_TRUE(bad.has_value());
  EXPECT_EQ(bad->field, "weight_decay");
  EXPECT_EQ(bad->what,
            "times lr must not be 1 for a rollback (the update multiplied the parameters by 1 - "
            "lr * weight_decay = 0, so they cannot be recovered), got lr=0.5 weight_decay=2");
  EXPECT_FALSE(check_adam_params(hp).has_value());
  hp.mode = AdamMode::kAdam;  // L2 decay divides by nothing
  EXPECT_FALSE(check_rollback_params(hp).has_value());
  hp.lr = -1;  // the update's own range comes first
  bad = check_rollback_params(hp);
  ASSERT_TRUE(bad.has_value());
  EXPECT_EQ(bad->field, "lr");
}

}  // namespace
}  // namespace zinf::adam
