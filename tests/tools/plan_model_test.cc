// SPDX-License-Identifier: Apache-2.0
// `zinf plan`'s arithmetic against hand-computed cases: the ZeRO paper's figure 1, TP/PP
// splits, offload placement, activations (Korthikanti et al. 2022), and the recommendation.
#include "plan_model.h"

#include <gtest/gtest.h>

#include "zinf/common/error.h"

namespace zinf::tools {
namespace {

const PlanRow& row(const Plan& p, int stage, Tier opt = Tier::kGpu, Tier par = Tier::kGpu) {
  for (const auto& r : p.rows) {
    if (r.setup == PlanSetup{stage, opt, par}) return r;
  }
  ADD_FAILURE() << "no row for stage " << stage;
  return p.rows.front();
}

TEST(PlanModel, ParsesParameterCounts) {
  EXPECT_DOUBLE_EQ(parse_param_count("13e9", "--params"), 13e9);
  EXPECT_DOUBLE_EQ(parse_param_count("13B", "--params"), 13e9);
  EXPECT_DOUBLE_EQ(parse_param_count("7.5b", "--params"), 7.5e9);
  EXPECT_DOUBLE_EQ(parse_param_count("1.3M", "--params"), 1.3e6);
  EXPECT_DOUBLE_EQ(parse_param_count("350K", "--params"), 350e3);
  EXPECT_DOUBLE_EQ(parse_param_count("1T", "--params"), 1e12);
  EXPECT_DOUBLE_EQ(parse_param_count("175000000", "--params"), 175e6);
  try {
    parse_param_count("13Q", "--params");
    FAIL() << "no error";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(),
                 "invalid --params '13Q': expected a parameter count such as 13e9, "
                 "13B, 1.3M or 350K");
  }
  EXPECT_THROW(parse_param_count("", "--params"), UsageError);
  EXPECT_THROW(parse_param_count("-5B", "--params"), UsageError);
  EXPECT_THROW(parse_param_count("B", "--params"), UsageError);
}

TEST(PlanModel, ParsesBytesPerParam) {
  BytesPerParam b = parse_bytes_per_param("4,4,8");
  EXPECT_EQ(b.params, 4);
  EXPECT_EQ(b.grads, 4);
  EXPECT_EQ(b.optimizer, 8);
  try {
    parse_bytes_per_param("4,4");
    FAIL() << "no error";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(),
                 "invalid --bytes-per-param '4,4': expected P,G,O bytes per parameter, "
                 "e.g. 2,2,12 or 4,4,8");
  }
  EXPECT_THROW(parse_bytes_per_param("4,4,8,1"), UsageError);
  EXPECT_THROW(parse_bytes_per_param("a,4,8"), UsageError);
}

// ZeRO paper (Rajbhandari et al. 2020), figure 1: 7.5B parameters, Nd = 64, K = 12:
// 120 GB, 31.4 GB, 16.6 GB and 1.9 GB per GPU for baseline, Pos, Pos+g, Pos+g+p.
TEST(PlanModel, MatchesZeroPaperFigure1) {
  PlanInput in;
  in.params = 7.5e9;
  in.gpus = 64;
  Plan p = make_plan(in);
  EXPECT_EQ(p.dp, 64u);
  EXPECT_EQ(p.gpus_per_node, 8u);
  EXPECT_EQ(p.nodes, 8u);
  EXPECT_DOUBLE_EQ(row(p, 0).gpu_model_states, 120e9);
  EXPECT_DOUBLE_EQ(row(p, 1).gpu_model_states, 30e9 + 12 * 7.5e9 / 64);  // 31.406 GB
  EXPECT_DOUBLE_EQ(row(p, 2).gpu_model_states, 15e9 + 14 * 7.5e9 / 64);  // 16.641 GB
  EXPECT_DOUBLE_EQ(row(p, 3).gpu_model_states, 120e9 / 64);              // 1.875 GB
  EXPECT_NEAR(row(p, 1).gpu_model_states / 1e9, 31.4, 0.05);
  EXPECT_NEAR(row(p, 2).gpu_model_states / 1e9, 16.6, 0.05);
  EXPECT_NEAR(row(p, 3).gpu_model_states / 1e9, 1.9, 0.05);
  // Stage 3 also gathers live parameters: min(1e9, Ψ) x 2 bytes.
  EXPECT_DOUBLE_EQ(row(p, 3).gpu_live_params, 2e9);
  EXPECT_DOUBLE_EQ(row(p, 2).gpu_live_params, 0);
  EXPECT_FALSE(p.recommended.has_value());  // no --gpu-mem
}

