// SPDX-License-Identifier: Apache-2.0
// Helpers shared by the OffloadedOptimizer tests: a small multi-group layout with odd sizes,
// deterministic parameters and gradients per (group, step), a reference run of the same
// kernel on plain in-memory arrays, and bitwise comparison of states.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <cstring>
#include <functional>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "support/test_dir.h"
#include "zinf/adam/cpu_adam.h"
#include "zinf/optim/optimizer.h"
#include "zinf/swap/io_engine.h"

namespace zinf::test {

/// Odd sizes over several groups: sub-groups of 4099 elements cut the first two into 3 and 4
/// pieces (the last ones short) and leave the third a single short one.
inline std::vector<optim::ParamGroupSpec> odd_groups() {
  return {{"embed", 10007}, {"w1", 3 * 4099 + 5}, {"bias", 3}};
}
constexpr std::uint64_t kOddSubGroup = 4099;

inline adam::AdamParams test_hyper() {
  adam::AdamParams hp;
  hp.lr = 1e-2;
  hp.weight_decay = 0.01;
  hp.mode = adam::AdamMode::kAdamW;
  return hp;
}

/// odd_groups() as a trainer declares them: "w1" with a stronger weight decay of its own, the
/// "bias" without decay, "embed" on test_hyper().
inline std::vector<optim::ParamGroupSpec> groups_with_own_hyper() {
  auto groups = odd_groups();
  adam::AdamParams w1 = test_hyper();
  w1.weight_decay = 0.1;
  groups[1].hyper = w1;
  adam::AdamParams bias = test_hyper();
  bias.weight_decay = 0;
  groups[2].hyper = bias;
  return groups;
}

inline std::uint32_t mix(std::uint64_t a) {
  a ^= a >> 33;
  a *= 0xff51afd7ed558ccdull;
  a ^= a >> 33;
  return static_cast<std::uint32_t>(a);
}

/// Initial parameters of a group, in [-1, 1].
inline std::vector<float> initial_params(std::size_t group, std::uint64_t numel) {
  std::vector<float> p(numel);
  for (std::uint64_t i = 0; i < numel; ++i) {
    p[i] = static_cast<float>(mix(group * 1000003 + i) % 20001u) / 10000.0f - 1.0f;
  }
  return p;
}

/// fp32 gradients of a group in a step, around 1e-2.
inline std::vector<float> grads_f32(std::size_t group, std::uint64_t step, std::uint64_t numel) {
  std::vector<float> g(numel);
  for (std::uint64_t i = 0; i < numel; ++i) {
    g[i] = (static_cast<float>(mix(step * 7919 + group * 104729 + i * 31) % 20001u) / 10000.0f -
            1.0f) *
           1e-2f;
  }
  return g;
}

/// The same gradients as bf16 bits (truncated: any bf16 value will do).
inline std::vector<std::uint16_t> grads_bf16(std::size_t group, std::uint64_t step,
                                             std::uint64_t numel) {
  const auto f = grads_f32(group, step, numel);
  std::vector<std::uint16_t> g(numel);
  for (std::uint64_t i = 0; i < numel; ++i) {
    g[i] = static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(f[i]) >> 16);
  }
  return g;
}

/// The state of every group, as plain arrays.
struct State {
  std::vector<std::vector<float>> p, m, v;
};

inline State read_all(optim::OffloadedOptimizer& opt) {
  State s;
  for (std::size_t g = 0; g < opt.group_count(); ++g) {
    const auto n = opt.group(g).numel;
    s.p.emplace_back(n);
    s.m.emplace_back(n);
    s.v.emplace_back(n);
    opt.read_state(g, s.p.back(), s.m.back(), s.v.back());
  }
  return s;
}

