#!/usr/bin/env bash
# Sets up zinf and runs its main job on a scratch folder under the current directory:
# installs the Debian packages, builds the release preset, then measures the swap path with
# `zinf bench io` (every byte verified). Extra arguments go to `zinf bench io`.
set -euo pipefail
here=$(pwd)
src="$(cd "$(dirname "$0")/.." && pwd)"
"$src/scripts/install-deps.sh"
cmake -S "$src" --preset release >/dev/null
cmake --build "$src/build/release" --target zinf -j "$(nproc)"
mkdir -p "$here/zinf-scratch"
exec "$src/build/release/tools/zinf" bench io --dir "$here/zinf-scratch" --size 1G "$@"
