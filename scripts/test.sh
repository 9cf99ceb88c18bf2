#!/usr/bin/env bash
# Sets up and runs zinf's test suite: installs the Debian packages, then runs the CMake
# workflows: `ci` (release build, public-header check, every label), `ci-asan` (address +
# undefined sanitizers) and `ci-tsan` (thread sanitizer), the sanitizer ones on the unit,
# contract and fault labels (without the Python module and MPI, whose labels run in the release
# workflow only), and last the aarch64 cross build with its unit and contract labels under
# qemu-user (scripts/test-aarch64.sh; the NEON and SVE paths). GPU tests skip with a reason
# where no GPU is visible. The release workflow's every label includes `mpi` (the collectives
# under mpirun; docs/distributed.md).
# Usage: scripts/test.sh [--quick]   (--quick: the release workflow only)
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
[ "${1:-}" = "--quick" ] && quick=1
if [ "$quick" = 1 ]; then
  scripts/install-deps.sh
else
  scripts/install-deps.sh --aarch64
fi

# cmake --workflow takes no -j: these are what cmake --build and ctest read instead.
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
export CTEST_PARALLEL_LEVEL="${CTEST_PARALLEL_LEVEL:-$(nproc)}"

workflows=(ci ci-asan ci-tsan)
[ "$quick" = 1 ] && workflows=(ci)
for w in "${workflows[@]}"; do
  echo "== workflow: $w"
  cmake --workflow --preset "$w"
  if [ "$w" = ci ]; then
    # A test declared with several labels must keep them all (CTest once kept only the first).
    # The list is taken whole first: `grep -q` stops reading at its first match, and under
    # pipefail the SIGPIPE that ctest then gets would read as "no test listed".
    contract_tests=$(ctest --test-dir build/release -N -L contract)
    if ! grep -q 'OffloadEngine\.' <<<"$contract_tests"; then
      echo "test.sh: 'ctest -L contract' lists no OffloadEngine test: multi-label registration broke" >&2
      exit 1
    fi
    # install-deps.sh installs Open MPI, so the mpi label must have run: an MPI that CMake no
    # longer finds would otherwise drop those tests without a word.
    mpi_tests=$(ctest --test-dir build/release -N -L mpi)
    if ! grep -q 'mpi_fault_np2' <<<"$mpi_tests"; then
      echo "test.sh: 'ctest -L mpi' lists no MPI test: was MPI found at configure time (ZINF_WITH_MPI)?" >&2
      exit 1
    fi
  fi
done

if [ "$quick" = 0 ]; then
  echo "== aarch64: cross build, unit and contract labels under qemu-user"
  scripts/test-aarch64.sh
fi