TEST(PlanModel, SplitsTheModelByTpAndPpFirst) {
  PlanInput in;
  in.params = 16e9;
  in.gpus = 32;
  in.tp = 4;
  in.pp = 2;
  in.bytes = {4, 4, 8};
  Plan p = make_plan(in);
  EXPECT_EQ(p.dp, 4u);
  EXPECT_DOUBLE_EQ(p.params_per_model_slice, 2e9);
  EXPECT_DOUBLE_EQ(row(p, 0).gpu_model_states, 16 * 2e9);
  EXPECT_DOUBLE_EQ(row(p, 1).gpu_model_states, 8 * 2e9 + 8 * 2e9 / 4);
  EXPECT_DOUBLE_EQ(row(p, 2).gpu_model_states, 4 * 2e9 + 12 * 2e9 / 4);
  EXPECT_DOUBLE_EQ(row(p, 3).gpu_model_states, 16 * 2e9 / 4);
}

TEST(PlanModel, RejectsGpusNotDivisibleByTpTimesPp) {
  PlanInput in;
  in.params = 1e9;
  in.gpus = 12;
  in.tp = 8;
  try {
    make_plan(in);
    FAIL() << "no error";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(),
                 "--gpus 12 is not divisible by --tp 8 x --pp 1 = 8: the data-parallel "
                 "degree GPUs / (TP x PP) must be a whole number");
  }
}

// 10B parameters on 8 GPUs of one node, stage 3 (part = 1.25e9 per GPU):
TEST(PlanModel, PlacesOffloadedStateOnHostAndNvme) {
  PlanInput in;
  in.params = 10e9;
  in.gpus = 8;
  const double part = 1.25e9;

  // optimizer -> cpu: the optimizer state and the gradient partition leave the GPU.
  PlanRow cpu = evaluate_setup(in, {3, Tier::kCpu, Tier::kGpu}, 8);
  EXPECT_DOUBLE_EQ(cpu.gpu_params, 2 * part);
  EXPECT_DOUBLE_EQ(cpu.gpu_grads, 0);
  EXPECT_DOUBLE_EQ(cpu.gpu_optimizer, 0);
  EXPECT_DOUBLE_EQ(cpu.host_per_node, 8 * (12 + 2) * part);
  EXPECT_DOUBLE_EQ(cpu.nvme_per_node, 0);
  ASSERT_TRUE(cpu.io_seconds.has_value());
  EXPECT_DOUBLE_EQ(*cpu.io_seconds, 0);

  // optimizer -> nvme: host keeps gradients + 4 sub-group buffers (1e9 elements x 12 B).
  PlanRow nv = evaluate_setup(in, {3, Tier::kNvme, Tier::kGpu}, 8);
  EXPECT_DOUBLE_EQ(nv.host_per_node, 8 * (2 * part + 4 * 1e9 * 12));
  EXPECT_DOUBLE_EQ(nv.nvme_per_node, 8 * 12 * part);
  EXPECT_DOUBLE_EQ(nv.nvme_read_per_step, 8 * 12 * part);
  EXPECT_DOUBLE_EQ(nv.nvme_write_per_step, 8 * 12 * part);
  EXPECT_FALSE(nv.io_seconds.has_value());  // no drive bandwidth given

  // + params -> nvme: 5 x 1e8-element staging buffers; forward+backward read, step writes.
  in.drive = DriveBandwidth{4.0, 2.0, 3.0};
  PlanRow pn = evaluate_setup(in, {3, Tier::kNvme, Tier::kNvme}, 8);
  EXPECT_DOUBLE_EQ(pn.gpu_params, 0);
  EXPECT_DOUBLE_EQ(pn.gpu_model_states, 0);
  EXPECT_DOUBLE_EQ(pn.gpu_live_params, 2e9);
  EXPECT_DOUBLE_EQ(pn.host_per_node, 8 * (2 * part + 4 * 1e9 * 12 + 5 * 1e8 * 2));
  EXPECT_DOUBLE_EQ(pn.nvme_per_node, 8 * 14 * part);
  EXPECT_DOUBLE_EQ(pn.nvme_read_per_step, 8 * (12 + 4) * part);
  EXPECT_DOUBLE_EQ(pn.nvme_write_per_step, 8 * (12 + 2) * part);
  ASSERT_TRUE(pn.io_seconds.has_value());
  EXPECT_DOUBLE_EQ(*pn.io_seconds, 8 * (24 * part / 3e9 + 4 * part / 4e9 + 2 * part / 2e9));

  // params -> cpu: the parameter partition is pinned on the host.
  PlanRow pc = evaluate_setup(in, {3, Tier::kCpu, Tier::kCpu}, 8);
  EXPECT_DOUBLE_EQ(pc.host_per_node, 8 * (14 + 2) * part);
}

