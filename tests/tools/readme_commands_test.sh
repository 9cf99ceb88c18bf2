#!/usr/bin/env bash
# Runs every `zinf` line of the README's ```sh blocks as it is written (the leading `zinf`
# replaced by the built binary), and every line that runs the pip-installed package from `/`
# (`cd / && "$OLDPWD/v/bin/python" ...`: the venv's interpreter replaced by PYTHON with the
# build's package on PYTHONPATH; installing into that venv is what scripts/test.sh's Python leg
# checks), from an empty scratch directory, and fails on the first that does not exit 0: the
# README's commands must work on a fresh clone.
# Usage: readme_commands_test.sh ZINF_BINARY README_PATH [PYTHON_PACKAGE_DIR PYTHON]
set -euo pipefail
bin=$1
readme=$2
pydir=${3:-}
python=${4:-python3}
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
python_lines=0
if [ -n "$pydir" ]; then
  venv_python='cd / && "$OLDPWD/v/bin/python" '
  mapfile -t commands < <(awk '/^```sh/ { inside = 1; next } /^```/ { inside = 0 } inside && index($0, "cd / && \"$OLDPWD/v/bin/python\" ") == 1 { print }' "$readme")
  for line in "${commands[@]}"; do
    command="cd / && PYTHONPATH=$pydir \"\$python\" ${line#"$venv_python"}"
    echo "== $line"
    if ! (eval "$command") > "$work/output.txt" 2>&1; then
      cat "$work/output.txt"
      echo "readme_commands_test: failed: $line" >&2
      exit 1
    fi
    python_lines=$((python_lines + 1))
  done
  if [ "$python_lines" -eq 0 ]; then
    echo "readme_commands_test: no line running the installed package ($venv_python...) in $readme" >&2
    exit 1
  fi
fi
echo "readme_commands_test: zinf commands and $python_lines Python lines ran"