/// Returns "" if `a` and `b` are bitwise identical, else where they first differ.
inline std::string diff(const State& a, const State& b) {
  auto cmp = [](const char* what, std::size_t g, const std::vector<float>& x,
                const std::vector<float>& y) -> std::string {
    if (x.size() != y.size())
      return std::string(what) + " size differs in group " + std::to_string(g);
    for (std::size_t i = 0; i < x.size(); ++i) {
      if (std::bit_cast<std::uint32_t>(x[i]) != std::bit_cast<std::uint32_t>(y[i])) {
        return std::string(what) + " differs in group " + std::to_string(g) + " at " +
               std::to_string(i) + ": " + std::to_string(x[i]) + " vs " + std::to_string(y[i]);
      }
    }
    return "";
  };
  if (a.p.size() != b.p.size()) return "group count differs";
  for (std::size_t g = 0; g < a.p.size(); ++g) {
    for (auto r : {cmp("params", g, a.p[g], b.p[g]), cmp("m", g, a.m[g], b.m[g]),
                   cmp("v", g, a.v[g], b.v[g])}) {
      if (!r.empty()) return r;
    }
  }
  return "";
}

/// Gradients of every group for one step, kept alive for the step.
struct StepGrads {
  std::vector<std::vector<float>> f32;
  std::vector<std::vector<std::uint16_t>> bf16;
  std::vector<optim::GroupGrads> views;

  StepGrads(const std::vector<optim::ParamGroupSpec>& groups, std::uint64_t step,
            ElementType dtype) {
    for (std::size_t g = 0; g < groups.size(); ++g) {
      if (dtype == ElementType::kF32) {
        f32.push_back(grads_f32(g, step, groups[g].numel));
      } else {
        bf16.push_back(grads_bf16(g, step, groups[g].numel));
      }
    }
    for (std::size_t g = 0; g < groups.size(); ++g) {
      views.push_back({g, dtype == ElementType::kF32 ? adam::GradView::f32(f32[g])
                                                     : adam::GradView::bf16(bf16[g])});
    }
  }
};

/// The reference: CpuAdam on whole in-memory arrays, `steps` steps from the initial state,
/// group g's step t with hyper_of(g, t) (its `step` replaced by t).
inline State reference_run_with(
    const std::vector<optim::ParamGroupSpec>& groups,
    const std::function<adam::AdamParams(std::size_t group, std::uint64_t step)>& hyper_of,
    std::uint64_t steps, ElementType dtype) {
  adam::CpuAdam adam;
  State s;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    s.p.push_back(initial_params(g, groups[g].numel));
    s.m.emplace_back(groups[g].numel, 0.0f);
    s.v.emplace_back(groups[g].numel, 0.0f);
  }
  for (std::uint64_t t = 1; t <= steps; ++t) {
    StepGrads sg(groups, t, dtype);
    for (std::size_t g = 0; g < groups.size(); ++g) {
      adam::AdamParams hp = hyper_of(g, t);
      hp.step = t;
      adam.step(hp, s.p[g], s.m[g], s.v[g], sg.views[g].grads);
    }
  }
  return s;
}

/// The reference with fixed hyper-parameters: each group's own (ParamGroupSpec::hyper) where it
/// has them, else `hyper`.
inline State reference_run(const std::vector<optim::ParamGroupSpec>& groups,
                           const adam::AdamParams& hyper, std::uint64_t steps, ElementType dtype) {
  return reference_run_with(
      groups, [&](std::size_t g, std::uint64_t) { return groups[g].hyper.value_or(hyper); }, steps,
      dtype);
}

/// Field-by-field equality of two sets of hyper-parameters but `step` (exact: a set must come
/// back bit for bit).
inline bool same_hyper(const adam::AdamParams& a, const adam::AdamParams& b) {
  return a.lr == b.lr && a.beta1 == b.beta1 && a.beta2 == b.beta2 && a.eps == b.eps &&
         a.weight_decay == b.weight_decay && a.grad_scale == b.grad_scale &&
         a.bias_correction == b.bias_correction && a.mode == b.mode;
}

/// Sets every group's initial parameters.
inline void init_all(optim::OffloadedOptimizer& opt) {
  for (std::size_t g = 0; g < opt.group_count(); ++g) {
    opt.set_params(g, initial_params(g, opt.group(g).numel));
  }
}