// The data-parallel collectives each GPU receives per step (a ring: (DP - 1) / DP of the
// buffer): the gradients' all-reduce up to stage 1, their reduce-scatter from stage 2; the
// parameters' all-gather once after the step at stages 1 and 2, in forward and backward at
// stage 3; a node's GPUs receive them all.
TEST(PlanModel, CollectivesPerStepByStage) {
  PlanInput in;
  in.params = 13e9;
  in.gpus = 16;
  in.gpus_per_node = 8;
  const double ring = 15.0 / 16;
  const PlanRow s0 = evaluate_setup(in, {0, Tier::kGpu, Tier::kGpu}, 16);
  EXPECT_DOUBLE_EQ(s0.grad_reduce_per_step, 2 * 2 * 13e9 * ring);
  EXPECT_DOUBLE_EQ(s0.allgather_per_step, 0);
  const PlanRow s1 = evaluate_setup(in, {1, Tier::kGpu, Tier::kGpu}, 16);
  EXPECT_DOUBLE_EQ(s1.grad_reduce_per_step, 2 * 2 * 13e9 * ring);
  EXPECT_DOUBLE_EQ(s1.allgather_per_step, 2 * 13e9 * ring);
  const PlanRow s2 = evaluate_setup(in, {2, Tier::kCpu, Tier::kGpu}, 16);
  EXPECT_DOUBLE_EQ(s2.grad_reduce_per_step, 2 * 13e9 * ring);
  EXPECT_DOUBLE_EQ(s2.allgather_per_step, 2 * 13e9 * ring);
  const PlanRow s3 = evaluate_setup(in, {3, Tier::kNvme, Tier::kNvme}, 16);
  EXPECT_DOUBLE_EQ(s3.grad_reduce_per_step, 2 * 13e9 * ring);
  EXPECT_DOUBLE_EQ(s3.allgather_per_step, 2 * 2 * 13e9 * ring);
  EXPECT_DOUBLE_EQ(s3.collectives_per_node, 8 * 6 * 13e9 * ring);
  // One rank moves nothing.
  in.gpus = 1;
  const PlanRow alone = evaluate_setup(in, {3, Tier::kNvme, Tier::kNvme}, 1);
  EXPECT_DOUBLE_EQ(alone.grad_reduce_per_step + alone.allgather_per_step, 0);
}

