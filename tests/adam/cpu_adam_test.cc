// SPDX-License-Identifier: Apache-2.0
// CpuAdam: every ISA path this machine has, against an fp64 reference and hand-computed
// PyTorch values; the paths against each other; bitwise determinism across thread counts and
// alignments; exact bf16/fp16 conversions; and the errors a caller sees for bad input.
#include "zinf/adam/cpu_adam.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "support/scoped_env.h"
#include "support/self_exec.h"
#include "zinf/adam/reference_kernels.h"
#include "zinf/common/error.h"

namespace zinf::adam {
namespace {

constexpr std::uint32_t kSeed = 20261201;
constexpr std::size_t kChunk = std::size_t{1} << 16;  // ChunkPool's chunk, to cross boundaries

// ---------------------------------------------------------------------------------------------
// Test-side conversions, written independently of the kernels: decode by formula, round by
// searching the nearest representable value (ties to the even encoding).

double f16_value(std::uint16_t h) {
  const int exp = (h >> 10) & 0x1f;
  const int mant = h & 0x3ff;
  const double sign = (h & 0x8000) != 0 ? -1.0 : 1.0;
  if (exp == 0x1f) return mant != 0 ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
  if (exp == 0) return sign * std::ldexp(mant, -24);
  return sign * std::ldexp(1024 + mant, exp - 25);
}

double bf16_value(std::uint16_t h) {
  return static_cast<double>(std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16));
}

bool is_nan_f16(std::uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0; }
bool is_nan_bf16(std::uint16_t h) { return (h & 0x7f80) == 0x7f80 && (h & 0x7f) != 0; }

// Nearest of two adjacent magnitude encodings lo and lo + 1, ties to the even one. `value_of`
// must give the magnitude of lo + 1 as if finite when it is the infinity encoding.
template <typename ValueOf>
std::uint16_t pick_nearest(double ax, std::uint16_t lo, ValueOf value_of) {
  const double dlo = ax - value_of(lo);
  const double dhi = value_of(static_cast<std::uint16_t>(lo + 1)) - ax;
  if (dlo < dhi) return lo;
  if (dhi < dlo) return static_cast<std::uint16_t>(lo + 1);
  return (lo & 1) == 0 ? lo : static_cast<std::uint16_t>(lo + 1);
}

std::uint16_t ref_bf16(float x) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(x);
  const auto sign = static_cast<std::uint16_t>((u >> 16) & 0x8000);
  const double ax = std::fabs(static_cast<double>(x));
  if (std::isinf(x)) return static_cast<std::uint16_t>(sign | 0x7f80);
  const auto lo = static_cast<std::uint16_t>((u & 0x7fffffff) >> 16);
  auto value_of = [](std::uint16_t h) {
    return h == 0x7f80 ? std::ldexp(1.0, 128) : bf16_value(h);
  };
  return static_cast<std::uint16_t>(sign | pick_nearest(ax, lo, value_of));
}

std::uint16_t ref_f16(float x) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(x);
  const auto sign = static_cast<std::uint16_t>((u >> 16) & 0x8000);
  const double ax = std::fabs(static_cast<double>(x));
  auto value_of = [](std::uint16_t h) { return h == 0x7c00 ? 65536.0 : f16_value(h); };
  if (ax >= 65536.0) return static_cast<std::uint16_t>(sign | 0x7c00);
  // Largest encoding whose value is <= ax (finite halves are ordered like their bits).
  std::uint16_t lo = 0;
  for (int bit = 14; bit >= 0; --bit) {
    const auto cand = static_cast<std::uint16_t>(lo | (1u << bit));
    if (cand <= 0x7c00 && value_of(cand) <= ax) lo = cand;
  }
  if (lo == 0x7c00) return static_cast<std::uint16_t>(sign | 0x7c00);
  return static_cast<std::uint16_t>(sign | pick_nearest(ax, lo, value_of));
}

std::uint16_t to_bf16_truncating(float x) {
  return static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(x) >> 16);
}

// ---------------------------------------------------------------------------------------------
// Buffers that start `offset` elements past a 64-byte boundary, so tests cover unaligned starts.

template <typename T>
class Buffer {
 public:
  Buffer(std::size_t n, std::size_t offset) : storage_(n + offset + 64), offset_(offset), n_(n) {
    const auto addr = reinterpret_cast<std::uintptr_t>(storage_.data());
    const std::size_t skew = (64 - addr % 64) % 64 / sizeof(T);
    offset_ += skew;
  }
  std::span<T> span() { return {storage_.data() + offset_, n_}; }
  std::span<const T> cspan() const { return {storage_.data() + offset_, n_}; }
  T& operator[](std::size_t i) { return storage_[offset_ + i]; }
  const T& operator[](std::size_t i) const { return storage_[offset_ + i]; }
  std::size_t size() const { return n_; }

 private:
  std::vector<T> storage_;
  std::size_t offset_;
  std::size_t n_;
};

// One problem: initial state, gradients in the three types, and the exact gradient values.
struct Problem {
  Problem(std::size_t n, std::size_t offset, std::uint32_t seed)
      : p(n, offset),
        m(n, offset),
        v(n, offset),
        g32(n, offset),
        g16(n, offset),
        gbf(n, offset),
        out(n, offset) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
    std::uniform_real_distribution<float> pos(0.0f, 1.0f);
    for (std::size_t i = 0; i < n; ++i) {
      p[i] = unit(rng) * 2.0f;
      m[i] = unit(rng) * 1e-2f;
      v[i] = pos(rng) * 1e-3f + 1e-6f;
      const float g = unit(rng) * 0.1f;
      g32[i] = g;
      gbf[i] = to_bf16_truncating(g);
      // Random fp16 bits of magnitude below 2^-2, a few of them subnormal.
      const auto r = static_cast<std::uint32_t>(rng());
      g16[i] = static_cast<std::uint16_t>((r & 0x8000u) | ((r >> 16) % 13u) << 10 | (r & 0x3ffu));
    }
  }
  GradView grads(ElementType t) const {
    switch (t) {
      case ElementType::kF32: return GradView::f32(g32.cspan());
      case ElementType::kBF16: return GradView::bf16(gbf.cspan());
      case ElementType::kF16: return GradView::f16(g16.cspan());
      default: break;  // the problems hold buffer types only
    }
    return {};
  }
  double grad_value(ElementType t, std::size_t i) const {
    switch (t) {
      case ElementType::kF32: return g32[i];
      case ElementType::kBF16: return bf16_value(gbf[i]);
      case ElementType::kF16: return f16_value(g16[i]);
      default: break;
    }
    return 0;
  }
  Buffer<float> p, m, v, g32;
  Buffer<std::uint16_t> g16, gbf, out;
};

CopyOut copy_out(ElementType t, Buffer<std::uint16_t>& out) {
  return t == ElementType::kBF16 ? CopyOut::bf16(out.span()) : CopyOut::f16(out.span());
}

// The fp64 reference of one element and a bound on the fp32 error, from the magnitudes of the
// terms each result sums (so a cancellation does not make the bound meaningless).
struct RefResult {
  double p, m, v, tol_p, tol_m, tol_v;
};

