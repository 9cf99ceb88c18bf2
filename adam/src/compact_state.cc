// SPDX-License-Identifier: Apache-2.0
// Compact Adam moments: names and sizes, the public encode/decode (the scalar codec, which
// every ISA's codec matches bitwise), and the per-chunk loop of CpuAdam's compact step
// (compact_step.h).
#include "zinf/adam/compact_state.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "compact_step.h"
#include "zinf/common/error.h"

namespace zinf::adam {

std::string_view state_precision_name(StatePrecision p) noexcept {
  switch (p) {
    case StatePrecision::kF32: return "fp32";
    case StatePrecision::kBF16: return "bf16";
    case StatePrecision::kInt8: return "int8";
  }
  return "?";
}

StatePrecision parse_state_precision(std::string_view text, std::string_view what) {
  for (auto p : {StatePrecision::kF32, StatePrecision::kBF16, StatePrecision::kInt8}) {
    if (text == state_precision_name(p)) return p;
  }
  throw UsageError("invalid " + std::string(what) + " '" + std::string(text) +
                   "': expected fp32, bf16 or int8");
}

std::uint64_t moment_bytes(StatePrecision p, std::uint64_t n) noexcept {
  switch (p) {
    case StatePrecision::kF32: return 8 * n;
    case StatePrecision::kBF16: return 4 * n;
    case StatePrecision::kInt8: return 2 * n + 8 * ((n + kInt8Block - 1) / kInt8Block);
  }
  return 0;
}

CompactMoments compact_moments_at(StatePrecision p, std::size_t n, std::byte* base) noexcept {
  CompactMoments c{p, n, base, nullptr, nullptr, nullptr};
  switch (p) {
    case StatePrecision::kF32: c.v = base + 4 * n; break;
    case StatePrecision::kBF16: c.v = base + 2 * n; break;
    case StatePrecision::kInt8: {
      const std::size_t blocks = (n + kInt8Block - 1) / kInt8Block;
      c.m_scale = reinterpret_cast<float*>(base);
      c.v_scale = c.m_scale + blocks;
      c.m = base + 8 * blocks;
      c.v = base + 8 * blocks + n;
      break;
    }
  }
  return c;
}

namespace {

void check_moments(const char* function, const CompactMoments& c, std::size_t m_size,
                   std::size_t v_size, bool allow_empty) {
  const std::string f = std::string("cpu adam: ") + function + ": ";
  for (std::size_t s : {m_size, v_size}) {
    if (s != c.size && !(allow_empty && s == 0)) {
      throw UsageError(f + "a span has " + std::to_string(s) + " elements, the moments have " +
                       std::to_string(c.size));
    }
  }
  if (c.size == 0) return;
  if (c.m == nullptr || c.v == nullptr ||
      (c.precision == StatePrecision::kInt8 && (c.m_scale == nullptr || c.v_scale == nullptr))) {
    throw UsageError(f + "null moments with " + std::to_string(c.size) + " elements");
  }
}

}  // namespace

void encode_moments(std::span<const float> m, std::span<const float> v, const CompactMoments& out) {
  check_moments("encode_moments", out, m.size(), v.size(), false);
  detail::encode_scalar(out, 0, out.size, m.data(), v.data());
}

void decode_moments(const CompactMoments& in, std::span<float> m, std::span<float> v) {
  check_moments("decode_moments", in, m.size(), v.size(), true);
  // Through scratch a piece at a time, so that either span may be skipped.
  float sm[detail::kCodecPiece];
  float sv[detail::kCodecPiece];
  for (std::size_t b = 0; b < in.size; b += detail::kCodecPiece) {
    const std::size_t e = std::min(in.size, b + detail::kCodecPiece);
    detail::decode_scalar(in, b, e, sm, sv);
    if (!m.empty()) std::copy(sm, sm + (e - b), m.data() + b);
    if (!v.empty()) std::copy(sv, sv + (e - b), v.data() + b);
  }
}

namespace detail {

Codec codec_for(Isa isa) {
  switch (isa) {
#if ZINF_CPU_ADAM_X86
    case Isa::kAvx512Bf16:
    case Isa::kAvx512: return {decode_avx512, encode_avx512};
    case Isa::kAvx2: return {decode_avx2, encode_avx2};
#else
    case Isa::kAvx512Bf16:
    case Isa::kAvx512:
    case Isa::kAvx2: break;
#endif
    case Isa::kSve:   // no SVE or NEON codec yet: the portable one, which aarch64 compilers
    case Isa::kNeon:  // vectorise (for NEON; the library's baseline has no SVE)
    case Isa::kScalar: break;
  }
  return {decode_scalar, encode_scalar};
}

void run_compact_chunk(const void* ctx, std::size_t begin, std::size_t end) {
  const auto& job = *static_cast<const CompactJob*>(ctx);
  const ChunkHooks* h = job.hooks;
  // The hooks' pieces as in the fp32 step (kHookPieceElements, in L2), each cut into codec
  // pieces (in L1); every piece boundary is a multiple of kInt8Block.
  alignas(64) float m[kCodecPiece];
  alignas(64) float v[kCodecPiece];
  for (std::size_t b = begin; b < end; b += kHookPieceElements) {
    const std::size_t e = std::min(end, b + kHookPieceElements);
    if (h != nullptr && h->before != nullptr) h->before(h->ctx, b, e);
    for (std::size_t s = b; s < e; s += kCodecPiece) {
      const std::size_t t = std::min(e, s + kCodecPiece);
      job.codec.decode(job.moments, s, t, m, v);
      KernelArgs a = job.args;
      a.params += s;
      a.m = m;
      a.v = v;
      a.grads = static_cast<const unsigned char*>(a.grads) + s * job.grad_bytes;
      if (a.out != nullptr) a.out = static_cast<unsigned char*>(a.out) + s * job.out_bytes;
      job.kernel(a, 0, t - s);
      job.codec.encode(job.moments, s, t, m, v);
      if (job.out_f32 != nullptr) std::copy(a.params, a.params + (t - s), job.out_f32 + s);
    }
    if (h != nullptr && h->after != nullptr) h->after(h->ctx, b, e);
  }
}

}  // namespace detail
}  // namespace zinf::adam