// zinf tune --sustained's steady write rate bounds the I/O time from below: the step's writes
// at that rate, when the short passes promised more.
TEST(PlanModel, SustainedWriteRateBoundsTheIoTime) {
  PlanInput in;
  in.params = 10e9;
  in.gpus = 8;
  const double part = 1.25e9;
  in.drive = DriveBandwidth{4.0, 2.0, 3.0, 0.5};
  PlanRow nv = evaluate_setup(in, {3, Tier::kNvme, Tier::kGpu}, 8);
  ASSERT_TRUE(nv.io_seconds.has_value());
  EXPECT_DOUBLE_EQ(*nv.io_seconds, 8 * 12 * part / 0.5e9);  // 240 s, not 80 s at 3 GB/s mixed
  in.drive->sustained_write_gbps = 100;                     // faster than the passes: they stand
  nv = evaluate_setup(in, {3, Tier::kNvme, Tier::kGpu}, 8);
  EXPECT_DOUBLE_EQ(*nv.io_seconds, 8 * 24 * part / 3e9);
}

TEST(PlanModel, OffloadFilterShowsOnlyValidStages) {
  PlanInput in;
  in.params = 1e9;
  Plan p = make_plan(in, Tier::kCpu, std::nullopt);
  ASSERT_EQ(p.rows.size(), 2u);
  EXPECT_EQ(p.rows[0].setup, (PlanSetup{2, Tier::kCpu, Tier::kGpu}));
  EXPECT_EQ(p.rows[1].setup, (PlanSetup{3, Tier::kCpu, Tier::kGpu}));
  p = make_plan(in, std::nullopt, Tier::kNvme);
  ASSERT_EQ(p.rows.size(), 1u);
  EXPECT_EQ(p.rows[0].setup, (PlanSetup{3, Tier::kGpu, Tier::kNvme}));
}

TEST(PlanModel, CandidatesAreInCostOrder) {
  std::vector<PlanSetup> c = candidate_setups();
  std::vector<PlanSetup> want = {{0, Tier::kGpu, Tier::kGpu},  {1, Tier::kGpu, Tier::kGpu},
                                 {2, Tier::kGpu, Tier::kGpu},  {3, Tier::kGpu, Tier::kGpu},
                                 {2, Tier::kCpu, Tier::kGpu},  {3, Tier::kCpu, Tier::kGpu},
                                 {3, Tier::kNvme, Tier::kGpu}, {3, Tier::kCpu, Tier::kCpu},
                                 {3, Tier::kNvme, Tier::kCpu}, {3, Tier::kNvme, Tier::kNvme}};
  EXPECT_EQ(c, want);
}

// Korthikanti et al. 2022: sbh(34 + 5as/h) per layer without recomputation, 2sbh with.
TEST(PlanModel, ActivationMemory) {
  ActivationShape s{2048, 5120, 40, 1, 40, false};
  const double sbh = 2048.0 * 5120 * 1;
  EXPECT_DOUBLE_EQ(activation_bytes(s, 1), 40 * sbh * (34 + 5.0 * 40 * 2048 / 5120));
  EXPECT_DOUBLE_EQ(activation_bytes(s, 4), 40 * sbh * (10 + 6 + 5.0 * 40 * 2048 / (5120 * 4)));
  s.checkpointing = true;
  EXPECT_DOUBLE_EQ(activation_bytes(s, 1), 40 * 2 * sbh + sbh * (34 + 5.0 * 40 * 2048 / 5120));
}

