// SPDX-License-Identifier: Apache-2.0
// Compact Adam moments (compact_state.h): the bf16 and int8 encodings against a reference
// that emulates each fp32 operation in fp64, the compact step against its definition
// (decode, the fp32 step, encode) on every ISA this machine has, the ISAs against each other
// bitwise, hooks and thread counts, names, sizes and the errors a caller sees.
#include "zinf/adam/compact_state.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "zinf/adam/cpu_adam.h"
#include "zinf/common/error.h"

namespace zinf::adam {
namespace {

constexpr std::uint32_t kSeed = 20261205;
constexpr std::size_t kChunk = std::size_t{1} << 16;  // ChunkPool's chunk, to cross boundaries

// One fp32 operation emulated in fp64: +, *, / and sqrt of fp32 values are exact or rounded
// once more harmlessly in fp64 (53 >= 2 x 24 + 2 bits), so the fp32 rounding of the fp64
// result is the correctly rounded fp32 result.
float f(double x) { return static_cast<float>(x); }

std::uint16_t ref_bf16(float x) {
  const auto u = std::bit_cast<std::uint32_t>(x);
  const std::uint32_t lo = u & 0xffff0000u;
  const double dlo = std::fabs(static_cast<double>(std::bit_cast<float>(lo)) - x);
  const double dhi = std::fabs(static_cast<double>(std::bit_cast<float>(lo + 0x10000u)) - x);
  const std::uint32_t hi = lo + 0x10000u;
  const std::uint32_t pick = dlo < dhi ? lo : dhi < dlo ? hi : ((lo >> 16) & 1u) != 0 ? hi : lo;
  return static_cast<std::uint16_t>(pick >> 16);
}

struct RefBlock {
  std::vector<std::int8_t> qm;
  std::vector<std::uint8_t> qv;
  float m_scale = 0, v_scale = 0;
};

// compact_state.h's int8 definition, written from the formulas.
RefBlock ref_int8(const float* m, const float* v, std::size_t n) {
  RefBlock r;
  double a = 0, b = 0;
  for (std::size_t i = 0; i < n; ++i) {
    a = std::max(a, std::fabs(static_cast<double>(m[i])));
    b = std::max(b, static_cast<double>(v[i]));
  }
  const double levels_v = f(4228250625.0);
  const bool zm = a < 0x1p-96, zv = b < 0x1p-96;
  r.m_scale = zm ? 0.0f : f(a / 16129.0);
  r.v_scale = zv ? 0.0f : f(b / levels_v);
  const float inv_m = zm ? 0.0f : f(16129.0 / a);
  const float inv_v = zv ? 0.0f : f(levels_v / b);
  for (std::size_t i = 0; i < n; ++i) {
    const double qm = std::min(127.0, std::nearbyint(static_cast<double>(f(std::sqrt(f(std::fabs(m[i]) * inv_m))))));
    r.qm.push_back(static_cast<std::int8_t>(m[i] < 0 ? -qm : qm));
    const double qv = std::min(255.0, std::nearbyint(static_cast<double>(f(std::sqrt(f(std::sqrt(f(v[i] * inv_v))))))));
    r.qv.push_back(static_cast<std::uint8_t>(qv));
  }
  return r;
}

// Compact storage for n elements in compact_moments_at's layout, with typed views.
struct Store {
  StatePrecision p;
  std::size_t n;
  std::vector<std::byte> bytes;
  CompactMoments c;
  Store(StatePrecision prec, std::size_t size)
      : p(prec), n(size), bytes(moment_bytes(prec, size)), c(view()) {}
  Store(const Store&) = delete;
  CompactMoments view() { return compact_moments_at(p, n, bytes.data()); }
  std::int8_t qm(std::size_t i) const { return static_cast<const std::int8_t*>(c.m)[i]; }
  std::uint8_t qv(std::size_t i) const { return static_cast<const std::uint8_t*>(c.v)[i]; }
  const std::uint16_t* hm() const { return static_cast<const std::uint16_t*>(c.m); }
  const std::uint16_t* hv() const { return static_cast<const std::uint16_t*>(c.v); }
  float ms(std::size_t b) const { return c.m_scale[b]; }
  float vs(std::size_t b) const { return c.v_scale[b]; }
  bool operator==(const Store& o) const { return bytes == o.bytes; }
};

// Moments as training makes them: m of both signs, v >= 0, each over several decades, with
// exact zeros and a block of tiny values.
void fill_moments(std::vector<float>& m, std::vector<float>& v, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> mag(-9.0f, 1.0f);
  std::uniform_int_distribution<int> coin(0, 9);
  for (std::size_t i = 0; i < m.size(); ++i) {
    const float g = std::pow(10.0f, mag(rng)) * (coin(rng) < 5 ? -1.0f : 1.0f);
    m[i] = coin(rng) == 0 ? 0.0f : g;
    v[i] = coin(rng) == 0 ? 0.0f : g * g * (1.0f + static_cast<float>(coin(rng)));
  }
  for (std::size_t i = 64; i < 128 && i < m.size(); ++i) {
    m[i] = 1e-30f;
    v[i] = 1e-31f;
  }
}

constexpr StatePrecision kCompact[] = {StatePrecision::kBF16, StatePrecision::kInt8};

TEST(CompactState, NamesSizesAndParsing) {
  EXPECT_EQ(state_precision_name(StatePrecision::kF32), "fp32");
  EXPECT_EQ(state_precision_name(StatePrecision::kBF16), "bf16");
  EXPECT_EQ(state_precision_name(StatePrecision::kInt8), "int8");
  for (auto p : {StatePrecision::kF32, StatePrecision::kBF16, StatePrecision::kInt8}) {
    EXPECT_EQ(parse_state_precision(state_precision_name(p), "x"), p);
  }
  try {
    parse_state_precision("fp16", "--state-precision");
    FAIL() << "fp16 accepted";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(), "invalid --state-precision 'fp16': expected fp32, bf16 or int8");
  }
  EXPECT_EQ(moment_bytes(StatePrecision::kF32, 1000), 8000u);
  EXPECT_EQ(moment_bytes(StatePrecision::kBF16, 1000), 4000u);
  EXPECT_EQ(moment_bytes(StatePrecision::kInt8, 1000), 2000u + 8u * 16u);  // 16 blocks
  EXPECT_EQ(moment_bytes(StatePrecision::kInt8, 1024), 2048u + 8u * 16u);
}

TEST(CompactState, Bf16EncodingRoundsToNearestEvenAndWidensExactly) {
  const std::size_t n = 1000;
  std::vector<float> m(n), v(n), m2(n), v2(n);
  fill_moments(m, v, kSeed);
  m[0] = std::bit_cast<float>(0x3f808000u);  // a tie: rounds to even (0x3f80)
  m[1] = std::bit_cast<float>(0x3f818000u);  // a tie: rounds to even (0x3f82)
  Store s(StatePrecision::kBF16, n);
  encode_moments(m, v, s.view());
  const std::uint16_t* hm = s.hm();
  const std::uint16_t* hv = s.hv();
  EXPECT_EQ(hm[0], 0x3f80);
  EXPECT_EQ(hm[1], 0x3f82);
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_EQ(hm[i], ref_bf16(m[i])) << "m[" << i << "]=" << m[i];
    ASSERT_EQ(hv[i], ref_bf16(v[i])) << "v[" << i << "]=" << v[i];
  }
  decode_moments(s.view(), m2, v2);
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_EQ(std::bit_cast<std::uint32_t>(m2[i]), std::uint32_t{hm[i]} << 16);
    ASSERT_EQ(std::bit_cast<std::uint32_t>(v2[i]), std::uint32_t{hv[i]} << 16);
  }
}

