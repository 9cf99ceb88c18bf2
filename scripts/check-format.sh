#!/usr/bin/env bash
# Checks that every tracked C, C++ and CUDA file is laid out as .clang-format says (the whole
# tree, so a change cannot move the layout of the lines around it either). Fails listing the
# files that differ and the command that fixes them; --fix rewrites them in place.
# Usage: scripts/check-format.sh [--fix]
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v clang-format >/dev/null; then
  echo "check-format.sh: clang-format not found (Debian package clang-format;" \
       "scripts/install-deps.sh installs it)" >&2
  exit 1
fi
mapfile -t files < <(git ls-files '*.c' '*.cc' '*.h' '*.cu' '*.cuh')
if [ "${1:-}" = "--fix" ]; then
  clang-format -i "${files[@]}"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  if ! clang-format --dry-run --Werror "$f" >/dev/null 2>&1; then
    bad+=("$f")
  fi
done
if [ "${#bad[@]}" -gt 0 ]; then
  echo "check-format.sh: ${#bad[@]} file(s) not laid out as .clang-format says" \
       "($(clang-format --version | head -1)):" >&2
  printf '  %s\n' "${bad[@]}" >&2
  echo "fix with: scripts/check-format.sh --fix (or clang-format -i FILE)" >&2
  exit 1
fi
echo "check-format.sh: ${#files[@]} files laid out as .clang-format says"
