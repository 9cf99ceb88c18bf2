// SPDX-License-Identifier: Apache-2.0
// OffloadedOptimizer with compact moments (OptimizerOptions::state_precision bf16 and int8),
// on the cpu and nvme tiers: steps bitwise equal to CpuAdam's compact step on each
// sub-group's own record, set_state/read_state conversions, the bytes each record and step
// moves, checkpoints that round-trip and name their precision, a checkpoint of another
// precision refused with both names, and a corrupt byte of compact state still detected.
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "optimizer_test_util.h"
#include "support/corrupt_swap_file.h"
#include "support/test_dir.h"
#include "zinf/adam/compact_state.h"
#include "zinf/common/align.h"
#include "zinf/common/error.h"
#include "zinf/optim/optimizer.h"

namespace zinf::optim {
namespace {

using adam::StatePrecision;

struct Mode {
  StateTier tier;
  StatePrecision precision;
};

std::string mode_name(const testing::TestParamInfo<Mode>& info) {
  return std::string(state_tier_name(info.param.tier)) + "_" +
         std::string(adam::state_precision_name(info.param.precision));
}

// Compact moments of one sub-group, as a record keeps them (zero: all-zero bytes).
struct Moments {
  StatePrecision p;
  std::size_t n;
  std::vector<std::byte> bytes;
  Moments(StatePrecision prec, std::size_t size)
      : p(prec), n(size), bytes(adam::moment_bytes(prec, size)) {}
  adam::CompactMoments view() { return adam::compact_moments_at(p, n, bytes.data()); }
};

// The reference: CpuAdam's compact step on every sub-group's own moments (an int8 block never
// straddles two records), `steps` steps from the initial parameters with zero moments.
test::State compact_reference(const std::vector<ParamGroupSpec>& groups, StatePrecision prec,
                              std::uint64_t sub, std::uint64_t steps) {
  adam::CpuAdam adam;
  test::State s;
  std::vector<std::vector<Moments>> mom(groups.size());
  for (std::size_t g = 0; g < groups.size(); ++g) {
    s.p.push_back(test::initial_params(g, groups[g].numel));
    for (std::uint64_t off = 0; off < groups[g].numel; off += sub) {
      mom[g].emplace_back(prec, std::min(sub, groups[g].numel - off));
    }
  }
  for (std::uint64_t t = 1; t <= steps; ++t) {
    test::StepGrads sg(groups, t, ElementType::kF32);
    for (std::size_t g = 0; g < groups.size(); ++g) {
      adam::AdamParams hp = test::test_hyper();
      hp.step = t;
      for (std::size_t r = 0; r < mom[g].size(); ++r) {
        const std::uint64_t off = r * sub, n = mom[g][r].n;
        adam.step(hp, std::span<float>(s.p[g]).subspan(off, n), mom[g][r].view(),
                  adam::GradView::f32(std::span<const float>(sg.f32[g]).subspan(off, n)));
      }
    }
  }
  for (std::size_t g = 0; g < groups.size(); ++g) {
    s.m.emplace_back(groups[g].numel);
    s.v.emplace_back(groups[g].numel);
    for (std::size_t r = 0; r < mom[g].size(); ++r) {
      const std::uint64_t off = r * sub, n = mom[g][r].n;
      adam::decode_moments(mom[g][r].view(), std::span<float>(s.m[g]).subspan(off, n),
                           std::span<float>(s.v[g]).subspan(off, n));
    }
  }
  return s;
}

class CompactOptimizer : public testing::TestWithParam<Mode> {
 protected:
  OptimizerOptions options(const std::string& subdir) const {
    OptimizerOptions o;
    o.tier = GetParam().tier;
    o.state_precision = GetParam().precision;
    o.sub_group_elements = test::kOddSubGroup;
    o.hyper = test::test_hyper();
    if (o.tier == StateTier::kNvme) o.directories = {dir_.subdir(subdir)};
    return o;
  }
  // The padded record of n elements in this precision.
  std::uint64_t record_bytes(std::uint64_t n, std::uint32_t alignment) const {
    return align_up(4 * n + adam::moment_bytes(GetParam().precision, n), alignment);
  }
  test::TestDir dir_;
};

TEST_P(CompactOptimizer, StepsMatchTheCompactKernelOnEachRecord) {
  OffloadedOptimizer opt(options("nvme"), test::odd_groups());
  EXPECT_EQ(opt.state_precision(), GetParam().precision);
  test::init_all(opt);
  test::run_steps(opt, 1, 3);
  const test::State want =
      compact_reference(test::odd_groups(), GetParam().precision, test::kOddSubGroup, 3);
  EXPECT_EQ(test::diff(test::read_all(opt), want), "");
}

// Every record holds 4 bytes of fp32 master parameter per element and the moments in their
// precision: 8 (bf16) or 2 + 8/64 (int8) bytes, and an nvme step moves exactly those records.
TEST_P(CompactOptimizer, RecordsAndStepsMoveTheModesBytes) {
  OffloadedOptimizer opt(options("nvme"), test::odd_groups());
  test::init_all(opt);
  const std::uint32_t alignment = 4096;  // the probed alignment of the test directory
  EXPECT_EQ(opt.record_bytes(), record_bytes(test::kOddSubGroup, alignment));
  const std::uint64_t per_element = GetParam().precision == StatePrecision::kBF16 ? 8 : 6;
  EXPECT_LE(opt.record_bytes(), align_up(per_element * test::kOddSubGroup + 8 * 65, alignment));
  test::StepGrads sg(test::odd_groups(), 1, ElementType::kF32);
  const StepStats st = opt.step(sg.views);
  if (GetParam().tier == StateTier::kNvme) {
    std::uint64_t want = 0;
    for (const auto& g : test::odd_groups()) {
      for (std::uint64_t off = 0; off < g.numel; off += test::kOddSubGroup) {
        want += record_bytes(std::min(test::kOddSubGroup, g.numel - off), alignment);
      }
    }
    EXPECT_EQ(st.bytes_read, want);
    EXPECT_EQ(st.bytes_written, want);
  }
}

// set_state encodes the moments as the step does, read_state decodes them: what comes back is
// the moments rounded once (bf16 to nearest even; int8 per 64-element block of a record).
TEST_P(CompactOptimizer, SetStateThenReadStateGivesTheMomentsEncodedOnce) {
  const std::vector<ParamGroupSpec> groups = {{"w", 2 * test::kOddSubGroup + 100}};
  OffloadedOptimizer opt(options("nvme"), groups);
  const std::uint64_t n = groups[0].numel;
  std::vector<float> p = test::initial_params(0, n), m(n), v(n);
  for (std::uint64_t i = 0; i < n; ++i) {
    m[i] = p[i] * 1e-3f * static_cast<float>(i % 5);
    v[i] = p[i] * p[i] * 1e-6f * static_cast<float>(i % 3);
  }
  opt.set_state(0, p, m, v);
  std::vector<float> p2(n), m2(n), v2(n);
  opt.read_state(0, p2, m2, v2);
  EXPECT_EQ(p2, p);
  for (std::uint64_t off = 0; off < n; off += test::kOddSubGroup) {
    const std::uint64_t len = std::min(test::kOddSubGroup, n - off);
    Moments c(GetParam().precision, len);
    adam::encode_moments(std::span<const float>(m).subspan(off, len),
                         std::span<const float>(v).subspan(off, len), c.view());
    std::vector<float> dm(len), dv(len);
    adam::decode_moments(c.view(), dm, dv);
    for (std::uint64_t i = 0; i < len; ++i) {
      ASSERT_EQ(std::bit_cast<std::uint32_t>(m2[off + i]), std::bit_cast<std::uint32_t>(dm[i]))
          << "m[" << off + i << "]";
      ASSERT_EQ(std::bit_cast<std::uint32_t>(v2[off + i]), std::bit_cast<std::uint32_t>(dv[i]))
          << "v[" << off + i << "]";
    }
  }
  // Only m or only v, as read_state allows.
  std::vector<float> m3(n);
  opt.read_state(0, {}, m3, {});
  EXPECT_EQ(m3, m2);
}

std::string latest(const std::string& ckpt) {
  std::ifstream in(ckpt + "/LATEST");
  std::string name;
  std::getline(in, name);
  return name;
}

// A checkpoint saved mid-run and loaded into a fresh optimizer (the other tier) continues
// bitwise as the saving run does; its manifest names the precision (format 3).
TEST_P(CompactOptimizer, CheckpointRoundTripsAndNamesItsPrecision) {
  const std::string ckpt = dir_.file("ckpt");
  test::State saver;
  {
    OffloadedOptimizer a(options("nvme-a"), test::odd_groups());
    test::init_all(a);
    test::run_steps(a, 1, 2);
    a.save(ckpt);
    test::run_steps(a, 3, 4);
    saver = test::read_all(a);
  }  // releases the checkpoint directory's lock

  OptimizerOptions ob = options("nvme-b");
  ob.tier = GetParam().tier == StateTier::kCpu ? StateTier::kNvme : StateTier::kCpu;
  ob.directories = {dir_.subdir("nvme-b")};
  OffloadedOptimizer b(ob, test::odd_groups());
  b.load(ckpt);
  EXPECT_EQ(b.step_count(), 2u);
  test::run_steps(b, 3, 4);
  EXPECT_EQ(test::diff(saver, test::read_all(b)), "");

  std::ifstream in(ckpt + "/" + latest(ckpt) + "/manifest");
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(text.str().rfind("zinf-optimizer-checkpoint 3\n", 0), 0u) << text.str();
  EXPECT_NE(text.str().find("\nstate_precision " +
                            std::string(adam::state_precision_name(GetParam().precision)) + "\n"),
            std::string::npos)
      << text.str();
}

// Loading a checkpoint of another precision is refused before anything changes, naming both
// precisions; an fp32 checkpoint stays format 2 and is refused by a compact optimizer alike.
TEST_P(CompactOptimizer, CheckpointOfAnotherPrecisionIsRefusedNamingBoth) {
  const std::string name(adam::state_precision_name(GetParam().precision));
  const std::string ckpt = dir_.file("ckpt-compact");
  {
    OffloadedOptimizer a(options("nvme-a"), test::odd_groups());
    test::init_all(a);
    test::run_steps(a, 1, 1);
    a.save(ckpt);
  }  // releases the checkpoint directory's lock

  OptimizerOptions of = options("nvme-f");
  of.state_precision = StatePrecision::kF32;
  OffloadedOptimizer f(of, test::odd_groups());
  test::init_all(f);
  const test::State before = test::read_all(f);
  try {
    f.load(ckpt);
    FAIL() << "a " << name << " checkpoint loaded into an fp32 optimizer";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()), "OffloadedOptimizer::load: checkpoint " + ckpt + "/" +
                                         latest(ckpt) + " does not match: state_precision " + name +
                                         ", here fp32");
  }
  EXPECT_FALSE(f.failed());
  EXPECT_EQ(f.step_count(), 0u);
  EXPECT_EQ(test::diff(test::read_all(f), before), "");

