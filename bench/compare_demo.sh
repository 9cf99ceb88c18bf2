#!/usr/bin/env bash
# Same-run comparison of `zinf demo` between two builds (e.g. a commit and the one before it):
# step time, stall share and weights_sha256 per tier, alternated old/new, ROUNDS rounds.
# Usage: bench/compare_demo.sh OLD_ZINF NEW_ZINF DIR [ROUNDS=3] [TIERS="nvme cpu"]
set -euo pipefail
old=$1 new=$2 dir=$3 rounds=${4:-3} tiers=${5:-"nvme cpu"}
mkdir -p "$dir"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for r in $(seq 1 "$rounds"); do
  for tier in $tiers; do
    for which in old new; do
      bin=$old; [ "$which" = new ] && bin=$new
      run_dir=$(mktemp -d "$dir/compare-demo.XXXXXX")
      "$bin" demo --offload "$tier" --dir "$run_dir" --layers 16 --hidden 2048 --steps 12 \
          --json > "$work/$tier-$which-$r.json" 2>/dev/null
      rm -rf "$run_dir"
    done
  done
done
python3 - "$work" "$rounds" "$tiers" <<'PY'
import json, statistics, sys
work, rounds, tiers = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()
for tier in tiers:
    row = {}
    for which in ("old", "new"):
        runs = [json.load(open(f"{work}/{tier}-{which}-{r}.json")) for r in range(1, rounds + 1)]
        row[which] = runs
        steps = [x["step_seconds"] for x in runs]
        stalls = [x["stall_share"] for x in runs]
        shas = {x["weights_sha256"][:12] for x in runs}
        print(f"{tier:5} {which}: step s {' '.join(f'{s:.3f}' for s in steps)} "
              f"(median {statistics.median(steps):.3f}), stall median "
              f"{statistics.median(stalls):.4f}, sha {' '.join(shas)}")
    ratio = (statistics.median(x["step_seconds"] for x in row["new"]) /
             statistics.median(x["step_seconds"] for x in row["old"]))
    print(f"{tier:5} new/old step median ratio {ratio:.3f}")
PY