TEST(PlanModel, RecommendsTheLeastCostlySetupThatFits) {
  PlanInput in;
  in.params = 13e9;
  in.gpus = 8;
  in.gpu_mem = 80e9;
  // Per GPU: stage 0 208 GB, stage 1 26+26+19.5 = 71.5, stage 2 26+22.75 = 48.75,
  // stage 3 26 + 2 live = 28.
  Plan p = make_plan(in);
  ASSERT_TRUE(p.recommended.has_value());
  EXPECT_EQ(p.rows[*p.recommended].setup, (PlanSetup{1, Tier::kGpu, Tier::kGpu}));
  EXPECT_EQ(p.rows[0].why_not, "GPU needs 208.0 GB > --gpu-mem 80.0 GB");

  in.gpu_mem = 60e9;  // stage 1 (71.5) no, stage 2 (48.75) yes
  p = make_plan(in);
  EXPECT_EQ(p.rows[*p.recommended].setup, (PlanSetup{2, Tier::kGpu, Tier::kGpu}));

  in.gpu_mem = 30e9;  // stage 3 (28) yes
  p = make_plan(in);
  EXPECT_EQ(p.rows[*p.recommended].setup, (PlanSetup{3, Tier::kGpu, Tier::kGpu}));

  in.gpu_mem = 10e9;  // stage 3 with optimizer->cpu: 3.25 GB of parameters + 2 live
  p = make_plan(in);
  EXPECT_EQ(p.rows[*p.recommended].setup, (PlanSetup{3, Tier::kCpu, Tier::kGpu}));

  // 13B on one 24 GB GPU: stage 0 with optimizer->cpu is not a candidate; stage 2 + cpu
  // needs 26 GB of fp16 parameters, so the parameters must leave the GPU too.
  in.gpus = 1;
  in.gpu_mem = 24e9;
  in.cpu_mem = 256e9;
  p = make_plan(in);
  EXPECT_EQ(p.rows[*p.recommended].setup, (PlanSetup{3, Tier::kCpu, Tier::kCpu}));
  // With too little host memory for that (16 x 13 = 208 GB) it goes to NVMe.
  in.cpu_mem = 128e9;
  in.nvme_free = 1e12;
  p = make_plan(in);
  EXPECT_EQ(p.rows[*p.recommended].setup, (PlanSetup{3, Tier::kNvme, Tier::kCpu}));
  in.nvme_free = 100e9;  // 12 x 13 = 156 GB of optimizer state does not fit
  p = make_plan(in);
  EXPECT_FALSE(p.recommended.has_value());
  EXPECT_EQ(p.rows.back().why_not, "NVMe needs 182.0 GB per node > --nvme-free 100.0 GB");
}

