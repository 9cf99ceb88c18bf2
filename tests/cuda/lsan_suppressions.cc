// SPDX-License-Identifier: Apache-2.0
// LeakSanitizer suppressions for the test binaries that may start the CUDA driver. Without a
// driver cudart leaks nothing (checked under the asan preset); on a GPU machine the driver
// library keeps process-lifetime allocations that LSan would report at exit. Only frames
// inside the NVIDIA driver libraries are suppressed, never zinf's own allocations.
extern "C" const char* __lsan_default_suppressions();  // NOLINT: LSan's hook name
extern "C" const char* __lsan_default_suppressions() {
  return "leak:libcuda.so\n"
         "leak:libnvidia-\n";
}