RefResult reference(const AdamParams& hp, double p, double g, double m, double v) {
  constexpr double kRel = 1e-6;  // ~16 fp32 ulps of the largest term
  g *= hp.grad_scale;
  double g_mag = std::fabs(g);
  if (hp.mode == AdamMode::kAdam) {
    g += hp.weight_decay * p;
    g_mag += std::fabs(hp.weight_decay * p);
  } else {
    p *= 1.0 - hp.lr * hp.weight_decay;
  }
  const double m1 = hp.beta1 * m + (1 - hp.beta1) * g;
  const double v1 = hp.beta2 * v + (1 - hp.beta2) * g * g;
  const double m_mag = hp.beta1 * std::fabs(m) + (1 - hp.beta1) * g_mag;
  const double v_mag = hp.beta2 * v + (1 - hp.beta2) * g_mag * g_mag;
  const auto t = static_cast<double>(hp.step);
  const double bc1 = hp.bias_correction ? 1 - std::pow(hp.beta1, t) : 1;
  const double bc2 = hp.bias_correction ? 1 - std::pow(hp.beta2, t) : 1;
  const double denom = std::sqrt(v1) / std::sqrt(bc2) + hp.eps;
  const double step_size = hp.lr / bc1;
  const double p1 = p - step_size * m1 / denom;
  const double u_mag = step_size * m_mag / denom * (1 + v_mag / v1);
  return {p1, m1, v1, kRel * (std::fabs(p) + u_mag), kRel * m_mag, kRel * v_mag};
}

constexpr Isa kAllIsas[] = {Isa::kAvx512Bf16, Isa::kAvx512, Isa::kAvx2,
                            Isa::kSve,        Isa::kNeon,   Isa::kScalar};

std::string isa_param_name(const testing::TestParamInfo<Isa>& info) {
  return std::string(isa_name(info.param));
}

// Every path is instantiated; one this machine lacks is skipped with the reason, not hidden.
class CpuAdamIsa : public testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (!isa_supported(GetParam())) {
      GTEST_SKIP() << isa_name(GetParam()) << " is not supported by this CPU/OS or build";
    }
  }
};

AdamParams typical(AdamMode mode, double wd, bool bc) {
  AdamParams hp;
  hp.lr = 1e-2;
  hp.beta1 = 0.9;
  hp.beta2 = 0.999;
  hp.eps = 1e-8;
  hp.weight_decay = wd;
  hp.step = 5;
  hp.bias_correction = bc;
  hp.grad_scale = 0.75;
  hp.mode = mode;
  return hp;
}

// ---------------------------------------------------------------------------------------------

TEST_P(CpuAdamIsa, MatchesFp64ReferenceForEveryTypeAndMode) {
  CpuAdam adam({.threads = 2, .isa = GetParam()});
  ASSERT_EQ(adam.isa(), GetParam());
  const std::size_t sizes[] = {1, 7, 15, 16, 17, 33, 100, 257};
  const ElementType grad_types[] = {ElementType::kF32, ElementType::kBF16, ElementType::kF16};
  const std::optional<ElementType> out_types[] = {std::nullopt, ElementType::kBF16,
                                                  ElementType::kF16};
  struct Mode {
    AdamMode mode;
    double wd;
  };
  const Mode modes[] = {{AdamMode::kAdam, 0.0}, {AdamMode::kAdam, 0.1}, {AdamMode::kAdamW, 0.1}};
  std::uint32_t seed = kSeed;
  for (ElementType gt : grad_types) {
    for (const auto& ot : out_types) {
      for (const Mode& mode : modes) {
        for (bool bc : {true, false}) {
          std::vector<std::size_t> ns(std::begin(sizes), std::end(sizes));
          if (bc && mode.wd > 0) ns.push_back(2 * kChunk + 37);  // crosses chunk boundaries
          for (std::size_t n : ns) {
            ++seed;
            const std::size_t offset = n % 3 + 1;
            SCOPED_TRACE("grad=" + std::string(element_type_name(gt)) +
                         " out=" + (ot ? std::string(element_type_name(*ot)) : "none") +
                         " mode=" + (mode.mode == AdamMode::kAdam ? "adam" : "adamw") +
                         " wd=" + std::to_string(mode.wd) + " bc=" + std::to_string(bc) +
                         " n=" + std::to_string(n) + " offset=" + std::to_string(offset) +
                         " seed=" + std::to_string(seed));
            Problem pr(n, offset, seed);
            Problem init(n, offset, seed);
            const AdamParams hp = typical(mode.mode, mode.wd, bc);
            adam.step(hp, pr.p.span(), pr.m.span(), pr.v.span(), pr.grads(gt),
                      ot ? copy_out(*ot, pr.out) : CopyOut::none());
            int failures = 0;
            for (std::size_t i = 0; i < n && failures < 5; ++i) {
              const RefResult r =
                  reference(hp, init.p[i], init.grad_value(gt, i), init.m[i], init.v[i]);
              const bool ok = std::fabs(pr.p[i] - r.p) <= r.tol_p &&
                              std::fabs(pr.m[i] - r.m) <= r.tol_m &&
                              std::fabs(pr.v[i] - r.v) <= r.tol_v;
              if (!ok) {
                ++failures;
                ADD_FAILURE() << "i=" << i << " p=" << pr.p[i] << " ref " << r.p << " tol "
                              << r.tol_p << "; m=" << pr.m[i] << " ref " << r.m << "; v=" << pr.v[i]
                              << " ref " << r.v;
              }
              if (ot) {
                const std::uint16_t want =
                    *ot == ElementType::kBF16 ? ref_bf16(pr.p[i]) : ref_f16(pr.p[i]);
                if (pr.out[i] != want) {
                  ++failures;
                  ADD_FAILURE() << "copy-out i=" << i << " of " << pr.p[i] << " is 0x" << std::hex
                                << pr.out[i] << ", want 0x" << want << std::dec;
                }
              }
            }
          }
        }
      }
    }
  }
}

