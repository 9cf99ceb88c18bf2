// SPDX-License-Identifier: Apache-2.0
// The run-time choice of the x86 paths' software prefetch distance: the tuner's choice from
// its samples, CpuAdam's calibration on its first large steps, the option and environment
// that fix the distance, their errors, and that no distance changes a bit of a step.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "prefetch_tuner.h"
#include "support/scoped_env.h"
#include "zinf/adam/cpu_adam.h"
#include "zinf/common/error.h"

namespace zinf::adam {
namespace {

using detail::kPrefetchCandidates;
using detail::PrefetchTuner;

bool has_software_prefetch(Isa isa) {
  return isa == Isa::kAvx2 || isa == Isa::kAvx512 || isa == Isa::kAvx512Bf16;
}

using test::ScopedEnv;

TEST(PrefetchTuner, KeepsTheDefaultUntilEveryCandidateHasItsSamples) {
  PrefetchTuner t;
  EXPECT_EQ(t.current(), detail::kDefaultPrefetchElems);
  EXPECT_FALSE(t.calibrated());
  EXPECT_FALSE(t.wants(PrefetchTuner::kMinStepElements - 1));
  EXPECT_TRUE(t.wants(PrefetchTuner::kMinStepElements));
  // Every candidate but the last gets all its samples: still no choice.
  for (std::size_t c = 0; c + 1 < kPrefetchCandidates.size(); ++c) {
    for (std::size_t s = 0; s < PrefetchTuner::kSamples; ++s) t.record(c, 1.0);
  }
  for (std::size_t s = 0; s + 1 < PrefetchTuner::kSamples; ++s) {
    t.record(kPrefetchCandidates.size() - 1, 0.5);
  }
  EXPECT_FALSE(t.calibrated());
  EXPECT_EQ(t.current(), detail::kDefaultPrefetchElems);
  t.record(kPrefetchCandidates.size() - 1, 0.5);
  EXPECT_TRUE(t.calibrated());
  EXPECT_EQ(t.current(), kPrefetchCandidates.back());
  EXPECT_FALSE(t.wants(PrefetchTuner::kMinStepElements));  // calibrated: no more timing
}

TEST(PrefetchTuner, ChoosesTheLowestMedianNotTheLowestSample) {
  PrefetchTuner t;
  // Candidate 1 has the single fastest chunk but is slow in the median; candidate 3 (512) is
  // the fastest in the median. A preempted chunk (100 ns/element) in candidate 3 changes
  // nothing either.
  const std::vector<double> med = {1.0, 1.2, 0.9, 0.8, 1.1};
  for (std::size_t s = 0; s < PrefetchTuner::kSamples; ++s) {
    for (std::size_t c = 0; c < kPrefetchCandidates.size(); ++c) {
      double x = med[c];
      if (c == 1 && s == 0) x = 0.01;
      if (c == 3 && s == 5) x = 100.0;
      t.record(c, x);
    }
  }
  ASSERT_TRUE(t.calibrated());
  EXPECT_EQ(t.current(), 512u);
  const auto m = t.medians();
  EXPECT_DOUBLE_EQ(m[1], 1.2);
  EXPECT_DOUBLE_EQ(m[3], 0.8);
  // A chunk still in flight when the choice was made changes nothing.
  for (std::size_t s = 0; s < 3 * PrefetchTuner::kSamples; ++s) t.record(0, 0.001);
  EXPECT_EQ(t.current(), 512u);
  EXPECT_DOUBLE_EQ(t.medians()[0], 1.0);
}

TEST(PrefetchTuner, NextCandidateTakesEachInTurn) {
  PrefetchTuner t;
  for (std::size_t round = 0; round < 3; ++round) {
    for (std::size_t c = 0; c < kPrefetchCandidates.size(); ++c) EXPECT_EQ(t.next_candidate(), c);
  }
}

TEST(PrefetchTuner, ParsesAutoOffAndCountsAndRefusesTheRest) {
  EXPECT_EQ(parse_prefetch("auto", "--prefetch"), std::nullopt);
  EXPECT_EQ(parse_prefetch("off", "--prefetch"), std::optional<std::size_t>(0));
  EXPECT_EQ(parse_prefetch("1", "--prefetch"), std::optional<std::size_t>(1));
  EXPECT_EQ(parse_prefetch("65536", "--prefetch"), std::optional<std::size_t>(65536));
  for (const char* bad : {"0", "65537", "-1", "12x", "", "Auto", " 256", "1e3"}) {
    try {
      (void)parse_prefetch(bad, "--prefetch");
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const UsageError& e) {
      EXPECT_EQ(std::string(e.what()),
                "--prefetch: expected auto, off or a number of elements in [1, 65536], got '" +
                    std::string(bad) + "'");
    }
  }
}

// A step's inputs, with values that keep every element a normal float.
struct State {
  explicit State(std::size_t n) : p(n), m(n), v(n), g(n) {
    for (std::size_t i = 0; i < n; ++i) {
      const auto h = static_cast<std::uint32_t>(i * 2654435761u);
      p[i] = static_cast<float>(h % 2001u) / 1000.0f - 1.0f;
      m[i] = static_cast<float>((h >> 7) % 101u) * 1e-5f;
      v[i] = static_cast<float>((h >> 13) % 103u) * 1e-8f;
      g[i] = (static_cast<float>((h >> 11) % 2001u) / 1000.0f - 1.0f) * 1e-3f;
    }
  }
  void step(CpuAdam& adam, std::uint64_t t) {
    AdamParams hp;
    hp.lr = 1e-3;
    hp.weight_decay = 0.01;
    hp.mode = AdamMode::kAdamW;
    hp.step = t;
    adam.step(hp, p, m, v, GradView::f32(g));
  }
  bool operator==(const State& o) const {
    const auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
      return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
    };
    return same(p, o.p) && same(m, o.m) && same(v, o.v);
  }
  std::vector<float> p, m, v, g;
};

// Every distance, none included, gives the bits of the default on every path; on a path
// without software prefetch (scalar, NEON, SVE) any distance asked for is reported as none.
TEST(CpuAdamPrefetch, EveryDistanceGivesTheSameBits) {
  constexpr std::size_t kN = 200'003;  // three chunks and a ragged tail
  for (Isa isa : supported_isas()) {
    SCOPED_TRACE(std::string(isa_name(isa)));
    CpuAdam ref_adam({.threads = 2, .isa = isa, .prefetch_elements = 256});
    State ref(kN);
    for (std::uint64_t t = 1; t <= 3; ++t) ref.step(ref_adam, t);
    for (std::size_t d : {std::size_t{0}, std::size_t{1}, std::size_t{128}, std::size_t{1024},
                          std::size_t{65536}}) {
      SCOPED_TRACE("prefetch " + std::to_string(d));
      CpuAdam adam({.threads = 2, .isa = isa, .prefetch_elements = d});
      const PrefetchSetting pf = adam.prefetch();
      if (has_software_prefetch(isa)) {
        EXPECT_EQ(pf.elements, d);
        EXPECT_EQ(pf.source, "option");
      } else {
        EXPECT_EQ(pf.elements, 0u);
        EXPECT_EQ(pf.source, "none");
      }
      State s(kN);
      for (std::uint64_t t = 1; t <= 3; ++t) s.step(adam, t);
      EXPECT_TRUE(s == ref);
    }
  }
}

// "auto": the first steps of at least kMinStepElements time their chunks; after 16 full chunks
// per candidate the process keeps one of the candidates. The calibrating steps' results are
// the bits of a fixed distance's.
TEST(CpuAdamPrefetch, AutoCalibratesOnTheFirstLargeSteps) {
  CpuAdam adam({.threads = 2});
  if (!has_software_prefetch(adam.isa())) {
    // This host's best path has no software prefetch: nothing to calibrate.
    EXPECT_EQ(adam.prefetch().elements, 0u);
    EXPECT_EQ(adam.prefetch().source, "none");
    return;
  }
  ASSERT_EQ(adam.prefetch().source, "default") << "calibrated before this test (same process)";
  EXPECT_EQ(adam.prefetch().elements, detail::kDefaultPrefetchElems);
  CpuAdam fixed({.threads = 2, .prefetch_elements = 256});

  // A small step does not calibrate.
  State small(PrefetchTuner::kMinStepElements - 1), small_ref(PrefetchTuner::kMinStepElements - 1);
  small.step(adam, 1);
  small_ref.step(fixed, 1);
  EXPECT_TRUE(small == small_ref);
  EXPECT_EQ(adam.prefetch().source, "default");

  // Sub-group sized steps (1 Mi elements, 16 chunks) until the choice is made: 16 timed chunks
  // per candidate take 5 steps, or 6 where the arrays do not start on a cache line (the first
  // chunk then takes the head and the last, shorter one is not timed).
  constexpr std::size_t kN = PrefetchTuner::kMinStepElements;
  State s(kN), ref(kN);
  std::uint64_t t = 1;
  for (; t <= 10 && adam.prefetch().source == "default"; ++t) {
    s.step(adam, t);
    ref.step(fixed, t);
  }
  EXPECT_LE(t - 1, 6u);
  EXPECT_TRUE(s == ref);
  const PrefetchSetting pf = adam.prefetch();
  EXPECT_EQ(pf.source, "calibrated");
  EXPECT_NE(std::find(kPrefetchCandidates.begin(), kPrefetchCandidates.end(), pf.elements),
            kPrefetchCandidates.end());
  // Every instance of the same path in the process now uses the choice.
  CpuAdam later({.threads = 1, .isa = adam.isa()});
  EXPECT_EQ(later.prefetch().source, "calibrated");
  EXPECT_EQ(later.prefetch().elements, pf.elements);
  s.step(adam, t);
  ref.step(fixed, t);
  EXPECT_TRUE(s == ref);
}

TEST(CpuAdamPrefetch, EnvironmentFixesTheDistance) {
  {
    ScopedEnv env("ZINF_CPU_ADAM_PREFETCH", "off");
    CpuAdam adam({.threads = 1});
    if (has_software_prefetch(adam.isa())) {
      EXPECT_EQ(adam.prefetch().elements, 0u);
      EXPECT_EQ(adam.prefetch().source, "environment");
    } else {
      EXPECT_EQ(adam.prefetch().source, "none");
    }
    // The option wins over the environment.
    CpuAdam opt({.threads = 1, .prefetch_elements = 128});
    EXPECT_EQ(opt.prefetch().source, has_software_prefetch(opt.isa()) ? "option" : "none");
  }
  {
    ScopedEnv env("ZINF_CPU_ADAM_PREFETCH", "auto");
    CpuAdam adam({.threads = 1});
    EXPECT_NE(adam.prefetch().source, "environment");
  }
}

TEST(CpuAdamPrefetch, BadEnvironmentOrOptionIsAClearError) {
  {
    ScopedEnv env("ZINF_CPU_ADAM_PREFETCH", "far");
    try {
      CpuAdam adam({.threads = 1});
      FAIL() << "accepted ZINF_CPU_ADAM_PREFETCH=far";
    } catch (const UsageError& e) {
      EXPECT_EQ(std::string(e.what()),
                "ZINF_CPU_ADAM_PREFETCH: expected auto, off or a number of elements in [1, "
                "65536], got 'far'");
    }
  }
  try {
    CpuAdam adam({.threads = 1, .prefetch_elements = 70000});
    FAIL() << "accepted prefetch_elements=70000";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()),
              "cpu adam: prefetch_elements=70000 exceeds the limit of 65536");
  }
}

}  // namespace
}  // namespace zinf::adam
