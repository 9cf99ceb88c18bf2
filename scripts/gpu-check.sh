#!/usr/bin/env bash
# The GPU checks, for a machine with an NVIDIA GPU and a release build: the CUDA contract suite,
# the one-rank NCCL collectives, the CUDA check macros, the Python CUDA cases (the drop-in,
# offload_parameters, train_gpt --device cuda with --params nvme and memory), then
# `zinf bench prefetch` on the GPU
# (depth 2 and on demand, 3 rounds alternated) and once on the host simulation for comparison.
# Usage: scripts/gpu-check.sh [BUILD_DIR (build/release)] [SCRATCH_DIR (./zinf-scratch)]
# The binaries may be copied to another machine: BUILD_DIR may also be a flat folder holding
# zinf and the test programs. Prints the tests' summaries and one JSON line per bench run.
set -uo pipefail
build=${1:-build/release}
scratch=${2:-./zinf-scratch}
find_bin() {  # a program in BUILD_DIR's layout or flat in BUILD_DIR
  for p in "$build/$1" "$build/$(basename "$1")"; do [ -x "$p" ] && { echo "$p"; return; }; done
  echo "gpu-check: $(basename "$1") not found under $build" >&2; echo false
}
if ! nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; then
  echo "gpu-check: no NVIDIA GPU here (nvidia-smi failed); the GPU tests would only skip" >&2
  exit 2
fi
mkdir -p "$scratch"
export ZINF_TEST_DIR=${ZINF_TEST_DIR:-$scratch}
status=0
for t in tests/cuda/device_contract_gpu_test tests/cuda/communicator_gpu_test \
         tests/cuda/make_device_test tests/cuda/cuda_check_test; do
  echo "=== $(basename $t)"
  "$(find_bin $t)" --gtest_color=no --gtest_brief=1 || status=1
done
if [ -d "$build/python/zinf" ]; then
  echo "=== python: the DeepSpeed drop-in and offload_parameters with CUDA tensors"
  PYTHONPATH="$build/python" /usr/bin/python3 -m pytest -q -p no:cacheprovider \
    tests/python/test_aio_compat.py tests/python/test_param_offload.py -k cuda || status=1
  echo "=== python: train_gpt on CUDA, --params nvme against --params memory, 3 rounds"
  for round in 1 2 3; do
    for params in memory nvme; do
      d=$(mktemp -d "$scratch/gpt.XXXXXX")
      PYTHONPATH="$build/python" /usr/bin/python3 examples/torch/train_gpt.py --device cuda \
        --dir "$d" --steps 20 --quiet --params "$params" --state cpu --json "$d.json" || status=1
      echo "round=$round params=$params $(cat "$d.json" 2>/dev/null)"
      rm -rf "$d" "$d.json"
    done
  done
fi
zinf=$(find_bin tools/zinf)
for round in 1 2 3; do
  devices=cuda; [ "$round" = 1 ] && devices="cuda host"
  for device in $devices; do
    for depth in 2 0; do
      echo "=== round=$round device=$device depth=$depth"
      "$zinf" bench prefetch --dir "$scratch" --device "$device" --depth "$depth" --passes 3 \
        --layers 48 --layer-bytes 32M --json || status=1
    done
  done
done
exit $status
