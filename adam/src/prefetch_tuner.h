// SPDX-License-Identifier: Apache-2.0
// The software prefetch distance of the x86 vector paths, chosen at run time on the host that
// runs them instead of fitted once to the machine they were written on.
//
// Why: on one thread a core's outstanding misses limit bandwidth, and prefetching into L1
// 256 elements ahead beat none by 3-12% on a Zen 4 host (AVX-512, 100M elements) while 1024
// was slower there; another core, cache or memory system may want another distance or none.
// So the first large steps of a process calibrate: their chunks take the candidate distances
// in turn, each chunk is timed, and after kSamples chunks per candidate the distance with the
// lowest median time per element is kept for the rest of the process. The calibration is the
// steps' own work on their own arrays (no extra memory, no extra pass; a prefetch changes the
// speed, never a bit), and candidates alternate chunk by chunk, so a drift in the machine's
// load touches each of them alike and the median drops the chunks a preemption hit.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

namespace zinf::adam::detail {

inline constexpr std::array<std::uint32_t, 5> kPrefetchCandidates = {0, 128, 256, 512, 1024};
// Used before a process has calibrated (and by steps too small to calibrate on): the best
// distance where it was first measured.
inline constexpr std::uint32_t kDefaultPrefetchElems = 256;

class PrefetchTuner {
 public:
  // Timed chunks per candidate before the choice: 16 x 5 chunks of 64 Ki elements, about
  // 3 ms of a 1-thread step at the memory limit.
  static constexpr std::size_t kSamples = 16;
  // Steps smaller than this (4 MiB per fp32 array) may sit in the caches, where a prefetch
  // distance cannot be told apart; they use the current choice and are not timed.
  static constexpr std::size_t kMinStepElements = std::size_t{1} << 20;

  // The distance for steps that do not calibrate: the chosen one, or the default before.
  std::uint32_t current() const noexcept { return current_.load(std::memory_order_relaxed); }
  // True once a distance has been chosen by calibration.
  bool calibrated() const noexcept { return calibrated_.load(std::memory_order_acquire); }
  // True if a step of n elements should take part in the calibration.
  bool wants(std::size_t n) const noexcept { return !calibrated() && n >= kMinStepElements; }
  // The candidate index for the next timed chunk (round robin over the candidates).
  std::size_t next_candidate() noexcept {
    return turn_.fetch_add(1, std::memory_order_relaxed) % kPrefetchCandidates.size();
  }
  // Records a chunk's time per element for candidate `index`; the record that completes the
  // samples makes the choice (logged at info level with every candidate's median). Thread-safe.
  void record(std::size_t index, double ns_per_element);
  // Each candidate's median of its samples so far (NaN where it has none).
  std::array<double, kPrefetchCandidates.size()> medians() const;

 private:
  std::array<double, kPrefetchCandidates.size()> medians_locked() const;  // mu_ held

  std::atomic<std::uint32_t> current_{kDefaultPrefetchElems};
  std::atomic<bool> calibrated_{false};
  std::atomic<std::size_t> turn_{0};
  mutable std::mutex mu_;
  std::array<std::vector<double>, kPrefetchCandidates.size()> samples_;
};

// The process's tuner for one code path (indexed by the Isa enumerator's value): each vector
// width gets its own choice.
PrefetchTuner& prefetch_tuner(std::size_t isa_index);

// The largest distance an option or ZINF_CPU_ADAM_PREFETCH may ask for (its arrays' 256 KiB).
inline constexpr std::uint32_t kMaxPrefetchElems = 65536;

}  // namespace zinf::adam::detail
