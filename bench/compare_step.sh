#!/usr/bin/env bash
# Runs `zinf bench io`, `zinf bench adam` and `zinf bench step` alternately on the same drive
# (io, io, adam, step, io, io, adam, step, ...) and sets each optimizer step against the ideal
# of that round:
#   ideal = max(bytes_read / read_rate + bytes_written / write_rate, adam_seconds)
# with the drive's read and write rates from `bench io` (O_DIRECT, 1 MiB, qd 16, overwrites)
# and the Adam kernel's time for the same element count from `bench adam`. bench io runs twice:
# with fio's footprint (qd x 1 MiB = 16 MiB of buffers, the "fio" columns) and with the
# requests rotating over as much pinned memory as the step's ring (depth x sub-group x 12 B,
# the "ring" columns), since the destination's footprint alone changes the drive's rate on
# virtual disks: on the build VM a 192 MiB footprint read 25% and wrote 10% slower than 16 MiB
# (2.6-2.7 against 3.4-3.65 GB/s, 3.5 against 3.9, alternated). The step cannot have the
# 16 MiB rates, so the ring ideal is the one its target is judged by; both are printed. Prints
# each round, the median ratios (the issue's target: <= 1.15 at 256M elements), and the
# fastest step against the ideal from the fastest reference passes (steadier on a shared host).
# The references here run 10-20 s away from the step they judge; on a disk whose rate moves in
# that time, `zinf bench step --reference` (the same passes and kernel, taken in-process right
# before each step) gives the steadier ratio.
#
# usage: bench/compare_step.sh [--dir DIR] [--numel 256M] [--sub-group 1M] [--depth 4]
#                              [--threads 0] [--steps 5] [--rounds 3] [--zinf PATH] [-- step args]
# Needs python3. The state takes 12 bytes per element on DIR (3 GiB at 256M); the gradients 4
# bytes per element of memory, and bench adam 16 bytes per element.
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
dir=./zinf-scratch
numel=256M
sub_group=1M
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
# The step's ring of buffers: depth sub-groups of 12 bytes per element (its pinned_bytes_peak),
# in whole MiB, at least fio's 16 MiB.
sg=$(python3 -c "import sys; s=sys.argv[1]; m={'K':1<<10,'M':1<<20,'G':1<<30}; print(int(float(s[:-1]))*m[s[-1]] if s[-1] in m else int(float(s)))" "$sub_group")
ring=$(( (depth * sg * 12 + 1048575) / 1048576 * 1048576 ))
ring=$(( ring > 16 * 1048576 ? ring : 16 * 1048576 ))

for r in $(seq 1 "$rounds"); do
  "$zinf" bench io --dir "$dir" --size "$io_size" --block-size 1M --queue-depth 16 --engine uring \
      --op both --loops 2 --json > "$work/io-$r.json"
  "$zinf" bench io --dir "$dir" --size "$io_size" --block-size 1M --queue-depth 16 --engine uring \
      --op both --loops 2 --buffer-bytes "$ring" --json > "$work/ioring-$r.json"
  "$zinf" bench adam --numel "$n" --threads "$threads" --steps 3 --json > "$work/adam-$r.json"
  "$zinf" bench step --dir "$dir" --numel "$n" --sub-group "$sub_group" --depth "$depth" \
      --threads "$threads" --steps "$steps" --engine uring --json "${extra[@]}" > "$work/step-$r.json"
done

python3 - "$work" "$rounds" "$ring" <<'PY'
import json, statistics, sys
work, rounds, ring = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
load = lambda name: json.loads(open(f"{work}/{name}").read())
ios = lambda name: {x["op"]: x for x in (json.loads(l) for l in open(f"{work}/{name}") if l.strip())}
print(f"ideal = max(read/read_rate + written/write_rate, adam); rates from bench io (O_DIRECT, 1 MiB, qd 16) "
      f"over fio's 16 MiB of buffers (fio) and over the step's {ring >> 20} MiB ring (ring); adam from bench adam "
      f"(median of 3); step = median of bench step; GB/s = 1e9 B/s")
print(f"{'round':>5} {'fio r/w GB/s':>12} {'ring r/w GB/s':>13} {'adam s':>7} {'fio ideal':>9} {'ring ideal':>10} "
      f"{'step s':>7} {'read':>6} {'write':>6} {'comp':>6} {'/fio':>6} {'/ring':>6}")
fio_ratios, ring_ratios = [], []
def ideal(step, io, adam_s):
    return max(step["bytes_read"] / (io["read"]["gbps"] * 1e9) + step["bytes_written"] / (io["write"]["gbps"] * 1e9), adam_s)
for r in range(1, rounds + 1):
    io, ior = ios(f"io-{r}.json"), ios(f"ioring-{r}.json")
    adam, step = load(f"adam-{r}.json"), load(f"step-{r}.json")
    fi, ri = ideal(step, io, adam["seconds_per_step"]), ideal(step, ior, adam["seconds_per_step"])
    fio_ratios.append(step["step_seconds"] / fi)
    ring_ratios.append(step["step_seconds"] / ri)
    print(f"{r:>5} {io['read']['gbps']:5.2f}/{io['write']['gbps']:<6.2f} {ior['read']['gbps']:6.2f}/{ior['write']['gbps']:<6.2f} "
          f"{adam['seconds_per_step']:7.3f} {fi:9.3f} {ri:10.3f} {step['step_seconds']:7.3f} {step['read_seconds']:6.3f} "
          f"{step['write_seconds']:6.3f} {step['compute_seconds']:6.3f} {fio_ratios[-1]:6.3f} {ring_ratios[-1]:6.3f}")
mf, mr = statistics.median(fio_ratios), statistics.median(ring_ratios)
# Best against best: on a shared machine interference only ever adds time, so the fastest
# step set against the ideal from the fastest passes of each reference shows what the
# pipeline does when it has the drive and the cores.
best_step = min(min(load(f"step-{r}.json")["step_seconds_all"]) for r in range(1, rounds + 1))
best_adam = min(load(f"adam-{r}.json")["seconds_per_step_min"] for r in range(1, rounds + 1))
def best_rate(prefix, op):
    return max(g for r in range(1, rounds + 1) for x in ios(f"{prefix}-{r}.json").values() if x["op"] == op
               for g in x["gbps_loops"]) * 1e9
step0 = load("step-1.json")
def best_ideal(prefix):
    return max(step0["bytes_read"] / best_rate(prefix, "read") + step0["bytes_written"] / best_rate(prefix, "write"), best_adam)
bf, br = best_ideal("io"), best_ideal("ioring")
print(f"median step/ideal: ring {mr:.3f}, fio {mf:.3f}")
print(f"best step / best ideal: ring {best_step:.3f} / {br:.3f} = {best_step / br:.3f}, "
      f"fio {best_step:.3f} / {bf:.3f} = {best_step / bf:.3f} (adam {best_adam:.3f} s)")
print(json.dumps({"median_ratio_step_to_ideal": round(mr, 4), "ratios": [round(x, 4) for x in ring_ratios],
                  "best_ratio": round(best_step / br, 4), "ring_bytes": ring,
                  "median_ratio_step_to_fio_ideal": round(mf, 4), "fio_ratios": [round(x, 4) for x in fio_ratios],
                  "best_ratio_fio": round(best_step / bf, 4)}))
PY