// The consumer box of docs/consumer.md: one GPU, --gpu-mem 24G, --cpu-mem 64G,
// --host-reserve 8G, --nvme-free 2T (G and T are powers of 1024), --nvme-gbps 3,
// --h2d-gbps 25, P,G,O = 2,2,12, DP = 1, no activations. By hand, with Gi = 2^30:
//   GPU 24 Gi = 25,769,803,776 B; host for pinned 64 Gi - 8 Gi = 56 Gi = 60,129,542,144 B.
//   none/none: stage 0 (no live term) 16Ψ <= 24 Gi -> Ψ = 1.5 Gi = 1,610,612,736 (GPU).
//   cpu/none: stage 2, GPU 2Ψ, host (12+2)Ψ <= 56 Gi -> Ψ = 4 Gi = 4,294,967,296 (host).
//   nvme/none: host 2Ψ + 4 x 1e9 x 12 = 2Ψ + 48e9 <= 56 Gi -> Ψ = 6,064,771,072 (host); the
//     GPU would allow 2Ψ + 2e9 live <= 24 Gi -> 11,884,901,888.
//   cpu/cpu: host 16Ψ <= 56 Gi -> Ψ = 3.5 Gi = 3,758,096,384 (host).
//   nvme/cpu: host 4Ψ + 48e9 <= 56 Gi -> Ψ = 3,032,385,536 (host).
//   nvme/nvme: host 2Ψ + 48e9 + 5 x 1e8 x 2 <= 56 Gi -> Ψ = 5,564,771,072 (host).
// With --sub-group-size 1e8 the ring is 4.8e9: nvme/none is GPU-bound at 11,884,901,888 and
// nvme/nvme host-bound at (56 Gi - 4.8e9 - 1e9) / 2 = 27,164,771,072. At that size one step
// moves 12Ψ read + 12Ψ written by the optimizer, 4Ψ of parameter reads and 2Ψ of writes, all
// at 3 GB/s: 30Ψ / 3e9 = 271.65 s; the link carries 4Ψ host->device (forward + backward
// fetches) and 2Ψ of gradients back: 4Ψ / 25e9 = 4.346 s.
TEST(PlanModel, LargestModelOnAConsumerBox) {
  const double Gi = 1024.0 * 1024 * 1024;
  PlanInput in;
  in.gpus = 1;
  in.gpu_mem = 24 * Gi;
  in.cpu_mem = 64 * Gi;
  in.host_reserve = 8 * Gi;
  in.nvme_free = 2 * 1024 * Gi;
  in.drive = DriveBandwidth{3, 3, 3};
  in.h2d_gbps = 25;
  std::vector<LargestModel> m = largest_models(in);
  ASSERT_EQ(m.size(), 6u);
  const double want[] = {1.5 * Gi, 4 * Gi, 6064771072, 3.5 * Gi, 3032385536, 5564771072};
  const char* limit[] = {"GPU", "host", "host", "host", "host", "host"};
  for (int i = 0; i < 6; ++i) {
    SCOPED_TRACE(i);
    EXPECT_NEAR(m[i].max_params, want[i], want[i] * 2e-6);
    EXPECT_LE(m[i].max_params, want[i] * (1 + 1e-12));  // never above the edge
    EXPECT_EQ(m[i].limit.rfind(limit[i], 0), 0u) << m[i].limit;
    EXPECT_TRUE(m[i].row.fits);
  }
  EXPECT_EQ(m[0].row.setup, (PlanSetup{0, Tier::kGpu, Tier::kGpu}));
  EXPECT_EQ(m[1].row.setup, (PlanSetup{2, Tier::kCpu, Tier::kGpu}));
  EXPECT_EQ(m[5].row.setup, (PlanSetup{3, Tier::kNvme, Tier::kNvme}));
  EXPECT_NE(m[2].limit.find("pinned + 8.6 GB reserve > --cpu-mem 68.7 GB"), std::string::npos)
      << m[2].limit;

  in.sub_group_size = 100'000'000;
  m = largest_models(in);
  EXPECT_NEAR(m[2].max_params, 11884901888, 11884901888 * 2e-6);
  EXPECT_EQ(m[2].limit.rfind("GPU", 0), 0u) << m[2].limit;
  const double psi = 27164771072;
  EXPECT_NEAR(m[5].max_params, psi, psi * 2e-6);
  ASSERT_TRUE(m[5].row.io_seconds && m[5].row.pcie_seconds);
  EXPECT_NEAR(*m[5].row.io_seconds, 271.65, 0.01);
  EXPECT_NEAR(*m[5].row.pcie_seconds, 4.346, 0.001);

  in.gpu_mem.reset();
  EXPECT_THROW(largest_models(in), UsageError);
}

