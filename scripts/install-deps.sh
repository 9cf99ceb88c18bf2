#!/usr/bin/env bash
# Installs the Debian packages zinf builds and tests with (Debian 12 / Ubuntu 22.04+).
# Skips apt-get entirely when everything is already there, so it is cheap to call every time.
set -euo pipefail

# The Python package (python/) builds in the CMake build with pybind11 for Debian's
# interpreter, whose torch `ctest -L python` uses: python3-dev, pybind11-dev, python3-torch,
# python3-pytest; scripts/test.sh makes a virtual environment of the python3 first on PATH
# for torch 2.13 from PyPI: python3-venv, where that python3 is Debian's; its type stubs
# (scripts/gen-stubs.sh, tests/python/test_stubs.py): python3-mypy. The
# collectives layer's MPI adapter builds against Open MPI's C bindings and its tests run under
# mpirun:
# libopenmpi-dev, openmpi-bin. scripts/test.sh makes an XFS image (xfsprogs: mkfs.xfs) for the
# reflink checkpoint tests.
# Usage: scripts/install-deps.sh [--aarch64]
#   --aarch64  also what scripts/test-aarch64.sh needs: Debian's aarch64 cross compiler, qemu-user
#              to run its tests, and GoogleTest's sources (built for the target; the host's
#              libgtest-dev is x86-64 only).
packages=(build-essential cmake ninja-build pkg-config liburing-dev libboost-dev
          libgtest-dev libbenchmark-dev nlohmann-json3-dev nettle-dev libcli11-dev fio python3
          python3-dev pybind11-dev python3-torch python3-pytest python3-venv python3-mypy
          libopenmpi-dev openmpi-bin xfsprogs clang-format)
aarch64_packages=(g++-aarch64-linux-gnu qemu-user googletest)
case "${1:-}" in
  "") ;;
  --aarch64) packages+=("${aarch64_packages[@]}") ;;
  *) echo "install-deps: unknown argument '$1' (usage: install-deps.sh [--aarch64])" >&2; exit 2 ;;
esac
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  sudo="sudo"
fi
echo "install-deps: installing ${missing[*]}" >&2
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
