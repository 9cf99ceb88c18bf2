#!/usr/bin/env bash
# Sets up and runs zinf's test suite: installs the Debian packages, checks the layout of the
# changed lines (scripts/check-format.sh), then runs the CMake workflows: `ci` (release build,
# public-header check, every label but python, whose tests run
# once, against the package pip installs, below), `ci-asan` (address +
# undefined sanitizers) and `ci-tsan` (thread sanitizer), the sanitizer ones on the unit,
# contract and fault labels (without the Python module and MPI, whose labels run in the release
# workflow only), and last the aarch64 cross build with its unit and contract labels under
# qemu-user (scripts/test-aarch64.sh; the NEON and SVE paths). The Python tests run on torch
# 2.13.0 in a virtual environment of the machine's python3, against the package pip installed
# there. The release build compiles the CUDA and NCCL code where the CUDA toolkit is (NCCL from
# its wheel); GPU tests skip with a reason where no GPU is visible. The release workflow's
# every label includes `mpi` (the collectives under mpirun; docs/distributed.md).
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

# The reflink tests (reflink_checkpoint_test: save_async cloning records out of the swap
# files) need a file system with FICLONE, which ext4 and tmpfs lack: as root, a 2 GiB sparse
# XFS image under build/ is loop-mounted for the runs and named by ZINF_TEST_REFLINK_DIR, and
# unmounted on exit. Elsewhere those tests skip, and this says why.
reflink_mnt=""
reflink_img=build/reflink-xfs.img
cleanup_reflink() {
  if [ -n "$reflink_mnt" ]; then
    umount "$reflink_mnt" 2>/dev/null || echo "test.sh: could not unmount $reflink_mnt" >&2
    rmdir "$reflink_mnt" 2>/dev/null || true
  fi
  rm -f "$reflink_img"
}
setup_reflink() {
  if [ "$(id -u)" -ne 0 ]; then
    echo "test.sh: not root: no XFS loop mount, the reflink tests will skip" >&2; return
  fi
  if ! command -v mkfs.xfs >/dev/null; then
    echo "test.sh: no mkfs.xfs (xfsprogs): the reflink tests will skip" >&2; return
  fi
  mkdir -p build
  local mnt
  mnt=$(mktemp -d "$PWD/build/reflink-mnt.XXXXXX")
  rm -f "$reflink_img"
  if ! truncate -s 2G "$reflink_img" || ! mkfs.xfs -q -m reflink=1 "$reflink_img" ||
     ! mount -o loop "$reflink_img" "$mnt"; then
    echo "test.sh: cannot make or loop-mount an XFS image (a container without loop" \
         "devices?): the reflink tests will skip" >&2
    rmdir "$mnt" 2>/dev/null || true
    rm -f "$reflink_img"
    return
  fi
  reflink_mnt=$mnt
  trap cleanup_reflink EXIT
  export ZINF_TEST_REFLINK_DIR="$mnt"
  echo "test.sh: reflink tests run in $mnt (XFS, loop-mounted)"
}
setup_reflink

# The layout of the lines changed since .ci/format-base (seconds; before any build). It needs
# the history back to that commit: a clone without it (shallow, or no git) says so and goes on.
echo "== format of the changed lines"
if git rev-parse --git-dir >/dev/null 2>&1 &&
   git cat-file -e "$(tr -d '[:space:]' < .ci/format-base)^{commit}" 2>/dev/null; then
  scripts/check-format.sh
else
  echo "test.sh: NOT CHECKED: the format of the changed lines (no git history back to" \
       ".ci/format-base in this checkout)" >&2
fi

# NCCL for the release build's NCCL communicator (cuda/src/nccl_communicator.cc), where the
# CUDA toolkit is: Debian has no NCCL for CUDA 13, so NVIDIA's nvidia-nccl-cu13 wheel (its header
# and libnccl.so.2; pinned: a file on the machine's disk, 242 MB unpacked, about 30 s) goes into
# build/nccl, named by NCCL_ROOT (cmake/ZinfDependencies.cmake) for the `ci` workflow only: the
# sanitizer builds gain nothing from it without a GPU. The GPU tests skip with the reason.
nccl_root=""
if command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; then
  nccl_root=$PWD/build/nccl/nvidia/nccl
  if [ ! -f "$nccl_root/include/nccl.h" ]; then
    echo "== NCCL: nvidia-nccl-cu13 into build/nccl"
    python3 -m pip install --quiet --root-user-action=ignore --no-deps --target build/nccl nvidia-nccl-cu13==2.30.7
  fi
