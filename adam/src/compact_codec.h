// SPDX-License-Identifier: Apache-2.0
// The contract between CpuAdam's compact-state step (compact_state.cc) and its per-ISA
// codecs (compact_codec_<isa>.cc): decode a range of compact moments to fp32 scratch before
// the ordinary fp32 kernel updates it in cache, encode the scratch back after. Every codec
// gives the exact encoding compact_state.h defines, so the ISAs agree bitwise. Kept free of
// inline std code for the reason cpu_adam_kernel.h gives.
#pragma once

#include <cstddef>
#include <cstdint>

#include "zinf/adam/compact_state.h"

namespace zinf::adam::detail {

// Elements decoded, updated and encoded at a time: 8 KiB of fp32 m and of v scratch, so
// that both stay in L1 between the decode, the kernel and the encode. A multiple of
// kInt8Block, as every range a codec is given starts on a block.
inline constexpr std::size_t kCodecPiece = 2048;

// m[i - begin], v[i - begin] = the decoded moments of elements [begin, end). `begin` is a
// multiple of kInt8Block; `end` is too unless it is the end of the array.
using DecodeFn = void (*)(const CompactMoments& c, std::size_t begin, std::size_t end, float* m,
                          float* v);
// Encodes m[i - begin], v[i - begin] into elements [begin, end) (and their blocks' scales).
using EncodeFn = void (*)(const CompactMoments& c, std::size_t begin, std::size_t end,
                          const float* m, const float* v);

struct Codec {
  DecodeFn decode;
  EncodeFn encode;
};

// The encoding's constants (compact_state.h): 127^2 and the fp32 nearest to 255^4.
inline constexpr float kMLevels = 16129.0f;
inline constexpr float kVLevels = 65025.0f * 65025.0f;
// A block whose largest magnitude is below this is stored as zeros with scale 0, so that
// levels / largest stays finite.
inline constexpr float kTinyBlock = 0x1p-96f;

// A block's stored scale and the factor its codes are made with, from its largest magnitude
// (compact_state.h), for `levels` kMLevels or kVLevels. One out-of-line function that every
// codec calls, so that the scalars are the same operations on every path.
struct BlockScale {
  float scale;
  float inv;
};
BlockScale block_scale(float largest, float levels);

void decode_scalar(const CompactMoments& c, std::size_t begin, std::size_t end, float* m,
                   float* v);
void encode_scalar(const CompactMoments& c, std::size_t begin, std::size_t end, const float* m,
                   const float* v);
#if ZINF_CPU_ADAM_X86
void decode_avx2(const CompactMoments& c, std::size_t begin, std::size_t end, float* m, float* v);
void encode_avx2(const CompactMoments& c, std::size_t begin, std::size_t end, const float* m,
                 const float* v);
void decode_avx512(const CompactMoments& c, std::size_t begin, std::size_t end, float* m,
                   float* v);
void encode_avx512(const CompactMoments& c, std::size_t begin, std::size_t end, const float* m,
                   const float* v);
#endif

}  // namespace zinf::adam::detail
