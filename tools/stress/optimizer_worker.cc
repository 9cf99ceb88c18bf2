// SPDX-License-Identifier: Apache-2.0
#include "optimizer_worker.h"

#include <algorithm>
#include <cstring>
#include <random>
#include <span>
#include <vector>

#include "zinf/adam/cpu_adam.h"
#include "zinf/common/error.h"
#include "zinf/cuda/device.h"
#include "zinf/optim/optimizer.h"

namespace zinf::tools::stress {

// Steps an OffloadedOptimizer (state on NVMe) and a plain in-memory CpuAdam side by side and
// compares the whole state bitwise after every step. The gradients make a round trip through
// the run's device first (as a trainer's come off the GPU), checked byte for byte. A step that
// fails under faults must have left the state unchanged (a read failed before any write-back)
// or failed the optimizer (then it is rebuilt and the reference re-seeded).
class OptimizerWorker::Impl {
 public:
  static constexpr std::uint64_t kSubGroup = 16384;  // 192 KiB records: several engine pieces
  static constexpr std::uint32_t kDepth = 3;
  static constexpr std::uint64_t kMaxNumel[2] = {60000, 40000};  // the groups' sizes are below

  explicit Impl(const Shared& sh)
      : sh_(sh),
        rng_(sh.cfg->seed * 104729 + 1),
        plan_(make_plan(sh.cfg->fault_rate, sh.cfg->seed * 104729 + 1)) {
    // Two groups of odd sizes: several sub-groups each, and a short last one.
    specs_.push_back({"g0", 40000 + 2 * (rng_() % 10000) + 1});
    specs_.push_back({"g1", 20000 + 2 * (rng_() % 10000) + 1});
    static_assert(kMaxNumel[0] >= 40000 + 2 * 9999 + 1 && kMaxNumel[1] >= 20000 + 2 * 9999 + 1);
    opts_.tier = optim::StateTier::kNvme;
    opts_.sub_group_elements = kSubGroup;
    opts_.pipeline_depth = kDepth;
    opts_.pinned_budget_bytes = sh.opt_budget;
    opts_.hyper.lr = 1e-3;
    opts_.hyper.weight_decay = 0.01;
    opts_.hyper.mode = adam::AdamMode::kAdamW;
    opts_.adam.threads = 1;
    opts_.directories = sh.store_dirs;
    opts_.io = io_options(*sh.cfg, plan_);
    opts_.swap_checksums = sh.cfg->checksums;
    ref_adam_ = std::make_unique<adam::CpuAdam>(opts_.adam);
    for (const auto& s : specs_) {
      p_.emplace_back(s.numel);
      m_.emplace_back(s.numel);
      v_.emplace_back(s.numel);
      g_.emplace_back(s.numel);
    }
    const std::size_t most = std::max(specs_[0].numel, specs_[1].numel);
    sp_.resize(most);
    sm_.resize(most);
    sv_.resize(most);
    stream_ = sh.device->create_stream();
    for (const auto& s : specs_) dev_grads_.push_back(sh.device->allocate(s.numel * sizeof(float)));
  }

  /// Device memory this worker holds: its gradients.
  static std::uint64_t device_bytes_needed() {
    return (kMaxNumel[0] + kMaxNumel[1]) * sizeof(float) + 2 * 256;  // 256: allocation alignment
  }

  void run() {
    rebuild();
    while (sh_.running()) step();
    tally_.injected = counts_of(plan_.get());
  }

  Tally& tally() { return tally_; }
  std::uint64_t pinned_peak() const { return pinned_peak_; }

 private:
  float random_float(float lo, float hi) {
    return std::uniform_real_distribution<float>(lo, hi)(rng_);
  }

  void note_peak() {
    if (opt_) pinned_peak_ = std::max(pinned_peak_, opt_->pinned_bytes_peak());
  }