fi

workflows=(ci ci-asan ci-tsan)
[ "$quick" = 1 ] && workflows=(ci)
for w in "${workflows[@]}"; do
  echo "== workflow: $w"
  if [ "$w" = ci ] && [ -n "$nccl_root" ]; then
    # libzinf.so records libnccl.so.2 as NEEDED and carries no RPATH (docs/package.md): the
    # package test links and runs a consumer of the installed copy, so the loader (and the
    # linker, for a library's NEEDED) must find it, as a user's ld.so.conf would.
    NCCL_ROOT=$nccl_root LD_LIBRARY_PATH=$nccl_root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
      cmake --workflow --preset "$w"
  else
    cmake --workflow --preset "$w"
  fi
  if [ "$w" = ci ]; then
    # The CUDA toolkit is here and NCCL was installed above: a build without the NCCL
    # communicator would drop its code from CI without a word.
    if [ -n "$nccl_root" ] && ! grep -q 'ZINF_HAVE_NCCL 1' build/release/generated/zinf/config.h; then
      echo "test.sh: NCCL is in $nccl_root but the release build has no NCCL (ZINF_WITH_NCCL)" >&2
      exit 1
    fi
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

# pip's door (pyproject.toml), as a PyTorch user meets it: a virtual environment of the
# machine's python3 (CPython 3.11) with torch 2.13.0 and what tests/python imports, pinned.
# torch is pinned exactly: the machine holds that CPU wheel, while an open range would download
# a CUDA build of several GB. The package is installed with build isolation from the module
# build/release made (ZINF_PYTHON_FROM_BUILD, cmake/ZinfPython.cmake: nothing compiles twice;
# both interpreters are CPython 3.11, one extension suffix), imported from / and the Python
# tests run once against the installed copy.
echo "== Python: pip install into a virtual environment with torch 2.13.0"
venv=$(mktemp -d "${TMPDIR:-/tmp}/zinf-venv.XXXXXX")
trap 'rm -rf "$venv"; cleanup_reflink' EXIT
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet torch==2.13.0 pytest==9.1.1 numpy==2.3.5 mypy==2.4.0
"$venv/bin/pip" install --quiet -C build-dir="$venv/build" \
  -C cmake.define.ZINF_PYTHON_FROM_BUILD="$PWD/build/release" .
repo=$PWD
(cd / && "$venv/bin/python" -c 'import torch, zinf, zinf.torch, zinf.compat.deepspeed; print("installed:", zinf.__file__, "torch", torch.__version__)')
(cd / && ZINF_BIN="$repo/build/release/tools/zinf" PYTHONDONTWRITEBYTECODE=1 \
  "$venv/bin/python" -m pytest -q -p no:cacheprovider "$repo/tests/python")

# The low end of the supported torch range (1.13, Debian's python3-torch), in seconds rather
# than a second run of the suite: the build tree's package, one AdamW step with its state on
# NVMe files against torch's own AdamW (to the kernel's rounding, as tests/python does).
echo "== Python: one AdamW step on Debian's torch"
(cd / && PYTHONPATH="$repo/build/release/python" PYTHONDONTWRITEBYTECODE=1 /usr/bin/python3 - "$venv" <<'PY'
import sys, torch, zinf.torch as zt
g = torch.Generator().manual_seed(1)
p = torch.nn.Parameter(torch.randn(1 << 16, generator=g))
q = torch.nn.Parameter(p.detach().clone())
p.grad = torch.randn(1 << 16, generator=g)
q.grad = p.grad.clone()
zt.AdamW([p], lr=1e-3, state="nvme", nvme_path=sys.argv[1]).step()
torch.optim.AdamW([q], lr=1e-3).step()
assert torch.allclose(p, q, rtol=2e-5, atol=1e-7), (p - q).abs().max().item()
print("torch", torch.__version__, ": zinf.torch.AdamW (state on NVMe) steps as torch.optim.AdamW")
PY
)

if [ "$quick" = 0 ]; then
  echo "== aarch64: cross build, unit and contract labels under qemu-user"
  scripts/test-aarch64.sh
fi
