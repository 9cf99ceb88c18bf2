// SPDX-License-Identifier: Apache-2.0
// CpuAdam's compact-state step (compact_state.cc), called by cpu_adam.cc on each of the
// pool's chunks: for every kCodecPiece elements, the ISA's codec decodes m and v to fp32
// scratch in L1, the ISA's ordinary fp32 kernel updates them there (so any change to the
// kernel serves every precision), and the codec encodes them back. Private to zinf::adam.
#pragma once

#include <cstddef>

#include "compact_codec.h"
#include "cpu_adam_kernel.h"
#include "zinf/adam/cpu_adam.h"

namespace zinf::adam::detail {

struct CompactJob {
  KernelFn kernel;
  KernelArgs args;  // m and v unused: the scratch replaces them
  std::size_t grad_bytes = 4;
  std::size_t out_bytes = 2;
  float* out_f32 = nullptr;  // an fp32 copy-out
  CompactMoments moments = {};
  Codec codec = {};
  const ChunkHooks* hooks = nullptr;
};

// The codec of `isa` (the AVX-512 one serves both AVX-512 paths).
Codec codec_for(Isa isa);
// ChunkPool callback: updates elements [begin, end) of the CompactJob at `ctx`; `begin` is a
// multiple of kInt8Block.
void run_compact_chunk(const void* ctx, std::size_t begin, std::size_t end);

}  // namespace zinf::adam::detail
