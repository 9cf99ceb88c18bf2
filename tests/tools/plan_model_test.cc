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

}  // namespace
}  // namespace zinf::tools
