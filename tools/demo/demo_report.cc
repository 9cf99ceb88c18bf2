// SPDX-License-Identifier: Apache-2.0
// What `zinf demo` says before and after training (demo_report.h).
#include "demo_report.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "bench_common.h"
#include "format.h"
#include "json_out.h"
#include "zinf/swap/io_engine.h"

namespace zinf::tools::demo {

using offload::EngineConfig;

std::string offload_name(const EngineConfig& config) {
  return config.offload_param.device == config.offload_optimizer.device
             ? std::string(offload::offload_device_name(config.offload_param.device))
             : std::string(offload::offload_device_name(config.offload_param.device)) + "/" +
                   std::string(offload::offload_device_name(config.offload_optimizer.device));
}

void print_header(std::FILE* out, const DemoOptions& o, const EngineConfig& config,
                  const std::string& dir_used, std::size_t numel, std::size_t local_batch,
                  dist::Collectives& comm) {
  const MlpShape& shape = o.shape;
  const int ranks = comm.size();
  const double param_bytes = static_cast<double>(shape.layers * numel * 2);
  std::fprintf(out,
               "zinf demo: %zu layers x %zu (%zu parameters, %s bf16, %s fp32 master + Adam), "
               "batch %zu, offload %s%s%s, lr %g\n",
               shape.layers, shape.hidden, shape.layers * numel, decimal_bytes(param_bytes).c_str(),
               decimal_bytes(param_bytes * 6).c_str(), shape.batch, offload_name(config).c_str(),
               dir_used.empty() ? "" : " in ", dir_used.c_str(), config.optimizer.hyper.lr);
  if (ranks > 1) {
    const std::string share =
        config.zero_stage >= 3
            ? "1/" + std::to_string(ranks) + " of every layer"
            : "every layer whole and 1/" + std::to_string(ranks) + " of its optimizer state";
    std::fprintf(out,
                 "zinf demo: data-parallel over %d ranks (%s), ZeRO stage %d: %zu samples and "
                 "%s each%s; figures below are rank 0's\n",
                 ranks, std::string(comm.name()).c_str(), config.zero_stage, local_batch,
                 share.c_str(), dir_used.empty() ? "" : ", swap files in rank<R> folders");
  }
  if (!o.resume_dir.empty()) {
    std::fprintf(out, "zinf demo: resumed from the checkpoint in %s\n", o.resume_dir.c_str());
  }
  if (!dir_used.empty()) {
    // Which I/O settings are in use, so that a tuned config can be seen to take effect.
    std::fprintf(out,
                 "zinf demo: I/O backend %s, aio block_size %s, queue_depth %u, checksums %s, "
                 "direct_io %s\n",
                 std::string(swap::io_engine_kind_name(config.zinf.backend)).c_str(),
                 human_bytes(config.aio.block_size).c_str(), config.aio.queue_depth,
                 config.zinf.checksums ? "on" : "off", config.zinf.direct_io ? "on" : "off");
  }
}

std::vector<RankBytes> gather_rank_bytes(dist::Collectives& comm, const offload::EngineStats& st,
                                         const TrainResult& r) {
  const std::array<std::int64_t, 4> mine = {static_cast<std::int64_t>(nvme_bytes_read(st)),
                                            static_cast<std::int64_t>(nvme_bytes_written(st)),
                                            static_cast<std::int64_t>(r.step_bytes_read.back()),
                                            static_cast<std::int64_t>(r.step_bytes_written.back())};
  std::vector<std::int64_t> all(mine.size() * static_cast<std::size_t>(comm.size()));
  if (comm.size() > 1) {
    dist::all_gather<std::int64_t>(comm, mine, all);
  } else {
    std::copy(mine.begin(), mine.end(), all.begin());
  }
  std::vector<RankBytes> out;
  for (std::size_t i = 0; i < all.size(); i += mine.size()) {
    out.push_back({static_cast<std::uint64_t>(all[i]), static_cast<std::uint64_t>(all[i + 1]),
                   static_cast<std::uint64_t>(all[i + 2]), static_cast<std::uint64_t>(all[i + 3])});
  }
  return out;
}

void report(std::FILE* out, const DemoOptions& o, const EngineConfig& config,
            const std::string& dir_used, std::size_t numel, int ranks, const TrainResult& r,
            const offload::EngineStats& st, const std::vector<RankBytes>& per_rank,
            const std::string& sha) {
  const MlpShape& shape = o.shape;
  const std::vector<double>& losses = r.losses;
  const double stall_share = r.total_s > 0 ? st.stall_seconds / r.total_s : 0;
  const double step_median = median(r.step_times);
  const std::uint64_t nvme_read = nvme_bytes_read(st);
  const std::uint64_t nvme_written = nvme_bytes_written(st);

  std::fprintf(out,
               "loss %.6f -> %.6f (x%.3f) in %llu steps, %.1f s; median step %.3f s\n"
               "nvme: read %s (optimizer state %.2f GB/s, parameters %.2f GB/s), written %s "
               "(%.2f GB/s); prefetch stall %.1f%% "
               "(%llu hits, %llu on demand); pinned peak %s\n"
               "weights_sha256 %s\n",
               losses.front(), losses.back(), losses.back() / losses.front(),
               static_cast<unsigned long long>(o.steps), r.total_s, step_median,
               decimal_bytes(static_cast<double>(nvme_read)).c_str(), st.nvme_read_gbps,
               st.param_read_gbps, decimal_bytes(static_cast<double>(nvme_written)).c_str(),
               st.nvme_write_gbps, 100.0 * stall_share,
               static_cast<unsigned long long>(st.prefetch_hits),
               static_cast<unsigned long long>(st.prefetch_on_demand),
               decimal_bytes(static_cast<double>(st.pinned_bytes_peak)).c_str(), sha.c_str());
  const offload::StepStats& last = r.last_step;
  if (ranks > 1) {
    std::fprintf(out,
                 "collectives per step, received by rank 0 (a ring's bytes): all-gather %s, "
                 "reduce-scatter %s, all-reduce %s\n",
                 decimal_bytes(static_cast<double>(last.allgather_bytes)).c_str(),
                 decimal_bytes(static_cast<double>(last.reduce_scatter_bytes)).c_str(),
                 decimal_bytes(static_cast<double>(last.all_reduce_bytes)).c_str());
    // Each rank moves its own slices only, on its own drive: N shares of about the same size.
    std::fprintf(out, "nvme per rank, last step (read / written):");
    for (std::size_t k = 0; k < per_rank.size(); ++k) {
      std::fprintf(out, "%s rank %zu %s / %s", k == 0 ? "" : ",", k,
                   decimal_bytes(static_cast<double>(per_rank[k].step_read)).c_str(),
                   decimal_bytes(static_cast<double>(per_rank[k].step_written)).c_str());
    }
    std::fputc('\n', out);
  }
  if (!o.json) return;
  Json j;
  j["command"] = "demo";
  j["offload"] = offload_name(config);
  j["layers"] = std::uint64_t{shape.layers};
  j["hidden"] = std::uint64_t{shape.hidden};
  j["batch"] = std::uint64_t{shape.batch};
  j["seed"] = o.seed;
  j["lr"] = config.optimizer.hyper.lr;
  j["parameters"] = std::uint64_t{shape.layers * numel};
  j["steps"] = o.steps;
  j["initial_loss"] = losses.front();
  j["final_loss"] = losses.back();
  j["losses"] = losses;
  j["step_seconds"] = step_median;
  j["total_seconds"] = r.total_s;
  j["nvme_bytes_read"] = nvme_read;
  j["nvme_bytes_written"] = nvme_written;
  j["step_nvme_bytes_read"] = r.step_bytes_read;
  j["step_nvme_bytes_written"] = r.step_bytes_written;
  Json read = Json::array(), written = Json::array(), step_read = Json::array(),
       step_written = Json::array();
  for (const RankBytes& b : per_rank) {
    read.push_back(b.read);
    written.push_back(b.written);
    step_read.push_back(b.step_read);
    step_written.push_back(b.step_written);
  }
  j["rank_nvme_bytes_read"] = read;
  j["rank_nvme_bytes_written"] = written;
  j["rank_step_nvme_bytes_read"] = step_read;
  j["rank_step_nvme_bytes_written"] = step_written;
  j["nvme_read_gbps"] = st.nvme_read_gbps;
  j["nvme_write_gbps"] = st.nvme_write_gbps;
  j["param_read_gbps"] = st.param_read_gbps;
  j["stall_seconds"] = st.stall_seconds;
  j["stall_share"] = stall_share;
  j["prefetch_hits"] = st.prefetch_hits;
  j["prefetch_on_demand"] = st.prefetch_on_demand;
  j["pinned_bytes_peak"] = st.pinned_bytes_peak;
  j["dir"] = dir_used;
  j["weights_sha256"] = sha;
  j["ranks"] = ranks;
  j["zero_stage"] = config.zero_stage;
  // The last step's (every step moves the same; 0 on one rank).
  j["allgather_bytes_per_step"] = last.allgather_bytes;
  j["reduce_scatter_bytes_per_step"] = last.reduce_scatter_bytes;
  j["all_reduce_bytes_per_step"] = last.all_reduce_bytes;
  j["resumed_from"] = o.resume_dir;
  j["saved_to"] = o.save_dir;
  std::printf("%s\n", json_text(j).c_str());
}

}  // namespace zinf::tools::demo
