#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Package.PythonFromBuild: what pip's build installs (pyproject.toml: the CMake component
# `python`) when ZINF_PYTHON_FROM_BUILD names a build tree (cmake/ZinfPython.cmake), checked
# with CMake alone, in seconds: a tree without a module the interpreter imports is refused with
# one line naming it, what the tree has and what to do; a tree with one installs exactly that
# module and the package's .py, .pyi and py.typed, into the wheel's root under scikit-build-core
# (SKBUILD) and into lib/python3.X/site-packages otherwise; the setting is not left in the cache.
# Usage: python_package_test.sh <source dir> <cmake> <generator> <python3>
set -euo pipefail
src=$1 cmake=$2 generator=$3 py=$4

tmp=$(mktemp -d "${ZINF_TEST_DIR:-${TMPDIR:-/tmp}}/zinf-pypkg-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
suffix=$("$py" -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
# CMake wraps a message to its width: the checks read it joined back into one line.
says() {  # <log> <text>
  tr '\n' ' ' <"$1" | tr -s ' ' | grep -F -- "$2" >/dev/null || { cat "$1"; fail "$1 does not say: $2"; }
}
configure() {  # <build dir> <from-build dir> [more -D...]
  local b=$1 from=$2
  shift 2
  "$cmake" -S "$src" -B "$b" -G "$generator" -DPython3_EXECUTABLE="$py" \
    -DZINF_PYTHON_FROM_BUILD="$from" "$@"
}

echo "== a tree without a built module is refused, naming what to build"
mkdir -p "$tmp/empty"
if configure "$tmp/b1" "$tmp/empty" >"$tmp/b1.log" 2>&1; then fail "configure accepted $tmp/empty"; fi
says "$tmp/b1.log" "zinf: ZINF_PYTHON_FROM_BUILD=$tmp/empty has no $tmp/empty/python/zinf/_native$suffix for $py (found there: ''): build its target zinf_python, configured for this Python version"

echo "== a module for another interpreter is refused, naming the one found"
mkdir -p "$tmp/other/python/zinf"
other=$tmp/other/python/zinf/_native.cpython-20-x86_64-linux-gnu.so
echo "not this interpreter's" >"$other"
if configure "$tmp/b2" "$tmp/other" >"$tmp/b2.log" 2>&1; then fail "configure accepted $other"; fi
says "$tmp/b2.log" "has no $tmp/other/python/zinf/_native$suffix for $py (found there: '$other')"

echo "== a module this interpreter imports: the package, as the wheel holds it"
mkdir -p "$tmp/tree/python/zinf"
module=$tmp/tree/python/zinf/_native$suffix
head -c 4096 /dev/urandom >"$module"
expected=$( (cd "$src/python/zinf" && find . -type f \( -name '*.py' -o -name '*.pyi' -o -name py.typed \) | sort
             echo "./_native$suffix") | sort)
check_installed() {  # <folder holding zinf/>
  local got
  got=$(cd "$1/zinf" && find . -type f | sort)
  [ "$got" = "$expected" ] || fail "installed under $1/zinf:
$got
expected:
$expected"
  cmp "$module" "$1/zinf/_native$suffix" || fail "the installed module is not the tree's"
}
configure "$tmp/b3" "$tmp/tree" -DSKBUILD=2 >"$tmp/b3.log" 2>&1 || { cat "$tmp/b3.log"; fail "configure (SKBUILD)"; }
if grep -q '^ZINF_PYTHON_FROM_BUILD' "$tmp/b3/CMakeCache.txt"; then
  fail "ZINF_PYTHON_FROM_BUILD stayed in the cache: a later plain build would reuse it"
fi
"$cmake" --build "$tmp/b3" --target zinf_python >/dev/null || fail "build zinf_python (nothing to do)"
"$cmake" --install "$tmp/b3" --component python --prefix "$tmp/wheel" >/dev/null || fail "install (SKBUILD)"
check_installed "$tmp/wheel"

configure "$tmp/b4" "$tmp/tree" >"$tmp/b4.log" 2>&1 || { cat "$tmp/b4.log"; fail "configure"; }
"$cmake" --install "$tmp/b4" --component python --prefix "$tmp/prefix" >/dev/null || fail "install"
check_installed "$tmp/prefix/lib/python$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')/site-packages"
echo "python package test: ok"
