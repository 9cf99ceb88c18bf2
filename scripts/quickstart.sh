#!/usr/bin/env bash
# Sets up zinf and runs its main job on a scratch folder under the current directory:
# installs the Debian packages, builds the release preset, then runs `zinf demo`, a small
# training job whose parameters and optimizer state are offloaded to NVMe files in
# ./zinf-scratch through OffloadEngine (loss per step, step time, NVMe GB/s, prefetch stalls).
# Extra arguments go to `zinf demo` (e.g. --offload cpu, --steps 100, --json).
set -euo pipefail
here=$(pwd)
src="$(cd "$(dirname "$0")/.." && pwd)"
"$src/scripts/install-deps.sh"
cmake -S "$src" --preset release >/dev/null
# zinf_python too: the README's PyTorch lines (`import zinf` with PYTHONPATH=build/release/python)
# work right after this script.
cmake --build "$src/build/release" --target zinf zinf_python -j "$(nproc)"
mkdir -p "$here/zinf-scratch"
exec "$src/build/release/tools/zinf" demo --offload nvme --dir "$here/zinf-scratch" "$@"