TEST_P(CpuAdamIsa, AgreesBitwiseWithScalarPath) {
  CpuAdam scalar({.threads = 1, .isa = Isa::kScalar});
  CpuAdam adam({.threads = 3, .isa = GetParam()});
  // Two chunk boundaries and a tail; one boundary in the processes that rerun this at other
  // SVE vector lengths under qemu (CpuAdam.SveVectorLength<bytes>), where the emulated
  // 256-bit vectors made this the slowest case of the aarch64 stage (145 s at 32 bytes).
  const std::size_t n = (std::getenv("ZINF_TEST_SVE_BYTES") ? 1 : 2) * kChunk + 29;
  for (ElementType gt : {ElementType::kF32, ElementType::kBF16, ElementType::kF16}) {
    for (ElementType ot : {ElementType::kBF16, ElementType::kF16}) {
      for (AdamMode mode : {AdamMode::kAdam, AdamMode::kAdamW}) {
        SCOPED_TRACE("grad=" + std::string(element_type_name(gt)) +
                     " out=" + std::string(element_type_name(ot)) +
                     " mode=" + (mode == AdamMode::kAdam ? "adam" : "adamw"));
        Problem a(n, 3, kSeed);
        Problem b(n, 1, kSeed);
        for (std::uint64_t t = 1; t <= 3; ++t) {
          AdamParams hp = typical(mode, 0.05, true);
          hp.step = t;
          scalar.step(hp, a.p.span(), a.m.span(), a.v.span(), a.grads(gt), copy_out(ot, a.out));
          adam.step(hp, b.p.span(), b.m.span(), b.v.span(), b.grads(gt), copy_out(ot, b.out));
        }
        std::size_t first_bad = n;
        for (std::size_t i = 0; i < n && first_bad == n; ++i) {
          if (std::bit_cast<std::uint32_t>(a.p[i]) != std::bit_cast<std::uint32_t>(b.p[i]) ||
              std::bit_cast<std::uint32_t>(a.m[i]) != std::bit_cast<std::uint32_t>(b.m[i]) ||
              std::bit_cast<std::uint32_t>(a.v[i]) != std::bit_cast<std::uint32_t>(b.v[i]) ||
              a.out[i] != b.out[i]) {
            first_bad = i;
          }
        }
        EXPECT_EQ(first_bad, n) << "scalar p=" << a.p[first_bad % n] << " m=" << a.m[first_bad % n]
                                << " v=" << a.v[first_bad % n] << "; " << isa_name(GetParam())
                                << " p=" << b.p[first_bad % n] << " m=" << b.m[first_bad % n]
                                << " v=" << b.v[first_bad % n];
      }
    }
  }
}

// The vector loops load one block ahead of their stores (so that no load waits on a store to
// another array that shares its address mod 4 KiB, issue #37): every length around the block
// sizes (pipeline empty, one block, several, with single vectors and a masked tail after),
// with the arrays carved from one buffer a cache line or less apart mod 4 KiB and in every
// order, gives the scalar path's bits.
TEST_P(CpuAdamIsa, EveryLengthAndCloseLayoutGivesTheScalarBits) {
  CpuAdam scalar({.threads = 1, .isa = Isa::kScalar});
  CpuAdam adam({.threads = 1, .isa = GetParam()});
  constexpr std::size_t kMaxLen = 140;
  // Element offsets of p, m, v and the gradients inside one buffer, chosen mod 1024 elements
  // (4 KiB): one line apart, half a line apart, descending, and all equal.
  const std::size_t page = 1024;
  const std::size_t layouts[][4] = {{0, 16, 32, 48}, {0, 8, 16, 24}, {48, 32, 16, 0}, {0, 0, 0, 0}};
  for (const auto& lay : layouts) {
    for (std::size_t n = 1; n <= kMaxLen; ++n) {
      SCOPED_TRACE("n=" + std::to_string(n) + " layout=" + std::to_string(lay[0]) + "," +
                   std::to_string(lay[1]) + "," + std::to_string(lay[2]) + "," +
                   std::to_string(lay[3]));
      Problem a(n, 0, kSeed + static_cast<std::uint32_t>(n));
      // Array k at k pages plus its offset: never overlapping (n + offsets < a page).
      std::vector<float> buf(5 * page);
      float* arr[4];
      for (std::size_t k = 0; k < 4; ++k) arr[k] = buf.data() + k * page + lay[k];
      std::copy_n(a.p.cspan().data(), n, arr[0]);
      std::copy_n(a.m.cspan().data(), n, arr[1]);
      std::copy_n(a.v.cspan().data(), n, arr[2]);
      std::copy_n(a.g32.cspan().data(), n, arr[3]);
      std::vector<std::uint16_t> out(n);
      AdamParams hp = typical(AdamMode::kAdamW, 0.01, true);
      scalar.step(hp, a.p.span(), a.m.span(), a.v.span(), a.grads(ElementType::kF32),
                  CopyOut::bf16(a.out.span()));
      adam.step(hp, {arr[0], n}, {arr[1], n}, {arr[2], n},
                GradView::f32({static_cast<const float*>(arr[3]), n}), CopyOut::bf16(out));
      EXPECT_EQ(std::memcmp(arr[0], a.p.cspan().data(), n * 4), 0);
      EXPECT_EQ(std::memcmp(arr[1], a.m.cspan().data(), n * 4), 0);
      EXPECT_EQ(std::memcmp(arr[2], a.v.cspan().data(), n * 4), 0);
      EXPECT_EQ(std::memcmp(out.data(), a.out.cspan().data(), n * 2), 0);
      if (HasFailure()) return;
    }
  }
}

// The AVX2 and portable paths walk a range in windows of 1024 elements, 8 streams 512 bytes
// apart, when the arrays lie a few pieces apart mod 1 MiB (loop_order.h, issue #37), and in
// sequence otherwise: lengths of one window and more with a ragged remainder, on layouts that
// take each order (lines apart, descending, all equal, one pair close while another is 512
// bytes apart, staggered), with fp32, bf16 and fp16 gradients, a bf16 or fp16 copy-out and L2
// decay, give the sequential scalar path's bits on every path.
TEST_P(CpuAdamIsa, WindowedAndSequentialOrdersGiveTheScalarBits) {
  CpuAdam scalar({.threads = 1, .isa = Isa::kScalar});
  CpuAdam adam({.threads = 1, .isa = GetParam()});
  const std::size_t page = 1024;  // elements: 4 KiB of fp32
  const std::size_t lengths[] = {1023, 1024, 1031, 2 * 1024 + 8 + 5, 3 * 1024 + 1000};
  const std::size_t layouts[][4] = {
      {0, 16, 32, 48}, {48, 32, 16, 0}, {0, 0, 0, 0}, {0, 8, 128, 256}, {0, 272, 544, 816}};
  for (ElementType gt : {ElementType::kF32, ElementType::kBF16, ElementType::kF16}) {
    // Each gradient type with one copy-out type (bf16 for two of them), so that both copy-outs
    // meet 2- and 4-byte gradients.
    const ElementType ot = gt == ElementType::kBF16 ? ElementType::kF16 : ElementType::kBF16;
    for (const auto& lay : layouts) {
      for (std::size_t n : lengths) {
        SCOPED_TRACE("n=" + std::to_string(n) + " grad=" + std::string(element_type_name(gt)) +
                     " out=" + std::string(element_type_name(ot)) +
                     " layout=" + std::to_string(lay[0]) + "," + std::to_string(lay[1]) + "," +
                     std::to_string(lay[2]) + "," + std::to_string(lay[3]));
        Problem a(n, 0, kSeed + static_cast<std::uint32_t>(n));
        // Array k starts k MiB in, plus its offset: apart mod 1 MiB by the offsets only (the
        // bits the choice compares), never overlapping.
        constexpr std::size_t kMiB = 262144;  // elements
        std::vector<float> buf(4 * kMiB + page);
        float* arr[4];
        for (std::size_t k = 0; k < 4; ++k) arr[k] = buf.data() + k * kMiB + lay[k];
        std::copy_n(a.p.cspan().data(), n, arr[0]);
        std::copy_n(a.m.cspan().data(), n, arr[1]);
        std::copy_n(a.v.cspan().data(), n, arr[2]);
        std::copy_n(a.g32.cspan().data(), n, arr[3]);
        // 2-byte gradients at the gradient array's place, 2 bytes an element.
        auto* g16 = reinterpret_cast<std::uint16_t*>(arr[3]);
        if (gt == ElementType::kBF16) std::copy_n(a.gbf.cspan().data(), n, g16);
        if (gt == ElementType::kF16) std::copy_n(a.g16.cspan().data(), n, g16);
        const GradView g = gt == ElementType::kF32
                               ? GradView::f32({static_cast<const float*>(arr[3]), n})
                               : GradView{g16, n, gt};
        std::vector<std::uint16_t> out(n);
        const auto copy_out = [ot](std::span<std::uint16_t> to) {
          return ot == ElementType::kBF16 ? CopyOut::bf16(to) : CopyOut::f16(to);
        };
        for (std::uint64_t t = 1; t <= 2; ++t) {
          AdamParams hp = typical(AdamMode::kAdam, 0.01, true);
          hp.step = t;
          scalar.step(hp, a.p.span(), a.m.span(), a.v.span(), a.grads(gt), copy_out(a.out.span()));
          adam.step(hp, {arr[0], n}, {arr[1], n}, {arr[2], n}, g, copy_out(out));
        }
        EXPECT_EQ(std::memcmp(arr[0], a.p.cspan().data(), n * 4), 0);
        EXPECT_EQ(std::memcmp(arr[1], a.m.cspan().data(), n * 4), 0);
        EXPECT_EQ(std::memcmp(arr[2], a.v.cspan().data(), n * 4), 0);
        EXPECT_EQ(std::memcmp(out.data(), a.out.cspan().data(), n * 2), 0);
        if (HasFailure()) return;
      }
    }
  }
}

