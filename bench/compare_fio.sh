#!/usr/bin/env bash
# Runs fio and `zinf bench io` alternately on the same file system with the same pattern
# (sequential, O_DIRECT, 1 MiB blocks, queue depth 16; fio on io_uring with its buffers on huge
# pages, --iomem=shmhuge) and prints each round and the median of the zinf/fio ratios.
#
# usage: bench/compare_fio.sh [--dir DIR] [--size 2G] [--rounds 3] [--zinf PATH] [-- zinf args]
# Needs fio and python3 (scripts/install-deps.sh). As root it raises vm.nr_hugepages for fio's
# buffers during the run and restores it afterwards; otherwise reserve huge pages yourself.
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
dir=./zinf-scratch
size=2G
rounds=3
bs=1M
qd=16
zinf="$src/build/release/tools/zinf"
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --dir) dir=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --zinf) zinf=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "compare_fio.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
command -v fio >/dev/null || { echo "compare_fio.sh: fio not found (scripts/install-deps.sh)" >&2; exit 2; }
[ -x "$zinf" ] || { echo "compare_fio.sh: $zinf not built (cmake --preset release && cmake --build --preset release)" >&2; exit 2; }
mkdir -p "$dir"
fio_file="$dir/compare-fio.dat"
work=$(mktemp -d)
old_hp=$(cat /proc/sys/vm/nr_hugepages)
cleanup() {
  rm -f "$fio_file" "$dir"/zinf-bench-io-*.dat
  rm -rf "$work"
  if [ "$(id -u)" -eq 0 ]; then echo "$old_hp" > /proc/sys/vm/nr_hugepages; fi
}
trap cleanup EXIT
if [ "$(id -u)" -eq 0 ]; then
  # fio's shmhuge buffers: qd x bs = 16 MiB = 8 pages of 2 MiB, with room to spare.
  echo $((old_hp + 64)) > /proc/sys/vm/nr_hugepages
fi

fio_common=(--filename="$fio_file" --size="$size" --bs="$bs" --direct=1 --ioengine=io_uring
            --iodepth="$qd" --numjobs=1 --group_reporting)
# Both programs write their file in full right before each timed pass (zinf bench io calls it
# preconditioning): a read of never-written extents returns zeros without touching the disk, and
# writes are timed as overwrites. Both programs' files are kept until the end (zinf: --keep),
# because deleting gigabytes on a file system mounted with `discard` sends TRIMs that slow down
# whichever program runs next. zinf never reuses a file (each --keep run names a fresh one), so
# its files add up: 2 x rounds x size at the end.
for op in write read; do
  for r in $(seq 1 "$rounds"); do
    fio --name=layout "${fio_common[@]}" --rw=write >/dev/null
    fio --name="$op" "${fio_common[@]}" --rw="$op" --iomem=shmhuge --hugepage-size=2m \
        --output-format=json > "$work/fio-$op-$r.json"
    "$zinf" bench io --dir "$dir" --size "$size" --block-size "$bs" --queue-depth "$qd" \
        --engine uring --op "$op" --loops 1 --keep --json "${extra[@]}" > "$work/zinf-$op-$r.json"
  done
done

python3 - "$work" "$rounds" <<'PY'
import json, statistics, sys
work, rounds = sys.argv[1], int(sys.argv[2])
print("pattern: sequential, O_DIRECT, bs=1 MiB, qd=16; fio io_uring --iomem=shmhuge; GB/s = 1e9 B/s")
print(f"{'op':6} {'round':>5} {'fio GB/s':>9} {'zinf GB/s':>10} {'ratio':>6}")
summary = {}
for op in ("write", "read"):
    ratios = []
    for r in range(1, rounds + 1):
        f = json.load(open(f"{work}/fio-{op}-{r}.json"))
        fio_gbps = f["jobs"][0][op]["bw_bytes"] / 1e9
        z = json.load(open(f"{work}/zinf-{op}-{r}.json"))["jobs"]
        z = [x for x in z if x["op"] == op][0]
        ratios.append(z["gbps"] / fio_gbps)
        print(f"{op:6} {r:>5} {fio_gbps:9.2f} {z['gbps']:10.2f} {ratios[-1]:6.3f}")
    summary[op] = statistics.median(ratios)
for op, m in summary.items():
    print(f"median zinf/fio {op}: {m:.3f}")
print(json.dumps({"median_ratio_" + op: round(m, 4) for op, m in summary.items()}))
PY
