// SPDX-License-Identifier: Apache-2.0
// The AVX-512 (F, BW, VL, DQ) CpuAdam kernel, bf16 copy-out rounded with integer ops. Built
// with -mavx512f -mavx512bw -mavx512vl -mavx512dq only on x86 (adam/CMakeLists.txt) and
// called only when cpuid says the CPU and OS support it.
#include "cpu_adam_avx512_impl.h"

namespace zinf::adam::detail {

void adam_kernel_avx512(const KernelArgs& args, std::size_t begin, std::size_t end) {
  dispatch<Avx512Kernel>(args, begin, end);
}

}  // namespace zinf::adam::detail
