#!/usr/bin/env bash
# Runs every `zinf` line of the README's ```sh blocks as it is written (the leading `zinf`
# replaced by the built binary), from an empty scratch directory, and fails on the first that
# does not exit 0: the README's commands must work on a fresh clone.
# Usage: readme_commands_test.sh ZINF_BINARY README_PATH
set -euo pipefail
bin=$1
readme=$2
work=$(mktemp -d "${ZINF_TEST_DIR:-${TMPDIR:-/tmp}}/zinf-readme-XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$work"
mapfile -t commands < <(awk '/^```sh/ { inside = 1; next } /^```/ { inside = 0 } inside && /^zinf / { print }' "$readme")
if [ "${#commands[@]}" -lt 5 ]; then
  echo "readme_commands_test: found ${#commands[@]} zinf commands in $readme's sh blocks; expected the examples" >&2
  exit 1
fi
for line in "${commands[@]}"; do
  command=${line%%#*}  # a trailing comment is not part of the command
  echo "== $command"
  # eval: the README's quoting is the shell's.
  if ! eval "\"\$bin\" ${command#zinf }" > output.txt 2>&1; then
    cat output.txt
    echo "readme_commands_test: failed: $command" >&2
    exit 1
  fi
done
echo "readme_commands_test: ${#commands[@]} commands ran"