TEST(CompactState, Int8EncodingMatchesItsDefinition) {
  const std::size_t n = 5 * kInt8Block + 13;  // a short last block
  std::vector<float> m(n), v(n), m2(n), v2(n);
  fill_moments(m, v, kSeed + 1);
  for (std::size_t i = 128; i < 192; ++i) m[i] = v[i] = 0.0f;  // an all-zero block
  Store s(StatePrecision::kInt8, n);
  encode_moments(m, v, s.view());
  decode_moments(s.view(), m2, v2);
  for (std::size_t b = 0; b * kInt8Block < n; ++b) {
    const std::size_t lo = b * kInt8Block, len = std::min(kInt8Block, n - lo);
    const RefBlock r = ref_int8(m.data() + lo, v.data() + lo, len);
    ASSERT_EQ(std::bit_cast<std::uint32_t>(s.ms(b)), std::bit_cast<std::uint32_t>(r.m_scale));
    ASSERT_EQ(std::bit_cast<std::uint32_t>(s.vs(b)), std::bit_cast<std::uint32_t>(r.v_scale));
    for (std::size_t i = 0; i < len; ++i) {
      const std::int8_t qm = s.qm(lo + i);
      const std::uint8_t qv = s.qv(lo + i);
      ASSERT_EQ(qm, r.qm[i]) << "m[" << lo + i << "]=" << m[lo + i];
      ASSERT_EQ(qv, r.qv[i]) << "v[" << lo + i << "]=" << v[lo + i];
      // Decoding: m = float(q|q|) x scale, v = (float(q^2) x float(q^2)) x scale.
      ASSERT_EQ(m2[lo + i], f(f(static_cast<double>(qm) * std::abs(qm)) * s.ms(b)));
      const float w = f(static_cast<double>(qv) * qv);
      ASSERT_EQ(v2[lo + i], f(static_cast<double>(f(static_cast<double>(w) * w)) * s.vs(b)));
    }
  }
  EXPECT_EQ(s.ms(1), 0.0f) << "a block below 2^-96 is stored as zeros";
  EXPECT_EQ(s.ms(2), 0.0f);
  EXPECT_EQ(s.vs(2), 0.0f);
}