  // A fresh optimizer and reference, with new random parameters. Retries while set_params
  // fails under faults (each failure judged like any operation).
  void rebuild() {
    for (int attempt = 0; attempt < 1000 && Clock::now() < sh_.deadline + std::chrono::seconds(5);
         ++attempt) {
      if (interrupted()) return;  // run() stops too; no report follows
      note_peak();
      opt_.reset();
      opt_ = std::make_unique<optim::OffloadedOptimizer>(opts_, specs_);
      ref_steps_ = 0;
      bool ok = true;
      for (std::size_t g = 0; g < specs_.size() && ok; ++g) {
        for (auto& x : p_[g]) x = random_float(-1, 1);
        std::fill(m_[g].begin(), m_[g].end(), 0.0f);
        std::fill(v_[g].begin(), v_[g].end(), 0.0f);
        for (int tries = 0;; ++tries) {
          const FaultCounts before = counts_of(plan_.get());
          OpError err;
          try {
            opt_->set_params(g, p_[g]);
          } catch (const IoError& e) {
            err = error_of(e);
          } catch (const EngineFailed& e) {
            err = error_of(e);
          }
          ++tally_.opt_state_reads;  // counted with the state transfers
          judge_operation(tally_, "optimizer set_params " + specs_[g].name,
                          counts_of(plan_.get()) - before, err);
          if (!err.failed) break;
          if (opt_->failed() || tries >= 100) {
            ok = false;
            break;
          }
        }
      }
      if (ok) return;
      ++tally_.opt_rebuilds;
    }
    throw Error("optimizer worker: could not rebuild the optimizer in 1000 attempts");
  }

  // The gradients to the device and back into g_, compared with what went: false (a problem
  // recorded) if any byte came back different.
  bool device_round_trip() {
    std::vector<float>& back = sp_;  // scratch, refilled by check_state later
    for (std::size_t g = 0; g < specs_.size(); ++g) {
      const auto bytes = std::as_bytes(std::span<const float>(g_[g]));
      const std::span<std::byte> out = std::as_writable_bytes(std::span(back).first(g_[g].size()));
      sh_.device->copy_to_device(stream_.ref(), dev_grads_[g].span(0, bytes.size()), bytes);
      sh_.device->copy_to_host(stream_.ref(), out, dev_grads_[g].span(0, bytes.size()));
      sh_.device->synchronize(stream_.ref());
      if (std::memcmp(out.data(), bytes.data(), bytes.size()) != 0) {
        std::size_t i = 0;
        while (std::memcmp(&back[i], &g_[g][i], sizeof(float)) == 0) ++i;
        ++tally_.mismatches;
        tally_.problem("optimizer: gradients of " + specs_[g].name + " came back from " +
                       std::string(sh_.device->name()) + " different at element " +
                       std::to_string(i));
        return false;
      }
      tally_.bytes_verified += bytes.size();
      sh_.verified(bytes.size());
    }
    return true;
  }

  void step() {
    std::vector<optim::GroupGrads> grads;
    for (std::size_t g = 0; g < specs_.size(); ++g) {
      for (auto& x : g_[g]) x = random_float(-0.05f, 0.05f);
      grads.push_back({g, adam::GradView::f32(g_[g])});
    }
    if (!device_round_trip()) return;
    const FaultCounts before = counts_of(plan_.get());
    OpError err;
    try {
      (void)opt_->step(grads);
    } catch (const IoError& e) {
      err = error_of(e);
    } catch (const EngineFailed& e) {
      err = error_of(e);
    }
    ++tally_.opt_steps;
    judge_operation(tally_, "optimizer step " + std::to_string(ref_steps_ + 1),
                    counts_of(plan_.get()) - before, err);
    if (!err.failed) {
      adam::AdamParams hp = opts_.hyper;
      hp.step = ++ref_steps_;
      for (std::size_t g = 0; g < specs_.size(); ++g) {
        ref_adam_->step(hp, p_[g], m_[g], v_[g], adam::GradView::f32(g_[g]));
      }
    } else if (opt_->failed()) {
      ++tally_.opt_rebuilds;  // a failed write-back: the optimizer refuses work from now on
      rebuild();
      return;
    } else {
      ++tally_.opt_undone;  // a failed read before any write-back: the state must be as before
    }
    if (opt_->step_count() != ref_steps_) {
      ++tally_.mismatches;
      tally_.problem("optimizer: step_count " + std::to_string(opt_->step_count()) + " after " +
                     std::to_string(ref_steps_) + " successful steps");
    }
    check_state();
  }

