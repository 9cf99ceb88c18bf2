// SPDX-License-Identifier: Apache-2.0
// The arithmetic behind `zinf plan`: per-GPU model-state memory for ZeRO stages 0-3 (the ZeRO
// paper's accounting), what offloading the optimizer state and parameters to cpu or nvme moves
// where, activation memory (Korthikanti et al. 2022), and the least costly setup that fits.
// Pure functions of their inputs, so the numbers are tested against hand-computed cases.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace zinf::tools {

/// Parses a parameter count: "13e9", "13B", "1.3M", "7.5b", "350K", "1T", "175000000"
/// (K, M, B/G, T are powers of 1000). Throws UsageError naming `what` otherwise.
double parse_param_count(std::string_view text, std::string_view what);

/// Where a kind of model state lives.
enum class Tier : std::uint8_t { kGpu, kCpu, kNvme };
/// "none" (stays on the GPU) | "cpu" | "nvme".
std::string_view tier_name(Tier tier) noexcept;
/// Parses none | cpu | nvme; UsageError naming `what` otherwise.
Tier parse_tier(std::string_view text, std::string_view what);

/// Bytes per parameter of each model state. The ZeRO paper's mixed-precision Adam: fp16
/// parameters (2), fp16 gradients (2), K = 12 of optimizer state (fp32 master copy, momentum,
/// variance). Plain fp32 training is 4,4,8.
struct BytesPerParam {
  double params = 2;
  double grads = 2;
  double optimizer = 12;
};
/// Parses "P,G,O" (three non-negative numbers); UsageError otherwise.
BytesPerParam parse_bytes_per_param(std::string_view text);

/// A transformer's shape for the activation estimate.
struct ActivationShape {
  std::uint64_t seq_len = 0;      ///< s
  std::uint64_t hidden = 0;       ///< h
  std::uint64_t layers = 0;       ///< L
  std::uint64_t micro_batch = 0;  ///< b
  std::uint64_t heads = 0;        ///< a
  bool checkpointing = false;     ///< full activation checkpointing (recompute every layer)
};

/// Activation bytes per GPU of the first pipeline stage (Korthikanti et al. 2022, "Reducing
/// Activation Recomputation in Large Transformer Models", eq. 2 and sec. 4.2): per layer
/// s*b*h*(10 + 24/t + 5*a*s/(h*t)) bytes with tensor parallelism t and no sequence
/// parallelism (t = 1: sbh(34 + 5as/h)); with 1F1B pipelining the first stage holds L layers'
/// worth whatever the pipeline degree. With full checkpointing: 2*s*b*h per layer (each
/// layer's fp16 input) times L, plus one layer's full activations while it is recomputed.
double activation_bytes(const ActivationShape& shape, std::uint32_t tp);

/// Drive bandwidth of one node, from `zinf tune`'s report (GB/s = 1e9 bytes/s).
struct DriveBandwidth {
  double read_gbps = 0;   ///< sequential reads (parameter fetches)
  double write_gbps = 0;  ///< sequential writes (parameter write-back)
  double mixed_gbps = 0;  ///< bytes moved per second by the optimizer step's read+write mix
  /// The steady write rate under sustained writes (`zinf tune --sustained`); 0: not measured.
  /// A step's writes take at least their bytes at this rate, whatever the short passes gave.
  double sustained_write_gbps = 0;
};