TEST_P(CpuAdamIsa, BitwiseIdenticalAcrossThreadCountsAndAlignments) {
  const std::size_t n = 5 * kChunk + 123;
  struct Run {
    std::size_t threads, offset;
  };
  const Run runs[] = {{1, 1}, {2, 1}, {3, 1}, {4, 1}, {8, 1}, {2, 0}, {2, 2}, {3, 3}};
  std::optional<Problem> first;
  for (const auto [threads, offset] : runs) {
    {
      SCOPED_TRACE("threads=" + std::to_string(threads) + " offset=" + std::to_string(offset));
      CpuAdam adam({.threads = threads, .isa = GetParam()});
      ASSERT_EQ(adam.threads(), threads);
      Problem pr(n, offset, kSeed);
      for (std::uint64_t t = 1; t <= 2; ++t) {
        AdamParams hp = typical(AdamMode::kAdamW, 0.01, true);
        hp.step = t;
        adam.step(hp, pr.p.span(), pr.m.span(), pr.v.span(), pr.grads(ElementType::kBF16),
                  CopyOut::bf16(pr.out.span()));
      }
      if (!first) {
        first.emplace(std::move(pr));
        continue;
      }
      EXPECT_EQ(std::memcmp(pr.p.cspan().data(), first->p.cspan().data(), n * 4), 0);
      EXPECT_EQ(std::memcmp(pr.m.cspan().data(), first->m.cspan().data(), n * 4), 0);
      EXPECT_EQ(std::memcmp(pr.v.cspan().data(), first->v.cspan().data(), n * 4), 0);
      EXPECT_EQ(std::memcmp(pr.out.cspan().data(), first->out.cspan().data(), n * 2), 0);
    }
  }
}

template <typename T>
bool same_range(std::span<const T> a, std::span<const T> b, std::size_t begin, std::size_t end) {
  return std::memcmp(a.data() + begin, b.data() + begin, (end - begin) * sizeof(T)) == 0;
}

// ChunkHooks: `before` sees each piece's old values, `after` its new ones (and copy-out);
// the pieces tile [0, n) once each, none longer than kHookPieceElements; the update is
// bitwise the one without hooks.
TEST_P(CpuAdamIsa, HooksSeeEachPieceBeforeAndAfterItsUpdateAndChangeNoBit) {
  const std::size_t n = 3 * kChunk + 123;
  CpuAdam adam({.threads = 3, .isa = GetParam()});
  AdamParams hp = typical(AdamMode::kAdamW, 0.01, true);
  Problem plain(n, 1, kSeed);
  adam.step(hp, plain.p.span(), plain.m.span(), plain.v.span(), plain.grads(ElementType::kBF16),
            CopyOut::bf16(plain.out.span()));

  Problem hooked(n, 1, kSeed);
  const Problem old(n, 1, kSeed);
  struct Seen {
    const Problem* old;
    const Problem* plain;
    Problem* hooked;
    std::mutex mu;
    std::vector<std::pair<std::size_t, std::size_t>> before, after;
    std::atomic<int> wrong{0};
  } seen{&old, &plain, &hooked, {}, {}, {}, {}};
  ChunkHooks hooks;
  hooks.ctx = &seen;
  hooks.before = [](void* c, std::size_t b, std::size_t e) {
    auto& s = *static_cast<Seen*>(c);
    if (!same_range(s.hooked->p.cspan(), s.old->p.cspan(), b, e) ||
        !same_range(s.hooked->m.cspan(), s.old->m.cspan(), b, e) ||
        !same_range(s.hooked->v.cspan(), s.old->v.cspan(), b, e)) {
      ++s.wrong;
    }
    std::lock_guard lock(s.mu);
    s.before.emplace_back(b, e);
  };
  hooks.after = [](void* c, std::size_t b, std::size_t e) {
    auto& s = *static_cast<Seen*>(c);
    if (!same_range(s.hooked->p.cspan(), s.plain->p.cspan(), b, e) ||
        !same_range(s.hooked->v.cspan(), s.plain->v.cspan(), b, e) ||
        !same_range(s.hooked->out.cspan(), s.plain->out.cspan(), b, e)) {
      ++s.wrong;
    }
    std::lock_guard lock(s.mu);
    s.after.emplace_back(b, e);
  };
  adam.step(hp, hooked.p.span(), hooked.m.span(), hooked.v.span(), hooked.grads(ElementType::kBF16),
            CopyOut::bf16(hooked.out.span()), &hooks);
  EXPECT_EQ(seen.wrong.load(), 0);
  EXPECT_EQ(std::memcmp(hooked.p.cspan().data(), plain.p.cspan().data(), n * 4), 0);
  EXPECT_EQ(std::memcmp(hooked.m.cspan().data(), plain.m.cspan().data(), n * 4), 0);
  EXPECT_EQ(std::memcmp(hooked.v.cspan().data(), plain.v.cspan().data(), n * 4), 0);
  EXPECT_EQ(std::memcmp(hooked.out.cspan().data(), plain.out.cspan().data(), n * 2), 0);
  std::sort(seen.before.begin(), seen.before.end());
  std::sort(seen.after.begin(), seen.after.end());
  EXPECT_EQ(seen.before, seen.after);
  std::size_t covered = 0;
  for (const auto& [b, e] : seen.before) {
    EXPECT_EQ(b, covered);
    EXPECT_GT(e, b);
    EXPECT_LE(e - b, kHookPieceElements);
    covered = e;
  }
  EXPECT_EQ(covered, n);
}

