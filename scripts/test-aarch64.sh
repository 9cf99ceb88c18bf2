#!/usr/bin/env bash
# Cross-builds zinf for aarch64 (preset `aarch64`: Debian's g++-aarch64-linux-gnu, Release,
# without the CLI, benchmarks, CUDA, MPI, Python and liburing) and runs the unit and contract
# labels under qemu-user (qemu-aarch64), printing how long each phase took. Needs
# `scripts/install-deps.sh --aarch64` (the cross compiler, qemu-user and GoogleTest's sources).
#
# What runs is every test executable of the unit and contract labels that the cross build has
# (the tools' tests need the CLI, which needs Nettle, not installed for arm64); tests that need
# io_uring skip with the reason, as on a kernel that refuses it: qemu-user does not translate
# io_uring's system calls, and the build has no liburing for arm64 (the threads backend runs).
# The CPU Adam SVE path runs at qemu's default vector length and, through ctest entries that
# set QEMU_CPU, at 16, 32 and 256 bytes and with SVE off (tests/adam/CMakeLists.txt).
# Timings under qemu are not performance figures: qemu translates every instruction.
#
# Usage: scripts/test-aarch64.sh [--fresh] [ctest arguments...]
#   --fresh   delete build/aarch64 first (a clean build, as CI would do)
set -euo pipefail
cd "$(dirname "$0")/.."

fresh=0
if [ "${1:-}" = "--fresh" ]; then
  fresh=1
  shift
fi
for tool in aarch64-linux-gnu-g++ qemu-aarch64; do
  command -v "$tool" >/dev/null || {
    echo "test-aarch64: $tool not found (scripts/install-deps.sh --aarch64 installs it)" >&2
    exit 1
  }
done

jobs="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
phase_start=0
phases=()
begin() { phase_start=$(date +%s); echo "== test-aarch64: $1"; }
end() {
  local secs=$(( $(date +%s) - phase_start ))
  phases+=("$1 ${secs}s")
  echo "== test-aarch64: $1 took ${secs}s"
}

[ "$fresh" = 1 ] && rm -rf build/aarch64
begin configure
cmake --preset aarch64
end configure

begin build
cmake --build --preset aarch64 -j "$jobs"
end build

begin test
status=0
ctest --preset aarch64 -j "$jobs" "$@" || status=$?
end test

echo "== test-aarch64: ${phases[*]}"
exit "$status"