/// Everything `zinf plan` is asked about.
struct PlanInput {
  double params = 0;  ///< Ψ, the whole model
  BytesPerParam bytes;
  std::uint32_t gpus = 1;
  std::uint32_t tp = 1;
  std::uint32_t pp = 1;
  std::uint32_t gpus_per_node = 8;  ///< capped at gpus
  std::optional<ActivationShape> activations;
  /// zinf's defaults (EngineConfig): optimizer sub-group elements, and the optimizer
  /// pipeline's ring of that many sub-group buffers in pinned memory.
  std::uint64_t sub_group_size = 1'000'000'000;
  std::uint32_t optimizer_buffers = 4;
  /// Parameter staging for nvme parameter offload: buffers x elements (offload_param).
  std::uint32_t param_buffers = 5;
  std::uint64_t param_buffer_size = 100'000'000;
  /// Stage 3 gathers whole layers on the GPU: at most this many parameters live at once
  /// (DeepSpeed's stage3_max_live_parameters default).
  std::uint64_t live_params = 1'000'000'000;
  /// Hardware; an absent limit is not checked. Bytes.
  std::optional<double> gpu_mem;
  std::optional<double> cpu_mem;    ///< per node
  std::optional<double> nvme_free;  ///< per node
  std::optional<DriveBandwidth> drive;
  /// Host memory per node the pinned buffers must leave to everything else: the OS and its
  /// page cache, the training process, its data loader. Pinned pages cannot be reclaimed, so
  /// a setup fits only when pinned + this is within cpu_mem. Bytes; 0: not counted.
  double host_reserve = 0;
  /// Pinned host <-> device copy rates of one GPU's link (`zinf bench h2d`), GB/s; 0: unknown.
  /// d2h 0 with h2d known: the link is taken as symmetric.
  double h2d_gbps = 0;
  double d2h_gbps = 0;
};

/// One way to run: ZeRO stage and where the optimizer state and parameters live.
struct PlanSetup {
  int stage = 0;
  Tier optimizer = Tier::kGpu;
  Tier params = Tier::kGpu;
  friend bool operator==(const PlanSetup&, const PlanSetup&) = default;
};
/// e.g. "zero-3 optimizer=nvme params=cpu".
std::string setup_name(const PlanSetup& setup);

/// What one PlanSetup needs. Bytes, per GPU unless named per node.
struct PlanRow {
  PlanSetup setup;
  double gpu_params = 0;  ///< model states left on the GPU, by kind
  double gpu_grads = 0;
  double gpu_optimizer = 0;
  double gpu_model_states = 0;  ///< the sum of the three (the ZeRO paper's figure)
  double gpu_live_params = 0;   ///< stage 3: gathered parameters in use (live_params x P)
  double gpu_activations = 0;
  double gpu_total = 0;
  double host_per_node = 0;  ///< all pinned: offloaded states, gradients, staging
  double nvme_per_node = 0;
  double nvme_read_per_step = 0;     ///< per node
  double nvme_write_per_step = 0;    ///< per node
  std::optional<double> io_seconds;  ///< per step, if the drive bandwidth is known
  /// PCIe traffic per GPU per step: parameters fetched to the GPU (forward and backward) or
  /// updated parameters copied back after a host-side step (h2d); gradients out (d2h).
  double h2d_per_step = 0;
  double d2h_per_step = 0;
  /// Seconds per step the link needs for that traffic, if its rate is known: the larger of
  /// the two directions (a PCIe link carries both at once).
  std::optional<double> pcie_seconds;
  /// Data-parallel collectives per GPU per step, bytes each GPU receives (a ring's, (DP - 1)
  /// / DP of the buffer): the gradients' all-reduce (stages 0-1) or reduce-scatter (2-3), and
  /// the parameter all-gathers: once after the step at stages 1-2 (the updated slices), in
  /// forward and again in backward at stage 3 (zinf's ShardedEngine fetch). 0 with DP 1.
  double grad_reduce_per_step = 0;
  double allgather_per_step = 0;
  /// What a node's GPUs receive together (gpus per node x the two above): the upper bound of
  /// its network traffic, when no two ranks of a DP group share the node.
  double collectives_per_node = 0;
  bool fits = true;
  std::string why_not;  ///< "" if it fits; else the first limit it breaks
};

struct Plan {
  std::uint32_t dp = 1;
  std::uint32_t gpus_per_node = 1;
  std::uint32_t nodes = 1;
  double params_per_model_slice = 0;  ///< Ψ / (TP x PP)
  std::vector<PlanRow> rows;          ///< in cost order (candidate_setups)
  /// Index into rows of the least costly setup that fits; set only with --gpu-mem given.
  std::optional<std::size_t> recommended;
};