TEST(CompactState, Int8KeepsSmallSecondMomentsAwayFromZero) {
  // v^(1/4) is quantised: a v 10^8 below the block's largest (a gradient 10^4 smaller) still
  // decodes to a non-zero value, so sqrt(v) + eps does not collapse to eps.
  std::vector<float> m(kInt8Block, 0.0f), v(kInt8Block, 1e-8f), m2(kInt8Block), v2(kInt8Block);
  v[0] = 1.0f;
  m[0] = 1.0f;
  m[1] = 1e-4f;
  Store s(StatePrecision::kInt8, kInt8Block);
  encode_moments(m, v, s.view());
  decode_moments(s.view(), m2, v2);
  EXPECT_GT(v2[1], 0.3e-8f);
  EXPECT_LT(v2[1], 3e-8f);
  EXPECT_GT(m2[1], 0.0f);
  EXPECT_NEAR(v2[0], 1.0f, 1e-6f);
  EXPECT_NEAR(m2[0], 1.0f, 1e-6f);
}

constexpr Isa kAllIsas[] = {Isa::kAvx512Bf16, Isa::kAvx512, Isa::kAvx2,
                            Isa::kSve,        Isa::kNeon,   Isa::kScalar};

class CompactIsa : public testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (!isa_supported(GetParam())) {
      GTEST_SKIP() << isa_name(GetParam()) << " is not supported by this CPU/OS or build";
    }
  }
};

AdamParams hyper(std::uint64_t step, AdamMode mode) {
  AdamParams hp;
  hp.lr = 1e-2;
  hp.weight_decay = 0.05;
  hp.mode = mode;
  hp.step = step;
  hp.grad_scale = 0.5;
  return hp;
}

struct Problem {
  std::vector<float> p, g, m, v;
  Problem(std::size_t n, std::uint32_t seed) : p(n), g(n), m(n), v(n) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (std::size_t i = 0; i < n; ++i) {
      p[i] = d(rng);
      g[i] = d(rng) * std::pow(10.0f, static_cast<float>(i % 7) - 4.0f);
    }
    fill_moments(m, v, seed + 7);
  }
};

// The compact step is, by definition, decode + the fp32 step + encode; checked bitwise on
// every precision, gradient type, copy-out and mode, over chunk boundaries and a short block.
TEST_P(CompactIsa, StepIsDecodeThenFp32StepThenEncode) {
  CpuAdam adam({.threads = 2, .isa = GetParam()});
  const std::size_t n = 2 * kChunk + 101;
  for (StatePrecision prec : kCompact) {
    for (ElementType gt : {ElementType::kF32, ElementType::kBF16}) {
      for (std::optional<ElementType> ot :
           {std::optional<ElementType>{}, std::optional<ElementType>{ElementType::kBF16},
            std::optional<ElementType>{ElementType::kF32}}) {
        for (AdamMode mode : {AdamMode::kAdam, AdamMode::kAdamW}) {
          SCOPED_TRACE(std::string(state_precision_name(prec)) +
                       " grad=" + std::string(element_type_name(gt)) +
                       " out=" + (ot ? std::string(element_type_name(*ot)) : "none") +
                       (mode == AdamMode::kAdam ? " adam" : " adamw"));
          Problem a(n, kSeed), b(n, kSeed);
          std::vector<std::uint16_t> g16(n), out16a(n), out16b(n);
          std::vector<float> out32a(n), out32b(n);
          for (std::size_t i = 0; i < n; ++i) g16[i] = ref_bf16(a.g[i]);
          const GradView grads = gt == ElementType::kF32 ? GradView::f32(a.g) : GradView::bf16(g16);
          auto out_of = [&](std::vector<std::uint16_t>& o16, std::vector<float>& o32) {
            if (!ot) return CopyOut::none();
            return *ot == ElementType::kBF16 ? CopyOut::bf16(o16) : CopyOut::f32(o32);
          };
          Store sa(prec, n), sb(prec, n);
          encode_moments(a.m, a.v, sa.view());
          encode_moments(b.m, b.v, sb.view());
          for (std::uint64_t t = 1; t <= 3; ++t) {
            adam.step(hyper(t, mode), a.p, sa.view(), grads, out_of(out16a, out32a));
            decode_moments(sb.view(), b.m, b.v);
            adam.step(hyper(t, mode), b.p, b.m, b.v, grads, out_of(out16b, out32b));
            encode_moments(b.m, b.v, sb.view());
          }
          ASSERT_TRUE(sa == sb);
          for (std::size_t i = 0; i < n; ++i) {
            ASSERT_EQ(std::bit_cast<std::uint32_t>(a.p[i]), std::bit_cast<std::uint32_t>(b.p[i]))
                << "p[" << i << "]";
          }
          EXPECT_EQ(out16a, out16b);
          EXPECT_EQ(out32a, out32b);
        }
      }
    }
  }
}