  const std::string ckpt32 = dir_.file("ckpt-fp32");
  f.save(ckpt32);
  f.checkpoint_directory(dir_.subdir("elsewhere"), false);  // releases ckpt32's lock
  std::ifstream in(ckpt32 + "/" + latest(ckpt32) + "/manifest");
  std::string first;
  std::getline(in, first);
  EXPECT_EQ(first, "zinf-optimizer-checkpoint 2");
  OffloadedOptimizer c(options("nvme-c"), test::odd_groups());
  try {
    c.load(ckpt32);
    FAIL() << "an fp32 checkpoint loaded into a " << name << " optimizer";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()), "OffloadedOptimizer::load: checkpoint " + ckpt32 + "/" +
                                         latest(ckpt32) +
                                         " does not match: state_precision fp32, here " + name);
  }
}

// The checkpoint's CRC covers a compact record's bytes: a byte flipped in the moments of the
// second record (embed#1) fails the load with kCorrupt naming state.bin, the record's offset
// and its state bytes (8 or 6.125 per element, not fp32's 12).
TEST_P(CompactOptimizer, CorruptCompactCheckpointIsDetectedNamingFileAndOffset) {
  const std::string ckpt = dir_.file("ckpt");
  {
    OffloadedOptimizer a(options("nvme-a"), test::odd_groups());
    test::init_all(a);
    test::run_steps(a, 1, 1);
    a.save(ckpt);
  }
  const std::uint64_t n = test::kOddSubGroup;
  const std::uint64_t state_bytes = 4 * n + adam::moment_bytes(GetParam().precision, n);
  const std::uint64_t second = record_bytes(n, 4096);  // embed#1 follows embed#0
  const std::string state = ckpt + "/" + latest(ckpt) + "/state.bin";
  {
    std::fstream f(state, std::ios::in | std::ios::out | std::ios::binary);
    const auto at = static_cast<std::streamoff>(second + 4 * n + 10);  // past its params
    f.seekg(at);
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x10);
    f.seekp(at);
    f.write(&c, 1);
  }
  OffloadedOptimizer b(options("nvme-b"), test::odd_groups());
  try {
    b.load(ckpt);
    FAIL() << "a corrupt checkpoint loaded";
  } catch (const IoError& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCorrupt);
    EXPECT_EQ(std::string(e.what()).rfind("checkpoint load failed: " + state +
                                              " offset=" + std::to_string(second) +
                                              " length=" + std::to_string(state_bytes) +
                                              ": CRC32C mismatch in group 'embed' sub-group 1",
                                          0),
              0u)
        << e.what();
  }
  EXPECT_TRUE(b.failed());
}