/// Every setup considered, least costly first: no offload (stages 0, 1, 2, 3), optimizer->cpu
/// (stages 2, 3), optimizer->nvme (3), optimizer->cpu + params->cpu (3), optimizer->nvme +
/// params->cpu (3), optimizer->nvme + params->nvme (3). Within a level the stages go in
/// order: a lower stage partitions less (with P = G: stages 0 and 2 move 2Ψ per step, stage 1
/// 3Ψ, its all-reduce and the parameters' all-gather, stage 3 3Ψ).
std::vector<PlanSetup> candidate_setups();

/// Computes the needs of one setup for `dp` data-parallel ranks.
PlanRow evaluate_setup(const PlanInput& input, const PlanSetup& setup, std::uint32_t dp);

/// The stages a placement can run with: parameter offload and optimizer->nvme need stage 3
/// (ZeRO-Infinity), optimizer->cpu stage 2 or 3 (ZeRO-Offload), no offload any stage.
std::vector<int> valid_stages(Tier optimizer, Tier params);

/// Computes every candidate setup and the recommendation, or, when `optimizer` or `params` is
/// given, only that placement at its valid stages (the other tier defaults to the GPU).
/// Throws UsageError, one line, when the GPUs do not divide into TP x PP ("--gpus 12 is not
/// divisible by --tp 8 x --pp 1 = 8: ...") or an input is zero.
Plan make_plan(const PlanInput& input, std::optional<Tier> optimizer = {},
               std::optional<Tier> params = {});

/// The largest model one placement of the optimizer state and parameters runs, on the
/// hardware of `input` (its `params` is ignored).
struct LargestModel {
  Tier optimizer = Tier::kGpu;
  Tier params = Tier::kGpu;
  /// Parameters of the largest model that fits (within 1 part in 10^6), 0 when not even 10^6
  /// do; `row` is its best stage's needs at that size.
  double max_params = 0;
  PlanRow row;
  /// The limit one size larger breaks (the best stage's why_not), e.g. "host needs ...".
  std::string limit;
};

/// For each placement of candidate_setups() order (none/none, cpu/none, nvme/none, cpu/cpu,
/// nvme/cpu, nvme/nvme), the largest model that fits gpu_mem, cpu_mem (with host_reserve) and
/// nvme_free at any of its valid stages. Every need grows with the parameter count, so a
/// bisection on it finds the edge. Throws UsageError as make_plan does, and when gpu_mem is
/// not given (no limit: nothing to find).
std::vector<LargestModel> largest_models(const PlanInput& input);

/// How deep the parameter prefetcher must read ahead so that fetching a layer hides behind the
/// compute of the layers before it.
struct PrefetchAdvice {
  double layer_bytes = 0;
  double nvme_seconds = 0;  ///< one layer from the drive (0: parameters on the host)
  double h2d_seconds = 0;   ///< one layer over the link
  /// The time from asking for a layer to having it on the GPU (drive, then link), and the time
  /// per layer of the slowest of the two when they pipeline.
  double latency_seconds = 0;
  double throughput_seconds = 0;
  double compute_seconds = 0;  ///< per layer; 0: not given
  /// Layers of read-ahead: ceil(latency / compute), at least 1; unset when no depth hides the
  /// fetches (the slowest stage takes longer than a layer's compute) or compute is unknown.
  std::optional<std::uint32_t> depth;
  /// With no depth enough: how long each layer waits, throughput - compute.
  double stall_seconds = 0;
};

/// Advice for layers of `layer_bytes` fetched from NVMe at `nvme_read_gbps` (0: from pinned
/// host memory) and copied to the GPU at `h2d_gbps` (> 0), each hidden behind
/// `compute_seconds` of compute (0: unknown).
PrefetchAdvice prefetch_advice(double layer_bytes, double nvme_read_gbps, double h2d_gbps,
                               double compute_seconds);

}  // namespace zinf::tools
