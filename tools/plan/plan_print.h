// SPDX-License-Identifier: Apache-2.0
// What `zinf plan` prints: the tables (narrow, --wide, --largest) and the JSON of a setup, of
// the largest models and of the recommended DeepSpeed "zero_optimization" block.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "json_out.h"
#include "plan_model.h"

namespace zinf::tools {

/// Bytes in GB (10^9 bytes), as the tables print them.
inline double gb(double bytes) { return bytes / 1e9; }

/// A parameter count as "13B", "350M" or "4096" (4 significant digits).
std::string param_count_text(double params);

/// One setup's needs as --json names them.
Json row_json(const PlanRow& r);

/// The recommendation as the "zero_optimization" block a DeepSpeed user pastes into ds_config.
std::string zero_optimization_json(const PlanSetup& s, std::uint64_t sub_group_size);

/// The full table (--wide): every column plan_model computes, the reasons in full.
void print_wide_table(const Plan& plan, const PlanInput& in);

/// The default table: the columns a choice is made on, within 100 columns, then what they mean.
void print_narrow_table(const Plan& plan, const PlanInput& in);

/// The largest model per placement (--largest): its size, the limit one size larger breaks,
/// and the step time the drive and the link bound it to at that size. Needs in.gpu_mem.
void print_largest(const std::vector<LargestModel>& ms, const PlanInput& in);

/// --largest in --json: one object per placement.
Json largest_json(const std::vector<LargestModel>& ms);

}  // namespace zinf::tools