// An fp32 copy-out is the updated parameters themselves, for every thread count.
TEST_P(CpuAdamIsa, Fp32CopyOutIsTheUpdatedParameters) {
  const std::size_t n = 3 * kChunk + 77;
  for (std::size_t threads : {1u, 3u}) {
    CpuAdam adam({.threads = threads, .isa = GetParam()});
    Problem pr(n, 1, kSeed);
    std::vector<float> out(n, -1.0f);
    for (std::uint64_t t = 1; t <= 2; ++t) {
      AdamParams hp = typical(AdamMode::kAdamW, 0.01, true);
      hp.step = t;
      adam.step(hp, pr.p.span(), pr.m.span(), pr.v.span(), pr.grads(ElementType::kF32),
                CopyOut::f32(out));
    }
    EXPECT_EQ(std::memcmp(out.data(), pr.p.cspan().data(), n * 4), 0) << "threads " << threads;
  }
}

// With lr = 0 and zero state the parameters pass through unchanged, so the copy-out is the
// conversion of arbitrary fp32 bit patterns: zeros, subnormals, ties, overflow, inf, NaN.
TEST_P(CpuAdamIsa, CopyOutRoundsToNearestEvenOnEveryBitPattern) {
  std::vector<std::uint32_t> bits = {0x00000000, 0x80000000, 0x00000001, 0x807fffff, 0x00800000,
                                     0x3f800000, 0x3f808000, 0x3f818000, 0x3f80ffff, 0x7f7fffff,
                                     0x7f7f8000, 0x7f7f7fff, 0x7f800000, 0xff800000, 0x7fc00000,
                                     0x7f800001, 0xffa00001, 0x477fe000, 0x477ff000, 0x477fefff,
                                     0x38800000, 0x387fffff, 0x33000000, 0x33000001, 0x33800000,
                                     0x33c00000, 0x337fffff, 0xc7800000, 0x3a800800, 0x3a801800};
  std::mt19937 rng(kSeed);
  for (int i = 0; i < 200000; ++i) bits.push_back(static_cast<std::uint32_t>(rng()));
  // Dense coverage of the fp16 subnormal and near-overflow ranges.
  for (std::uint32_t e = 0x33000000; e < 0x38800000; e += 0x1237) bits.push_back(e);
  for (std::uint32_t e = 0x477f0000; e < 0x47810000; e += 0x11) bits.push_back(e);
  const std::size_t n = bits.size();
  for (ElementType ot : {ElementType::kBF16, ElementType::kF16}) {
    SCOPED_TRACE("out=" + std::string(element_type_name(ot)));
    Buffer<float> p(n, 1), m(n, 1), v(n, 1), g(n, 1);
    Buffer<std::uint16_t> out(n, 1);
    for (std::size_t i = 0; i < n; ++i) p[i] = std::bit_cast<float>(bits[i]);
    CpuAdam adam({.threads = 2, .isa = GetParam()});
    AdamParams hp;
    hp.lr = 0;
    hp.eps = 1;
    adam.step(hp, p.span(), m.span(), v.span(), GradView::f32(g.cspan()),
              ot == ElementType::kBF16 ? CopyOut::bf16(out.span()) : CopyOut::f16(out.span()));
    int failures = 0;
    for (std::size_t i = 0; i < n && failures < 5; ++i) {
      const float x = std::bit_cast<float>(bits[i]);
      if (std::isnan(x)) {
        ASSERT_TRUE(std::isnan(p[i]));
        const bool nan_out = ot == ElementType::kBF16 ? is_nan_bf16(out[i]) : is_nan_f16(out[i]);
        if (!nan_out) ++failures;
        EXPECT_TRUE(nan_out) << "NaN 0x" << std::hex << bits[i] << " -> 0x" << out[i];
        continue;
      }
      ASSERT_EQ(std::bit_cast<std::uint32_t>(p[i]), bits[i]) << "lr=0 changed a parameter";
      const std::uint16_t want = ot == ElementType::kBF16 ? ref_bf16(x) : ref_f16(x);
      std::uint16_t got = out[i];
      // VCVTNEPS2BF16 flushes subnormal inputs and results to zero (documented in cpu_adam.h).
      const bool flushes = GetParam() == Isa::kAvx512Bf16 && ot == ElementType::kBF16 &&
                           std::fpclassify(x) == FP_SUBNORMAL;
      if (flushes && (got & 0x7fff) == 0) got = want;
      if (got != want) {
        ++failures;
        ADD_FAILURE() << "0x" << std::hex << bits[i] << " (" << x << ") -> 0x" << out[i]
                      << ", want 0x" << want << std::dec;
      }
    }
  }
}

