// SPDX-License-Identifier: Apache-2.0
// dma_copy: memcpy for small copies, 16-byte streaming stores (SSE2) for large ones.
#include "dma_copy.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace zinf::cuda::detail {

void streaming_copy(std::byte* dst, const std::byte* src, std::size_t n) noexcept {
#if defined(__x86_64__)
  // Streaming stores need a 16-byte aligned destination: copy the head up to it with memcpy,
  // then 64 bytes (one cache line, four stores) per iteration, loading unaligned since the
  // source may sit at any offset, then the tail. The fence orders the weakly ordered streaming
  // stores before whatever this thread stores next (the event or flag that publishes them).
  const std::size_t head =
      std::min<std::size_t>(n, (16 - (reinterpret_cast<std::uintptr_t>(dst) & 15)) & 15);
  std::memcpy(dst, src, head);
  dst += head;
  src += head;
  n -= head;
  const std::size_t body = n & ~std::size_t{63};
  for (std::size_t i = 0; i < body; i += 64) {
    const auto* s = reinterpret_cast<const __m128i*>(src + i);
    auto* d = reinterpret_cast<__m128i*>(dst + i);
    const __m128i a = _mm_loadu_si128(s);
    const __m128i b = _mm_loadu_si128(s + 1);
    const __m128i c = _mm_loadu_si128(s + 2);
    const __m128i e = _mm_loadu_si128(s + 3);
    _mm_stream_si128(d, a);
    _mm_stream_si128(d + 1, b);
    _mm_stream_si128(d + 2, c);
    _mm_stream_si128(d + 3, e);
  }
  std::memcpy(dst + body, src + body, n - body);
  _mm_sfence();
#else
  std::memcpy(dst, src, n);
#endif
}

void dma_copy(std::byte* dst, const std::byte* src, std::size_t n) noexcept {
  if (n < kStreamingCopyThreshold) {
    std::memcpy(dst, src, n);
    return;
  }
  streaming_copy(dst, src, n);
}

}  // namespace zinf::cuda::detail