/// The checkpoint tests' optimizer: odd_groups()' sub-group size, the threads engine, and on
/// the nvme tier one directory `nvme` under `dir`.
inline optim::OptimizerOptions checkpoint_options(optim::StateTier tier, const TestDir& dir,
                                                  const std::string& nvme = "nvme") {
  optim::OptimizerOptions o;
  o.tier = tier;
  o.sub_group_elements = kOddSubGroup;
  o.hyper = test_hyper();
  o.io.kind = swap::IoEngineKind::kThreads;
  o.io.queue_depth = 8;
  if (tier == optim::StateTier::kNvme) o.directories = {dir.subdir(nvme)};
  return o;
}

/// The names in directory `dir`, sorted.
inline std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    out.push_back(e.path().filename().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

/// The version a checkpoint directory's LATEST names.
inline std::string latest_version(const std::string& ckpt) {
  std::ifstream in(ckpt + "/LATEST");
  std::string name;
  std::getline(in, name);
  return name;
}

/// A whole file's bytes ("" if it cannot be read).
inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

/// The current version's files of checkpoint `got` must be byte for byte those of `want`'s.
inline void expect_same_checkpoint(const std::string& got, const std::string& want) {
  for (const char* f : {"state.bin", "manifest"}) {
    const std::string a = read_file(got + "/" + latest_version(got) + "/" + f);
    const std::string b = read_file(want + "/" + latest_version(want) + "/" + f);
    ASSERT_FALSE(b.empty()) << f;
    EXPECT_EQ(a.size(), b.size()) << f;
    EXPECT_TRUE(a == b) << f << " differs";
  }
}

/// The kill tests' start: steps 1-2 checkpointed in `ckpt`, then step 3. Returns the state of
/// step 2 (saved) and of step 3 (next); the optimizer is gone when this returns, and its lock
/// on `ckpt` with it.
struct SavedAndNext {
  State saved, next;
};
SavedAndNext checkpoint_then_step(const optim::OptimizerOptions& o,
                                  const std::vector<optim::ParamGroupSpec>& groups,
                                  const std::string& ckpt);

/// Forks; the child runs `body` and exits 0 (3 if it throws), unless `body` kills it first.
/// Returns the child's wait status. Fork only where this process runs no optimizer (no
/// threads of zinf's): the child builds its own.
inline int wait_status_of_child(const std::function<void()>& body) {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    try {
      body();
    } catch (...) {
      ::_exit(3);
    }
    ::_exit(0);
  }
  int status = 0;
  if (pid < 0 || ::waitpid(pid, &status, 0) != pid) ADD_FAILURE() << "fork or waitpid failed";
  return status;
}

/// Runs steps [from, to] with the deterministic gradients.
inline void run_steps(optim::OffloadedOptimizer& opt, std::uint64_t from, std::uint64_t to,
                      ElementType dtype = ElementType::kF32) {
  std::vector<optim::ParamGroupSpec> groups;
  for (std::size_t g = 0; g < opt.group_count(); ++g) groups.push_back(opt.group(g));
  for (std::uint64_t t = from; t <= to; ++t) {
    StepGrads sg(groups, t, dtype);
    const auto stats = opt.step(sg.views);
    ASSERT_EQ(stats.step, t);
  }
}

inline SavedAndNext checkpoint_then_step(const optim::OptimizerOptions& o,
                                         const std::vector<optim::ParamGroupSpec>& groups,
                                         const std::string& ckpt) {
  SavedAndNext out;
  optim::OffloadedOptimizer a(o, groups);
  init_all(a);
  run_steps(a, 1, 2);
  a.save(ckpt);
  out.saved = read_all(a);
  run_steps(a, 3, 3);
  out.next = read_all(a);
  return out;
}

}  // namespace zinf::test

// Names the parameters in gtest output and ctest test names.
namespace zinf::swap {
inline void PrintTo(IoEngineKind kind, std::ostream* os) { *os << io_engine_kind_name(kind); }
}  // namespace zinf::swap
namespace zinf::optim {
inline void PrintTo(StateTier tier, std::ostream* os) { *os << state_tier_name(tier); }
}  // namespace zinf::optim
namespace zinf {
inline void PrintTo(ElementType dtype, std::ostream* os) { *os << element_type_name(dtype); }
}  // namespace zinf