TEST_P(CompactIsa, AgreesBitwiseWithScalarPathAcrossThreadsAndHooks) {
  CpuAdam scalar({.threads = 1, .isa = Isa::kScalar});
  CpuAdam adam({.threads = 3, .isa = GetParam()});
  const std::size_t n = 3 * kChunk + 77;
  struct Seen {
    std::vector<std::pair<std::size_t, std::size_t>> before, after;
    std::mutex mu;
  } seen;
  ChunkHooks hooks;
  hooks.ctx = &seen;
  hooks.before = [](void* ctx, std::size_t b, std::size_t e) {
    auto* s = static_cast<Seen*>(ctx);
    std::lock_guard g(s->mu);
    s->before.emplace_back(b, e);
  };
  hooks.after = [](void* ctx, std::size_t b, std::size_t e) {
    auto* s = static_cast<Seen*>(ctx);
    std::lock_guard g(s->mu);
    s->after.emplace_back(b, e);
  };
  for (StatePrecision prec : kCompact) {
    SCOPED_TRACE(std::string(state_precision_name(prec)));
    Problem a(n, kSeed + 3), b(n, kSeed + 3);
    Store sa(prec, n), sb(prec, n);
    encode_moments(a.m, a.v, sa.view());
    encode_moments(b.m, b.v, sb.view());
    seen.before.clear();
    seen.after.clear();
    for (std::uint64_t t = 1; t <= 4; ++t) {
      scalar.step(hyper(t, AdamMode::kAdamW), a.p, sa.view(), GradView::f32(a.g));
      adam.step(hyper(t, AdamMode::kAdamW), b.p, sb.view(), GradView::f32(b.g), CopyOut::none(),
                &hooks);
    }
    ASSERT_TRUE(sa == sb);
    EXPECT_EQ(a.p, b.p);
    // The hooks saw every element once per step, in pieces that start on an int8 block.
    std::size_t covered = 0;
    for (const auto& [lo, hi] : seen.before) {
      EXPECT_EQ(lo % kInt8Block, 0u);
      EXPECT_LE(hi - lo, kHookPieceElements);
      covered += hi - lo;
    }
    EXPECT_EQ(covered, 4 * n);
    EXPECT_EQ(seen.after.size(), seen.before.size());
  }
}

std::string isa_param_name(const testing::TestParamInfo<Isa>& param) {
  return std::string(isa_name(param.param));
}

INSTANTIATE_TEST_SUITE_P(AllIsas, CompactIsa, testing::ValuesIn(kAllIsas), isa_param_name);

TEST(CompactState, ErrorsNameWhatIsWrong) {
  CpuAdam adam({.threads = 1, .isa = std::nullopt});
  std::vector<float> p(100), g(100);
  Store s(StatePrecision::kInt8, 100);
  CompactMoments c = s.view();
  c.m_scale = nullptr;
  try {
    adam.step(AdamParams{}, p, c, GradView::f32(g));
    FAIL() << "null scales accepted";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(), "cpu adam: m scales is null with 2 elements");
  }
  c = s.view();
  c.v = c.m;
  try {
    adam.step(AdamParams{}, p, c, GradView::f32(g));
    FAIL() << "overlap accepted";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(), "cpu adam: m and v overlap");
  }
  c = s.view();
  c.size = 99;
  try {
    adam.step(AdamParams{}, p, c, GradView::f32(g));
    FAIL() << "size mismatch accepted";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(), "cpu adam: m has 99 elements, params has 100");
  }
  std::vector<float> m(10), v(10);
  try {
    encode_moments(m, v, s.view());
    FAIL() << "size mismatch accepted";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(),
                 "cpu adam: encode_moments: a span has 10 elements, the moments have 100");
  }
}

}  // namespace
}  // namespace zinf::adam
