#!/usr/bin/env bash
# Sets up and runs zinf's test suite: installs the Debian packages, builds the release and the
# address/undefined-sanitizer presets, runs every label on release and the unit, contract and
# fault labels under the sanitizers. GPU tests skip with a reason where no GPU is visible.
# Usage: scripts/test.sh [--quick]   (--quick: release preset only)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh

jobs=$(nproc)
presets=(release asan)
[ "${1:-}" = "--quick" ] && presets=(release)
for p in "${presets[@]}"; do
  echo "== configure + build: $p"
  cmake --preset "$p" >/dev/null
  cmake --build --preset "$p" -j "$jobs"
done
cmake --build build/release --target zinf_check_headers -j "$jobs"
# A test declared with several labels must keep them all (CTest once kept only the first).
if ! ctest --test-dir build/release -N -L contract | grep -q 'OffloadEngine\.'; then
  echo "test.sh: 'ctest -L contract' lists no OffloadEngine test: multi-label registration broke" >&2
  exit 1
fi
for p in "${presets[@]}"; do
  echo "== test: $p"
  ctest --preset "$p" -j "$jobs"
done