INSTANTIATE_TEST_SUITE_P(Modes, CompactOptimizer,
                         testing::Values(Mode{StateTier::kCpu, StatePrecision::kBF16},
                                         Mode{StateTier::kCpu, StatePrecision::kInt8},
                                         Mode{StateTier::kNvme, StatePrecision::kBF16},
                                         Mode{StateTier::kNvme, StatePrecision::kInt8}),
                         mode_name);

// The swap checksums cover compact records as they cover fp32 ones: a byte flipped in the
// moments (bf16 codes) or in an int8 scale between two steps fails the next step with
// IoError kCorrupt naming the swap file, before any of it reaches the update; the step is
// undone (the first record, before any write-back) and the optimizer stays usable.
TEST(CompactOptimizerIntegrity, AFlippedByteOfCompactStateFailsTheNextStep) {
  test::TestDir dir;
  for (StatePrecision prec : {StatePrecision::kBF16, StatePrecision::kInt8}) {
    const std::string name(adam::state_precision_name(prec));
    SCOPED_TRACE(name);
    OptimizerOptions o;
    o.tier = StateTier::kNvme;
    o.state_precision = prec;
    o.sub_group_elements = test::kOddSubGroup;
    o.hyper = test::test_hyper();
    o.directories = {dir.subdir(name)};
    OffloadedOptimizer opt(o, test::odd_groups());
    test::init_all(opt);
    test::run_steps(opt, 1, 1);
    // Record embed#0 is first in the file: its params are bytes [0, 4 x 4099); then (bf16) m,
    // or (int8) the m scales.
    const std::uint64_t offset = 4 * test::kOddSubGroup + 2;
    (void)test::flip_swap_file_byte(dir.file(name), offset);
    test::StepGrads sg(test::odd_groups(), 2, ElementType::kF32);
    try {
      (void)opt.step(sg.views);
      ADD_FAILURE() << "step 2 trained on a corrupt " << name << " record";
    } catch (const IoError& e) {
      EXPECT_EQ(e.status().code(), ErrorCode::kCorrupt) << e.what();
      EXPECT_NE(std::string(e.what()).find(opt.swap_file_paths()[0]), std::string::npos)
          << e.what();
    }
    EXPECT_FALSE(opt.failed());
    EXPECT_EQ(opt.step_count(), 1u);
  }
}