// beta1 = 0 and m = -0 make m equal to the widened gradient exactly, so every bf16 and fp16 bit pattern's
// decoding is checked.
TEST_P(CpuAdamIsa, WidensEveryLowPrecisionGradientExactly) {
  const std::size_t n = 65536;
  for (ElementType gt : {ElementType::kBF16, ElementType::kF16}) {
    SCOPED_TRACE("grad=" + std::string(element_type_name(gt)));
    Buffer<float> p(n, 2), m(n, 2), v(n, 2);
    Buffer<std::uint16_t> g(n, 2);
    for (std::size_t i = 0; i < n; ++i) {
      g[i] = static_cast<std::uint16_t>(i);
      m[i] = -0.0f;  // 0 * -0 + g is g for both signs of zero
    }
    CpuAdam adam({.threads = 2, .isa = GetParam()});
    AdamParams hp;
    hp.beta1 = 0;
    adam.step(hp, p.span(), m.span(), v.span(),
              gt == ElementType::kBF16 ? GradView::bf16(g.cspan()) : GradView::f16(g.cspan()));
    int failures = 0;
    for (std::size_t i = 0; i < n && failures < 5; ++i) {
      const auto h = static_cast<std::uint16_t>(i);
      const double want = gt == ElementType::kBF16 ? bf16_value(h) : f16_value(h);
      const bool ok = std::isnan(want) ? std::isnan(m[i])
                                       : static_cast<double>(m[i]) == want &&
                                             std::signbit(m[i]) == std::signbit(want);
      if (!ok) {
        ++failures;
        ADD_FAILURE() << "0x" << std::hex << i << std::dec << " -> " << m[i] << ", want " << want;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(EveryIsa, CpuAdamIsa, testing::ValuesIn(kAllIsas), isa_param_name);

// ---------------------------------------------------------------------------------------------
// Hand-computed PyTorch values: p=1.5, g=-0.25, m=0.2, v=0.01, lr=0.01, betas (0.9, 0.999),
// eps=0.05 (large, so its placement shows), step 3. By hand:
//   m = 0.9*0.2 + 0.1*(-0.25) = 0.155;  v = 0.999*0.01 + 0.001*0.0625 = 0.0100525
//   bc1 = 1 - 0.9^3 = 0.271;  bc2 = 1 - 0.999^3 = 0.002997001
//   denom = sqrt(0.0100525)/sqrt(0.002997001) + 0.05 = 1.881446...
//   p = 1.5 - 0.01/0.271 * 0.155/denom = 1.4969600169890764
// (eps inside the sqrt would give 1.49690004, eps before the correction 1.49791620.)

struct HandCase {
  const char* name;
  AdamMode mode;
  double weight_decay;
  bool bias_correction;
  double grad;
  double grad_scale;
  double p, m, v;  // expected after the step
};

class CpuAdamHand : public testing::TestWithParam<HandCase> {};

TEST_P(CpuAdamHand, MatchesPyTorchSemantics) {
  const HandCase& c = GetParam();
  for (Isa isa : supported_isas()) {
    SCOPED_TRACE(std::string(isa_name(isa)));
    CpuAdam adam({.threads = 1, .isa = isa});
    // 19 elements so that vector bodies and tails are both exercised with the same values.
    std::vector<float> p(19, 1.5f), m(19, 0.2f), v(19, 0.01f);
    std::vector<float> g(19, static_cast<float>(c.grad));
    AdamParams hp;
    hp.lr = 0.01;
    hp.beta1 = 0.9;
    hp.beta2 = 0.999;
    hp.eps = 0.05;
    hp.step = 3;
    hp.mode = c.mode;
    hp.weight_decay = c.weight_decay;
    hp.bias_correction = c.bias_correction;
    hp.grad_scale = c.grad_scale;
    adam.step(hp, p, m, v, GradView::f32(g));
    for (std::size_t i = 0; i < p.size(); ++i) {
      EXPECT_NEAR(p[i], c.p, 2e-7 * c.p) << "i=" << i;
      EXPECT_NEAR(m[i], c.m, 1e-6 * c.m) << "i=" << i;
      EXPECT_NEAR(v[i], c.v, 1e-6 * c.v) << "i=" << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Torch, CpuAdamHand,
    testing::Values(
        // torch.optim.Adam, no decay: the derivation above.
        HandCase{"Adam", AdamMode::kAdam, 0.0, true, -0.25, 1.0, 1.4969600169890764, 0.155,
                 0.0100525},
        // AdamW, wd=0.1: p first scaled by 1 - 0.01*0.1, then the same update (m, v unchanged):
        // 1.5*0.999 - 0.0030399830109236 = 1.4954600169890764.
        HandCase{"AdamW", AdamMode::kAdamW, 0.1, true, -0.25, 1.0, 1.4954600169890764, 0.155,
                 0.0100525},
        // Adam with L2, wd=0.1: g = -0.25 + 0.1*1.5 = -0.1, so m = 0.18 - 0.01 = 0.17,
        // v = 0.00999 + 0.001*0.01 = 0.01; p = 1.5 - 0.01/0.271*0.17/(0.1/0.0547449... + 0.05).
        HandCase{"AdamL2", AdamMode::kAdam, 0.1, true, -0.25, 1.0, 1.4966573172140083, 0.17, 0.01},
        // No bias correction: p = 1.5 - 0.01*0.155/(sqrt(0.0100525) + 0.05).
        HandCase{"NoBiasCorrection", AdamMode::kAdam, 0.0, false, -0.25, 1.0, 1.4896846948197562,
                 0.155, 0.0100525},
        // The scale applies before L2 decay: g = -1.0*0.25 + 0.1*1.5 = -0.1, as AdamL2.
        HandCase{"ScaleBeforeL2", AdamMode::kAdam, 0.1, true, -1.0, 0.25, 1.4966573172140083, 0.17,
                 0.01}),
    [](const testing::TestParamInfo<HandCase>& param_info) {
      return std::string(param_info.param.name);
    });

// ---------------------------------------------------------------------------------------------

std::string step_error(const AdamParams& hp, std::size_t np, std::size_t nm, std::size_t nv,
                       std::size_t ng, CopyOut out = {}) {
  std::vector<float> p(np), m(nm), v(nv), g(ng);
  CpuAdam adam({.threads = 1, .isa = Isa::kScalar});
  try {
    adam.step(hp, p, m, v, GradView::f32(g), out);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "no error";
}

TEST(CpuAdam, RejectsMismatchedLengths) {
  const AdamParams hp;
  EXPECT_EQ(step_error(hp, 10, 9, 10, 10), "cpu adam: m has 9 elements, params has 10");
  EXPECT_EQ(step_error(hp, 10, 10, 11, 10), "cpu adam: v has 11 elements, params has 10");
  EXPECT_EQ(step_error(hp, 10, 10, 10, 3), "cpu adam: grads has 3 elements, params has 10");
  std::vector<std::uint16_t> out(4);
  EXPECT_EQ(step_error(hp, 10, 10, 10, 10, CopyOut::bf16(out)),
            "cpu adam: copy-out has 4 elements, params has 10");
}

TEST(CpuAdam, RejectsNullPointersAndOverlaps) {
  CpuAdam adam({.threads = 1, .isa = Isa::kScalar});
  std::vector<float> p(8), m(8), v(8), g(8);
  try {
    adam.step({}, p, m, v, GradView{nullptr, 8, ElementType::kF32});
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(), "cpu adam: grads is null with 8 elements");
  }
  try {
    adam.step({}, p, m, v, GradView::f32(g), CopyOut{nullptr, 8, ElementType::kF16, true});
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(), "cpu adam: copy-out is null with 8 elements");
  }
  std::vector<float> big(16);
  try {
    adam.step({}, std::span(big).first(8), std::span(big).subspan(4, 8), v, GradView::f32(g));
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(), "cpu adam: params and m overlap");
  }
  std::vector<std::uint16_t> g16(8);
  auto out = std::span(reinterpret_cast<std::uint16_t*>(v.data()), 8);
  try {
    adam.step({}, p, m, v, GradView::bf16(g16), CopyOut::bf16(out));
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(), "cpu adam: v and copy-out overlap");
  }
  // An fp32 copy-out is 4 bytes per element: 8 uint16 hold only 4 of them.
  EXPECT_THROW(
      adam.step({}, p, m, v, GradView::f32(g), CopyOut{g16.data(), 4, ElementType::kF32, true}),
      UsageError);
  // Empty arrays are a no-op, null or not.
  EXPECT_NO_THROW(adam.step({}, {}, {}, {}, GradView{}));
}

TEST(CpuAdam, RejectsBadHyperParameters) {
  auto with = [](auto set) {
    AdamParams hp;
    set(hp);
    return step_error(hp, 4, 4, 4, 4);
  };
  EXPECT_EQ(with([](AdamParams& h) { h.lr = -1e-3; }),
            "cpu adam: lr must be in [0, 3.4028235e+38], got -0.001");
  EXPECT_EQ(with([](AdamParams& h) { h.lr = NAN; }),
            "cpu adam: lr must be in [0, 3.4028235e+38], got nan");
  EXPECT_EQ(with([](AdamParams& h) { h.lr = INFINITY; }),
            "cpu adam: lr must be in [0, 3.4028235e+38], got inf");
  // Finite in double but inf once the kernel rounds it to fp32.
  EXPECT_EQ(with([](AdamParams& h) { h.lr = 1e39; }),
            "cpu adam: lr must be in [0, 3.4028235e+38], got 1e+39");
  EXPECT_EQ(with([](AdamParams& h) { h.beta1 = 1.0; }), "cpu adam: beta1 must be in [0, 1), got 1");
  EXPECT_EQ(with([](AdamParams& h) { h.beta1 = -0.1; }),
            "cpu adam: beta1 must be in [0, 1), got -0.1");
  EXPECT_EQ(with([](AdamParams& h) { h.beta2 = 1.5; }),
            "cpu adam: beta2 must be in [0, 1), got 1.5");
  EXPECT_EQ(with([](AdamParams& h) { h.eps = -1; }),
            "cpu adam: eps must be in [1e-45, 3.4028235e+38], got -1");
  // eps = 0 divides 0 by 0 for an element whose gradients were all 0 (NaN parameters).
  EXPECT_EQ(with([](AdamParams& h) { h.eps = 0; }),
            "cpu adam: eps must be in [1e-45, 3.4028235e+38], got 0");
  EXPECT_EQ(with([](AdamParams& h) { h.eps = 1e-50; }),
            "cpu adam: eps must be in [1e-45, 3.4028235e+38], got 1e-50");
  EXPECT_EQ(with([](AdamParams& h) { h.weight_decay = -0.5; }),
            "cpu adam: weight_decay must be in [0, 3.4028235e+38], got -0.5");
  EXPECT_EQ(with([](AdamParams& h) { h.weight_decay = INFINITY; }),
            "cpu adam: weight_decay must be in [0, 3.4028235e+38], got inf");
  EXPECT_EQ(with([](AdamParams& h) {
              h.lr = 1e20;
              h.weight_decay = 1e20;
            }),
            "cpu adam: weight_decay times lr must be at most 3.4028235e+38, got 1e+40");
  EXPECT_EQ(with([](AdamParams& h) { h.step = 0; }), "cpu adam: step=0: steps count from 1");
  EXPECT_EQ(with([](AdamParams& h) { h.grad_scale = 0; }),
            "cpu adam: grad_scale must be in [1e-45, 3.4028235e+38], got 0");
  EXPECT_EQ(with([](AdamParams& h) { h.grad_scale = INFINITY; }),
            "cpu adam: grad_scale must be in [1e-45, 3.4028235e+38], got inf");
  EXPECT_EQ(with([](AdamParams& h) {
              h.beta1 = 0;
              h.beta2 = 0;
              h.lr = 0;
            }),
            "no error");
}

TEST(CpuAdam, RefusedCallLeavesStateUntouched) {
  CpuAdam adam({.threads = 1, .isa = std::nullopt});
  std::vector<float> p(4, 1.0f), m(4, 2.0f), v(4, 3.0f), g(4, 4.0f);
  AdamParams hp;
  hp.beta2 = 1.0;
  EXPECT_THROW(adam.step(hp, p, m, v, GradView::f32(g)), UsageError);
  EXPECT_EQ(p, std::vector<float>(4, 1.0f));
  EXPECT_EQ(m, std::vector<float>(4, 2.0f));
  EXPECT_EQ(v, std::vector<float>(4, 3.0f));
}

using test::ScopedEnv;

TEST(CpuAdam, IsaChosenByOptionThenEnvironmentThenCpuid) {
  {
    ScopedEnv env("ZINF_CPU_ADAM_ISA", "auto");
    EXPECT_EQ(CpuAdam({.threads = 1, .isa = std::nullopt}).isa(), best_isa());
  }
  {
    ScopedEnv env("ZINF_CPU_ADAM_ISA", "scalar");
    EXPECT_EQ(CpuAdam({.threads = 1, .isa = std::nullopt}).isa(), Isa::kScalar);
    EXPECT_EQ(CpuAdam({.threads = 1, .isa = best_isa()}).isa(), best_isa());
  }
  {
    ScopedEnv env("ZINF_CPU_ADAM_ISA", "avx3");
    try {
      CpuAdam adam({.threads = 1, .isa = std::nullopt});
      FAIL();
    } catch (const UsageError& e) {
      EXPECT_STREQ(e.what(),
                   "invalid ZINF_CPU_ADAM_ISA 'avx3': expected auto, avx512bf16, avx512, avx2, "
                   "sve, neon or scalar");
    }
  }
  EXPECT_EQ(supported_isas().back(), Isa::kScalar);
  EXPECT_EQ(supported_isas().front(), best_isa());
}

TEST(CpuAdam, UnsupportedIsaIsAnError) {
  // The paths are read at load, so the refusal runs in a fresh process whose environment hides
  // AVX-512 (ZINF_CPU_ADAM_DISABLE): it works on a CPU that has every path, as here.
  if (const std::string& why = test::self_exec_unavailable_reason(); !why.empty()) {
    GTEST_SKIP() << "needs a fresh process, which reads the environment at load: " << why;
  }
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  ScopedEnv env("ZINF_CPU_ADAM_DISABLE", "avx512");
  EXPECT_EXIT(
      {
        if (isa_supported(Isa::kAvx512) || isa_supported(Isa::kAvx512Bf16)) std::_Exit(3);
        try {
          CpuAdam adam({.threads = 1, .isa = Isa::kAvx512});
          std::_Exit(1);
        } catch (const UsageError& e) {
          const std::string what = e.what();
          std::_Exit(what.find("avx512") != std::string::npos &&
                             what.find("is not supported on this machine") != std::string::npos &&
                             best_isa() != Isa::kAvx512
                         ? 0
                         : 2);
        }
      },
      ::testing::ExitedWithCode(0), "");
}

// The Arm counterpart: ZINF_CPU_ADAM_DISABLE=neon hides the NEON path, and naming it is then an
// error. The variable is read at load, so ctest runs this test in a process started with it set
// (CpuAdam.DisabledNeonIsAnError.Environment, tests/adam/CMakeLists.txt) rather than as a death
// test: a death test's fresh process needs an exec, which qemu-user cannot do for an aarch64
// executable, and qemu-user is where the aarch64 build's tests run.
// The same check for either Arm path, run only in the process ctest starts with
// ZINF_CPU_ADAM_DISABLE naming it.
void expect_hidden_isa_refused(Isa hidden_isa) {
  const std::string name(isa_name(hidden_isa));
  const char* hidden = std::getenv("ZINF_CPU_ADAM_DISABLE");
  if (hidden == nullptr || std::string(hidden) != name) {
    GTEST_SKIP() << "runs as its .Environment ctest entry, started with ZINF_CPU_ADAM_DISABLE="
                 << name;
  }
  EXPECT_FALSE(isa_supported(hidden_isa));
  EXPECT_NE(best_isa(), hidden_isa);
  for (Isa isa : supported_isas()) EXPECT_NE(isa, hidden_isa);
  try {
    CpuAdam adam({.threads = 1, .isa = hidden_isa});
    FAIL() << name << " was hidden but a CpuAdam was built on it";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("cpu adam: isa '" + name +
                                         "' requested by option is not supported on this machine"),
              std::string::npos)
        << e.what();
  }
}

TEST(CpuAdam, DisabledNeonIsAnError) { expect_hidden_isa_refused(Isa::kNeon); }

// ZINF_CPU_ADAM_DISABLE=sve hides the SVE path on a CPU that has it (qemu's default "max" CPU
// does): CpuAdam.DisabledSveIsAnError.Environment.
TEST(CpuAdam, DisabledSveIsAnError) { expect_hidden_isa_refused(Isa::kSve); }

// SVE's vector length decides between SVE and NEON (cpu_adam.cc, preference_order()): "auto"
// takes SVE only where its vectors are wider than NEON's 16 bytes. Runs in the processes ctest
// starts under qemu with QEMU_CPU setting the length and ZINF_TEST_SVE_BYTES naming it (0: SVE
// turned off), CpuAdam.SveVectorLength<bytes> in tests/adam/CMakeLists.txt, next to the
// EveryIsa/CpuAdamIsa.*/sve cases, which then compare the SVE path with the scalar one and
// fp64 at that length. Since the bits must not depend on the length, passing at every length
// is the check that they do not.
TEST(CpuAdam, SveChosenByVectorLength) {
  const char* bytes_text = std::getenv("ZINF_TEST_SVE_BYTES");
  if (bytes_text == nullptr) {
    GTEST_SKIP() << "runs as CpuAdam.SveVectorLength<bytes> under qemu, started with "
                    "ZINF_TEST_SVE_BYTES and QEMU_CPU";
  }
  const long bytes = std::strtol(bytes_text, nullptr, 10);
  if (bytes == 0) {
    EXPECT_FALSE(isa_supported(Isa::kSve));
    EXPECT_EQ(best_isa(), Isa::kNeon);
    return;
  }
  ASSERT_TRUE(isa_supported(Isa::kSve)) << "QEMU_CPU did not give this process SVE";
  const std::vector<Isa> order = supported_isas();
  if (bytes > 16) {
    EXPECT_EQ(best_isa(), Isa::kSve);
    EXPECT_EQ(order, (std::vector<Isa>{Isa::kSve, Isa::kNeon, Isa::kScalar}));
  } else {
    EXPECT_EQ(best_isa(), Isa::kNeon);
    EXPECT_EQ(order, (std::vector<Isa>{Isa::kNeon, Isa::kSve, Isa::kScalar}));
  }
  EXPECT_EQ(CpuAdam({.threads = 1, .isa = std::nullopt}).isa(), best_isa());
}

TEST(CpuAdam, NamesAndParsing) {
  for (Isa isa : kAllIsas) {
    EXPECT_EQ(parse_isa(isa_name(isa), "--isa"), isa);
  }
  EXPECT_EQ(isa_name(Isa::kNeon), "neon");
  EXPECT_EQ(isa_name(Isa::kSve), "sve");
  EXPECT_EQ(parse_isa("auto", "--isa"), std::nullopt);
  EXPECT_THROW(parse_isa("AVX2", "--isa"), UsageError);
  EXPECT_EQ(element_type_name(ElementType::kBF16), "bf16");
  EXPECT_THROW(CpuAdam({.threads = 5000, .isa = std::nullopt}), UsageError);
  EXPECT_GE(CpuAdam({.threads = 0, .isa = std::nullopt}).threads(), 1u);
}

// ElementType also names the collectives' wider types; a buffer of one is refused before any
// memory is touched, with the argument named.
TEST(CpuAdam, AReductionOnlyElementTypeIsRefusedAndChangesNothing) {
  CpuAdam adam({.threads = 1, .isa = std::nullopt});
  const std::size_t n = 40;
  Problem pr(n, 0, kSeed);
  const Problem init(n, 0, kSeed);
  GradView wide = pr.grads(ElementType::kF32);
  wide.dtype = ElementType::kF64;
  const AdamParams hp = typical(AdamMode::kAdamW, 0.1, true);
  try {
    adam.step(hp, pr.p.span(), pr.m.span(), pr.v.span(), wide, CopyOut::none());
    ADD_FAILURE() << "fp64 gradients were accepted";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(),
                 "cpu adam: grads: element type fp64 is not a buffer type (fp32, bf16 or fp16)");
  }
  CopyOut out = copy_out(ElementType::kBF16, pr.out);
  out.dtype = ElementType::kU8;
  EXPECT_THROW(
      adam.step(hp, pr.p.span(), pr.m.span(), pr.v.span(), pr.grads(ElementType::kF32), out),
      UsageError);
  EXPECT_THROW(adam.copy_out(pr.p.cspan(), out), UsageError);
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_EQ(std::bit_cast<std::uint32_t>(pr.p[i]), std::bit_cast<std::uint32_t>(init.p[i]));
    ASSERT_EQ(std::bit_cast<std::uint32_t>(pr.m[i]), std::bit_cast<std::uint32_t>(init.m[i]));
  }
}