  // Reads every group's params, m and v back and compares them bitwise with the reference.
  void check_state() {
    for (std::size_t g = 0; g < specs_.size(); ++g) {
      const std::size_t n = specs_[g].numel;
      std::span<float> got[3] = {std::span(sp_).first(n), std::span(sm_).first(n),
                                 std::span(sv_).first(n)};
      OpError err;
      const FaultCounts before = counts_of(plan_.get());
      try {
        opt_->read_state(g, got[0], got[1], got[2]);
      } catch (const IoError& e) {
        err = error_of(e);
      } catch (const EngineFailed& e) {
        err = error_of(e);
      }
      ++tally_.opt_state_reads;
      judge_operation(tally_, "optimizer read_state " + specs_[g].name,
                      counts_of(plan_.get()) - before, err);
      if (err.failed) {
        if (opt_->failed()) {
          ++tally_.opt_rebuilds;
          rebuild();
        }
        return;  // checked again after the next step
      }
      const std::vector<float>* want[3] = {&p_[g], &m_[g], &v_[g]};
      const char* names[3] = {"params", "m", "v"};
      for (int w = 0; w < 3; ++w) {
        if (std::memcmp(got[w].data(), want[w]->data(), n * sizeof(float)) == 0) continue;
        std::size_t i = 0;
        while (std::memcmp(&got[w][i], &(*want[w])[i], sizeof(float)) == 0) ++i;
        ++tally_.mismatches;
        tally_.problem("optimizer: " + specs_[g].name + " " + names[w] + "[" + std::to_string(i) +
                       "] = " + std::to_string(got[w][i]) + " after step " +
                       std::to_string(ref_steps_) + ", reference " + std::to_string((*want[w])[i]));
        ++tally_.opt_rebuilds;
        rebuild();  // start over from a known state rather than report the same drift again
        return;
      }
      tally_.bytes_verified += 3 * n * sizeof(float);
      sh_.verified(3 * n * sizeof(float));
    }
  }

  const Shared& sh_;
  std::mt19937_64 rng_;
  std::shared_ptr<swap::FaultPlan> plan_;
  std::vector<optim::ParamGroupSpec> specs_;
  optim::OptimizerOptions opts_;
  std::unique_ptr<adam::CpuAdam> ref_adam_;
  std::vector<std::vector<float>> p_, m_, v_, g_;
  std::vector<float> sp_, sm_, sv_;  // read-back scratch, the largest group's size
  std::uint64_t ref_steps_ = 0;
  std::unique_ptr<optim::OffloadedOptimizer> opt_;
  cuda::Stream stream_;
  std::vector<cuda::DeviceBuffer> dev_grads_;
  std::uint64_t pinned_peak_ = 0;
  Tally tally_;
};

OptimizerWorker::OptimizerWorker(const Shared& sh) : impl_(std::make_unique<Impl>(sh)) {}
OptimizerWorker::~OptimizerWorker() = default;
void OptimizerWorker::run() { return impl_->run(); }
Tally& OptimizerWorker::tally() { return impl_->tally(); }
std::uint64_t OptimizerWorker::pinned_peak() const { return impl_->pinned_peak(); }
std::uint64_t OptimizerWorker::device_bytes() { return Impl::device_bytes_needed(); }

}  // namespace zinf::tools::stress
