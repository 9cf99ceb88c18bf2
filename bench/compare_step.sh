#!/usr/bin/env bash
# Runs `zinf bench io`, `zinf bench adam` and `zinf bench step` alternately on the same drive
# (io, adam, step, io, adam, step, ...) and sets each optimizer step against the ideal of
# that round:
#   ideal = max(bytes_read / read_rate + bytes_written / write_rate, adam_seconds)
# with the drive's read and write rates from `bench io` (O_DIRECT, 1 MiB, qd 16, overwrites)
# and the Adam kernel's time for the same element count from `bench adam`. Prints each round
# and the median ratio step / ideal (the issue's target: <= 1.15 at 256M elements), and the
# fastest step against the ideal from the fastest reference passes (steadier on a shared host).
#
# usage: bench/compare_step.sh [--dir DIR] [--numel 256M] [--sub-group 4M] [--depth 4]
#                              [--threads 0] [--steps 5] [--rounds 3] [--zinf PATH] [-- step args]
# Needs python3. The state takes 12 bytes per element on DIR (3 GiB at 256M); the gradients 4
# bytes per element of memory, and bench adam 16 bytes per element.
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
dir=./zinf-scratch
numel=256M
sub_group=4M
depth=4
threads=0
steps=5
rounds=3
zinf="$src/build/release/tools/zinf"
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --dir) dir=$2; shift 2 ;;
    --numel) numel=$2; shift 2 ;;
    --sub-group) sub_group=$2; shift 2 ;;
    --depth) depth=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --zinf) zinf=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "compare_step.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -x "$zinf" ] || { echo "compare_step.sh: $zinf not built (cmake --preset release && cmake --build --preset release)" >&2; exit 2; }
command -v python3 >/dev/null || { echo "compare_step.sh: python3 not found" >&2; exit 2; }
mkdir -p "$dir"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The element count in plain digits (bench adam takes no suffixes), and the state's size for
# bench io's file (12 bytes per element, at least 64 MiB).
n=$(python3 -c "import sys; s=sys.argv[1]; m={'K':1<<10,'M':1<<20,'G':1<<30}; print(int(float(s[:-1]))*m[s[-1]] if s[-1] in m else int(float(s)))" "$numel")
io_size=$(( n * 12 > 64 * 1048576 ? n * 12 : 64 * 1048576 ))

for r in $(seq 1 "$rounds"); do
  "$zinf" bench io --dir "$dir" --size "$io_size" --block-size 1M --queue-depth 16 --engine uring \
      --op both --loops 2 --json > "$work/io-$r.json"
  "$zinf" bench adam --numel "$n" --threads "$threads" --steps 3 --json > "$work/adam-$r.json"
  "$zinf" bench step --dir "$dir" --numel "$n" --sub-group "$sub_group" --depth "$depth" \
      --threads "$threads" --steps "$steps" --engine uring --json "${extra[@]}" > "$work/step-$r.json"
done

python3 - "$work" "$rounds" <<'PY'
import json, statistics, sys
work, rounds = sys.argv[1], int(sys.argv[2])
print("ideal = max(read/read_rate + written/write_rate, adam); rates from bench io (O_DIRECT, 1 MiB, qd 16), "
      "adam from bench adam (median of 3); step = median of bench step; GB/s = 1e9 B/s")
print(f"{'round':>5} {'read GB/s':>9} {'write GB/s':>10} {'adam s':>7} {'io s':>6} {'ideal s':>7} "
      f"{'step s':>7} {'read':>6} {'write':>6} {'comp':>6} {'ratio':>6}")
ratios = []
for r in range(1, rounds + 1):
    io = {x["op"]: x for x in (json.loads(l) for l in open(f"{work}/io-{r}.json") if l.strip())}
    adam = json.loads(open(f"{work}/adam-{r}.json").read())
    step = json.loads(open(f"{work}/step-{r}.json").read())
    rr, wr = io["read"]["gbps"] * 1e9, io["write"]["gbps"] * 1e9
    io_s = step["bytes_read"] / rr + step["bytes_written"] / wr
    ideal = max(io_s, adam["seconds_per_step"])
    ratio = step["step_seconds"] / ideal
    ratios.append(ratio)
    print(f"{r:>5} {rr/1e9:9.2f} {wr/1e9:10.2f} {adam['seconds_per_step']:7.3f} {io_s:6.3f} {ideal:7.3f} "
          f"{step['step_seconds']:7.3f} {step['read_seconds']:6.3f} {step['write_seconds']:6.3f} "
          f"{step['compute_seconds']:6.3f} {ratio:6.3f}")
m = statistics.median(ratios)
# Best against best: on a shared machine interference only ever adds time, so the fastest
# step set against the ideal from the fastest passes of each reference shows what the
# pipeline does when it has the drive and the cores.
best_step = min(min(json.loads(open(f"{work}/step-{r}.json").read())["step_seconds_all"]) for r in range(1, rounds + 1))
best_read = max(g for r in range(1, rounds + 1) for x in (json.loads(l) for l in open(f"{work}/io-{r}.json") if l.strip()) if x["op"] == "read" for g in x["gbps_loops"]) * 1e9
best_write = max(g for r in range(1, rounds + 1) for x in (json.loads(l) for l in open(f"{work}/io-{r}.json") if l.strip()) if x["op"] == "write" for g in x["gbps_loops"]) * 1e9
best_adam = min(json.loads(open(f"{work}/adam-{r}.json").read())["seconds_per_step_min"] for r in range(1, rounds + 1))
step0 = json.loads(open(f"{work}/step-1.json").read())
best_ideal = max(step0["bytes_read"] / best_read + step0["bytes_written"] / best_write, best_adam)
print(f"median step/ideal: {m:.3f}")
print(f"best step / best ideal: {best_step:.3f} / {best_ideal:.3f} = {best_step / best_ideal:.3f} "
      f"(read {best_read/1e9:.2f} GB/s, write {best_write/1e9:.2f} GB/s, adam {best_adam:.3f} s)")
print(json.dumps({"median_ratio_step_to_ideal": round(m, 4), "ratios": [round(x, 4) for x in ratios],
                  "best_ratio": round(best_step / best_ideal, 4)}))
PY