TEST(CpuAdam, ConcurrentStepsShareThePool) {
  CpuAdam shared({.threads = 2, .isa = std::nullopt});
  CpuAdam alone({.threads = 1, .isa = std::nullopt});
  const std::size_t n = 3 * kChunk + 5;
  Problem a(n, 0, kSeed), b(n, 1, kSeed + 1), ra(n, 0, kSeed), rb(n, 1, kSeed + 1);
  const AdamParams hp = typical(AdamMode::kAdamW, 0.01, true);
  std::thread ta([&] {
    for (int i = 0; i < 3; ++i) {
      shared.step(hp, a.p.span(), a.m.span(), a.v.span(), a.grads(ElementType::kF32));
    }
  });
  std::thread tb([&] {
    for (int i = 0; i < 3; ++i) {
      shared.step(hp, b.p.span(), b.m.span(), b.v.span(), b.grads(ElementType::kF16));
    }
  });
  ta.join();
  tb.join();
  for (int i = 0; i < 3; ++i) {
    alone.step(hp, ra.p.span(), ra.m.span(), ra.v.span(), ra.grads(ElementType::kF32));
    alone.step(hp, rb.p.span(), rb.m.span(), rb.v.span(), rb.grads(ElementType::kF16));
  }
  EXPECT_EQ(std::memcmp(a.p.cspan().data(), ra.p.cspan().data(), n * 4), 0);
  EXPECT_EQ(std::memcmp(b.p.cspan().data(), rb.p.cspan().data(), n * 4), 0);
}

TEST(StreamRmw, ComputesAPlusSB) {
  for (std::size_t threads : {1, 3}) {
    StreamRmw rmw(threads);
    for (std::size_t n : {std::size_t{1}, std::size_t{17}, 2 * kChunk + 3}) {
      std::vector<float> a(n), b(n);
      for (std::size_t i = 0; i < n; ++i) {
        a[i] = static_cast<float>(i);
        b[i] = static_cast<float>(i % 7);
      }
      rmw.run(a, b, 0.5f);
      for (std::size_t i = 0; i < n; ++i) {
        ASSERT_EQ(a[i], static_cast<float>(i) + 0.5f * static_cast<float>(i % 7)) << i;
      }
    }
    std::vector<float> a(3), b(4);
    EXPECT_THROW(rmw.run(a, b, 1.0f), UsageError);
  }
}

}  // namespace
}  // namespace zinf::adam