// PCIe per GPU per step (10B on 8 GPUs, part = 1.25e9): optimizer offload sends the gradient
// partition out and the updated fp16 parameters back; parameter offload fetches them twice.
TEST(PlanModel, PcieTrafficAndTime) {
  PlanInput in;
  in.params = 10e9;
  in.gpus = 8;
  const double part = 1.25e9;
  PlanRow none = evaluate_setup(in, {3, Tier::kGpu, Tier::kGpu}, 8);
  EXPECT_EQ(none.h2d_per_step, 0);
  EXPECT_EQ(none.d2h_per_step, 0);
  EXPECT_FALSE(none.pcie_seconds.has_value());  // no rate given
  in.h2d_gbps = 20;
  in.d2h_gbps = 10;
  PlanRow cpu = evaluate_setup(in, {3, Tier::kCpu, Tier::kGpu}, 8);
  EXPECT_DOUBLE_EQ(cpu.h2d_per_step, 2 * part);
  EXPECT_DOUBLE_EQ(cpu.d2h_per_step, 2 * part);
  EXPECT_DOUBLE_EQ(*cpu.pcie_seconds, 2 * part / 10e9);  // the slower direction: 0.25 s
  PlanRow nn = evaluate_setup(in, {3, Tier::kNvme, Tier::kNvme}, 8);
  EXPECT_DOUBLE_EQ(nn.h2d_per_step, 4 * part);
  EXPECT_DOUBLE_EQ(nn.d2h_per_step, 2 * part);
  EXPECT_DOUBLE_EQ(*nn.pcie_seconds, 4 * part / 20e9);  // 0.25 s either way
  in.d2h_gbps = 0;                                      // symmetric
  cpu = evaluate_setup(in, {3, Tier::kCpu, Tier::kGpu}, 8);
  EXPECT_DOUBLE_EQ(*cpu.pcie_seconds, 2 * part / 20e9);
}

// The host reserve counts against --cpu-mem beside the pinned buffers.
TEST(PlanModel, HostReserveCountsAgainstCpuMem) {
  PlanInput in;
  in.params = 1e9;
  in.cpu_mem = 20e9;
  PlanRow r = evaluate_setup(in, {2, Tier::kCpu, Tier::kGpu}, 1);  // 14 GB pinned
  EXPECT_TRUE(r.fits);
  in.host_reserve = 8e9;
  r = evaluate_setup(in, {2, Tier::kCpu, Tier::kGpu}, 1);
  EXPECT_FALSE(r.fits);
  EXPECT_EQ(r.why_not, "host needs 14.0 GB per node pinned + 8.0 GB reserve > --cpu-mem 20.0 GB");
}

// Prefetch depth with fixed numbers. A 1 GB layer from a 5 GB/s drive (0.2 s) over a 20 GB/s
// link (0.05 s): latency 0.25 s, the drive the slower stage at 0.2 s per layer.
TEST(PlanModel, PrefetchDepthAdvice) {
  PrefetchAdvice a = prefetch_advice(1e9, 5, 20, 0.3);
  EXPECT_DOUBLE_EQ(a.nvme_seconds, 0.2);
  EXPECT_DOUBLE_EQ(a.h2d_seconds, 0.05);
  EXPECT_DOUBLE_EQ(a.latency_seconds, 0.25);
  EXPECT_DOUBLE_EQ(a.throughput_seconds, 0.2);
  ASSERT_TRUE(a.depth.has_value());
  EXPECT_EQ(*a.depth, 1u);  // 0.25 s hides behind one 0.3 s layer
  a = prefetch_advice(1e9, 5, 20, 0.2);
  ASSERT_TRUE(a.depth.has_value());
  EXPECT_EQ(*a.depth, 2u);                // ceil(0.25 / 0.2)
  a = prefetch_advice(1e9, 5, 20, 0.15);  // the drive needs 0.2 s a layer: nothing hides it
  EXPECT_FALSE(a.depth.has_value());
  EXPECT_NEAR(a.stall_seconds, 0.05, 1e-12);
  a = prefetch_advice(1e9, 0, 20, 0.01);  // parameters pinned on the host: the link only
  EXPECT_DOUBLE_EQ(a.latency_seconds, 0.05);
  EXPECT_FALSE(a.depth.has_value());
  EXPECT_NEAR(a.stall_seconds, 0.04, 1e-12);
  a = prefetch_advice(1e9, 5, 20, 0);  // no compute time: figures without a depth
  EXPECT_FALSE(a.depth.has_value());
  EXPECT_EQ(a.stall_seconds, 0);
}

}  // namespace
}  // namespace zinf::tools
