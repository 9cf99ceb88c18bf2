// SPDX-License-Identifier: Apache-2.0
// The AVX-512 CpuAdam kernel with bf16 copy-out by VCVTNEPS2BF16 (AVX512-BF16). Built with
// -mavx512bf16 on top of the AVX-512 flags and called only where cpuid reports avx512_bf16.
// The instruction rounds to nearest even like the integer path but flushes subnormal results.
#define ZINF_ADAM_USE_AVX512BF16 1
#include "cpu_adam_avx512_impl.h"

namespace zinf::adam::detail {

void adam_kernel_avx512bf16(const KernelArgs& args, std::size_t begin, std::size_t end) {
  dispatch<Avx512Kernel>(args, begin, end);
}

}  // namespace zinf::adam::detail