// Sub-groups fitted to the swap store's 1 MiB stripe units: a record that would end part-way
// into a unit is cut to fill whole units (int8's 1M elements: 6.125 MiB -> 1,027,136 elements
// in exactly 6 MiB; state_store_test checks the optimizer's records on both stores alike);
// records already whole (fp32, bf16 at 1M) or of one unit or less stay; store_copy_out and
// fit_sub_groups_to_stripes = false keep the size given.
TEST(CompactOptimizerLayout, SubGroupsFillWholeStripeUnits) {
  auto effective = [](StatePrecision p, std::uint64_t n, bool fit = true, bool copy = false) {
    OptimizerOptions o;
    o.state_precision = p;
    o.sub_group_elements = n;
    o.fit_sub_groups_to_stripes = fit;
    o.store_copy_out = copy;
    return effective_sub_group_elements(o, {{"w", 3 * n}});
  };
  constexpr std::uint64_t kM = 1 << 20;
  EXPECT_EQ(effective(StatePrecision::kInt8, kM), 1027136u);
  EXPECT_EQ(4 * 1027136 + adam::moment_bytes(StatePrecision::kInt8, 1027136), 6 * kM - 248);
  EXPECT_EQ(effective(StatePrecision::kF32, kM), kM);
  EXPECT_EQ(effective(StatePrecision::kBF16, kM), kM);
  EXPECT_EQ(effective(StatePrecision::kF32, 300007), 262144u);    // 3.43 MiB -> 3 MiB
  EXPECT_EQ(effective(StatePrecision::kInt8, 2 * kM), 2054336u);  // 12.25 MiB -> 12 MiB
  EXPECT_EQ(effective(StatePrecision::kInt8, 4099), 4099u);       // one unit or less: as given
  EXPECT_EQ(effective(StatePrecision::kInt8, 171196), 171196u);   // exactly 1 MiB: as given
  EXPECT_EQ(effective(StatePrecision::kInt8, kM, false), kM);
  EXPECT_EQ(effective(StatePrecision::kInt8, kM, true, true), kM);
  // A sub-group that splits no group changes no record: kept as given.
  OptimizerOptions whole;
  whole.state_precision = StatePrecision::kInt8;
  whole.sub_group_elements = kM;
  EXPECT_EQ(effective_sub_group_elements(whole, {{"a", kM}, {"b", 5}}), kM);

  EXPECT_EQ(default_sub_group_elements(StatePrecision::kF32), kM);
  EXPECT_EQ(default_sub_group_elements(StatePrecision::kBF16), 3 * kM / 2);
}

