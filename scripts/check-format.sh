#!/usr/bin/env bash
# Checks that the C, C++ and CUDA lines changed since a base commit are laid out as
# .clang-format says (git clang-format: only those lines, so older code is reformatted when it
# is next touched, not in one sweep). The base is .ci/format-base unless given; it stays fixed,
# so the check covers every change made after it. Fails showing the layout it wants; --fix
# applies it to the working tree.
# Usage: scripts/check-format.sh [--fix] [BASE]
set -euo pipefail
cd "$(dirname "$0")/.."
fix=0
if [ "${1:-}" = "--fix" ]; then fix=1; shift; fi
base=${1:-$(tr -d '[:space:]' < .ci/format-base)}
for tool in clang-format git-clang-format; do
  if ! command -v "$tool" >/dev/null; then
    echo "check-format.sh: $tool not found (Debian package clang-format;" \
         "scripts/install-deps.sh installs it)" >&2
    exit 1
  fi
done
if ! git cat-file -e "$base^{commit}" 2>/dev/null; then
  echo "check-format.sh: the base commit $base is not in this clone (a shallow clone?):" \
       "fetch the history (git fetch --unshallow) to check the changed lines" >&2
  exit 1
fi
exts=c,cc,h,cu,cuh
if [ "$fix" = 1 ]; then
  git clang-format --force --extensions "$exts" "$base" -- . || true
  exit 0
fi
# --diff prints the wanted layout as a patch, or a line saying there is nothing to change.
out=$(git clang-format --diff --extensions "$exts" "$base" -- . 2>&1 || true)
if grep -q '^diff ' <<<"$out"; then
  echo "check-format.sh: lines changed since $base are not laid out as .clang-format says" \
       "($(clang-format --version | head -1)); the layout it wants:" >&2
  echo "$out" >&2
  echo "fix with: scripts/check-format.sh --fix" >&2
  exit 1
fi
echo "check-format.sh: the C/C++/CUDA lines changed since ${base:0:12} are laid out as" \
     ".clang-format says"
