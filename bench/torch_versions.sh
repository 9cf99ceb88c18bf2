#!/usr/bin/env bash
# The Python figures on two torches, alternated round by round on the same machine: Debian's
# python3-torch 1.13 (/usr/bin/python3) and torch 2.13 from PyPI (a venv's python), each running
# the same zinf module (build/release/python; both interpreters are CPython 3.11, one ABI).
# Per round and torch: the matmul rate (1024x4096 @ 4096x1024 fp32, the torch's own BLAS),
# `python -m zinf.bench adam|save|activations|aio` (each a ratio against its reference in the same
# process), and examples/torch/train_gpt.py with --params memory then nvme (step time and peak
# RSS from /usr/bin/time -v). One JSON file per run under OUT; the summary table is printed last.
# Usage: bench/torch_versions.sh VENV_PYTHON DIR OUT [ROUNDS]
#   DIR: a directory on the drive to measure (scratch files go there and are removed)
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 3 ] || { echo "usage: bench/torch_versions.sh VENV_PYTHON DIR OUT [ROUNDS]" >&2; exit 2; }
venv_py=$1 dir=$2 out=$3 rounds=${4:-3}
mkdir -p "$out" "$dir"
export PYTHONPATH=$PWD/build/release/python ZINF_BIN=$PWD/build/release/tools/zinf
declare -A py=([t113]=/usr/bin/python3 [t213]=$venv_py)
matmul='import json, time, torch
a = torch.randn(1024, 4096); b = torch.randn(4096, 1024); a @ b
t = []
for _ in range(5):
    t0 = time.perf_counter(); a @ b; t.append(time.perf_counter() - t0)
t.sort(); print(json.dumps({"torch": torch.__version__, "threads": torch.get_num_threads(),
                            "gflops": 2 * 1024 * 4096 * 1024 / t[2] / 1e9}))'
run() {  # run NAME TORCH CMD...: stdout to OUT/NAME.TORCH.rROUND.json
  local name=$1 t=$2; shift 2
  "$@" > "$out/$name.$t.r$r.json" 2> "$out/$name.$t.r$r.err" ||
    { echo "torch_versions: $name on $t failed (round $r): $out/$name.$t.r$r.err" >&2; return 1; }
}
gpt() {  # gpt TORCH PARAMS: train_gpt's losses/steps JSON plus the peak RSS
  local t=$1 p=$2 d
  d=$(mktemp -d "$dir/gpt.XXXXXX")
  /usr/bin/time -v "${py[$t]}" examples/torch/train_gpt.py --dir "$d" --steps 6 --quiet \
    --params "$p" --state nvme --json "$out/gpt-$p.$t.r$r.json" 2> "$out/gpt-$p.$t.r$r.err" >/dev/null
  rm -rf "$d"
}
for r in $(seq 1 "$rounds"); do
  order=(t113 t213); [ $((r % 2)) = 0 ] && order=(t213 t113)
  for t in "${order[@]}"; do
    echo "round $r: $t" >&2
    run matmul "$t" "${py[$t]}" -c "$matmul"
    run adam "$t" "${py[$t]}" -m zinf.bench adam --numel 20M --rounds 3
    run save "$t" "${py[$t]}" -m zinf.bench save --dir "$dir" --size 256Mi --rounds 1 --fio off
    run activations "$t" "${py[$t]}" -m zinf.bench activations --dir "$dir" --rounds 1
    run aio "$t" "${py[$t]}" -m zinf.bench aio --dir "$dir" --size 256Mi --rounds 1
    gpt "$t" memory
    gpt "$t" nvme
  done
done
/usr/bin/python3 - "$out" <<'PY'
import glob, json, os, re, statistics, sys
out = sys.argv[1]
def med(xs): return statistics.median(xs) if xs else float("nan")
def load(pat):
    docs = {}
    for f in sorted(glob.glob(os.path.join(out, pat))):
        t = f.split(".")[-3]
        try:
            docs.setdefault(t, []).append(json.load(open(f)))
        except ValueError:
            pass
    return docs
def rss(t, p):
    xs = []
    for f in glob.glob(os.path.join(out, f"gpt-{p}.{t}.r*.err")):
        m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", open(f).read())
        if m: xs.append(int(m.group(1)) / 1e6)
    return med(xs)
rows = [("matmul GFLOP/s", lambda d: d["gflops"], "matmul"),
        ("AdamW torch / zinf time (zinf.bench adam, 20M)", lambda d: d["median_speedup"], "adam"),
        ("torch.save plain / FastFileWriter time (256 MiB)", lambda d: d["median_ratio"] if "median_ratio" in d else d.get("median_speedup"), "save"),
        ("activations offload / plain time", lambda d: d["median_ratio"], "activations"),
        ("drop-in aio write / zinf bench io", lambda d: d["median_write_ratio"] if "median_write_ratio" in d else float("nan"), "aio"),
        ("drop-in aio read / zinf bench io", lambda d: d["median_read_ratio"] if "median_read_ratio" in d else float("nan"), "aio")]
print("| figure | torch 1.13 (Debian) | torch 2.13 (PyPI) |\n|---|---|---|")
for label, get, name in rows:
    docs = load(f"{name}.*.r*.json")
    cells = []
    for t in ("t113", "t213"):
        vals = []
        for d in docs.get(t, []):
            try: vals.append(float(get(d)))
            except (KeyError, TypeError): pass
        cells.append(" ".join(f"{v:.3g}" for v in vals) + (f" **{med(vals):.3g}**" if vals else ""))
    print(f"| {label} | {cells[0]} | {cells[1]} |")
for p in ("memory", "nvme"):
    cells = []
    for t in ("t113", "t213"):
        docs = load(f"gpt-{p}.{t}.r*.json").get(t, [])
        steps = [med(d["step_seconds"][1:]) for d in docs if d.get("step_seconds")]
        cells.append(f"{med(steps):.3g} s/step, peak RSS {rss(t, p):.2f} GB")
    print(f"| train_gpt --params {p} --state nvme | {cells[0]} | {cells[1]} |")
PY