// The size is part of the checkpoint's layout: one saved with records of the size given
// (fit_sub_groups_to_stripes = false, what builds before the fitting wrote) is refused by the
// default options naming both sizes, and loads with the fitting off.
TEST(CompactOptimizerLayout, ACheckpointOfUnfittedRecordsNeedsTheFittingOff) {
  zinf::test::TestDir dir;
  const std::string ckpt = dir.file("ckpt");
  const std::vector<ParamGroupSpec> groups = {{"w", 1200028 + 5}};  // two records either way
  auto options = [&](bool fit) {
    OptimizerOptions o;
    o.state_precision = StatePrecision::kInt8;
    o.sub_group_elements = 300007 * 4;  // int8 records of 7.1 MiB, cut to 7 MiB when fitted
    o.fit_sub_groups_to_stripes = fit;
    return o;
  };
  test::State saved;
  {
    OffloadedOptimizer a(options(false), groups);
    test::init_all(a);
    test::run_steps(a, 1, 1);
    a.save(ckpt);
    saved = test::read_all(a);
  }
  {
    OffloadedOptimizer fitted(options(true), groups);
    EXPECT_EQ(fitted.sub_group_elements(), 1198336u);
    try {
      fitted.load(ckpt);
      FAIL() << "a checkpoint of 1200028-element records loaded into 1198336-element ones";
    } catch (const UsageError& e) {
      EXPECT_EQ(std::string(e.what()), "OffloadedOptimizer::load: checkpoint " + ckpt + "/" +
                                           latest(ckpt) +
                                           " does not match: sub_group_elements 1200028, here "
                                           "1198336");
    }
  }  // releases the checkpoint directory's lock
  OffloadedOptimizer unfitted(options(false), groups);
  unfitted.load(ckpt);
  EXPECT_EQ(test::diff(test::read_all(unfitted), saved), "");
}

}  // namespace
}  // namespace zinf::optim
