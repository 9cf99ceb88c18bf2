#!/usr/bin/env bash
# Same-run comparison of `zinf bench step` between two builds (e.g. a change and the commit
# before it): the median step time per tier, alternated old/new, ROUNDS rounds.
# Usage: bench/compare_step_builds.sh OLD_ZINF NEW_ZINF DIR [ROUNDS=3] [NUMEL=64M]
set -euo pipefail
old=$1 new=$2 dir=$3 rounds=${4:-3} numel=${5:-64M}
mkdir -p "$dir"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for r in $(seq 1 "$rounds"); do
  for tier in cpu nvme; do
    for which in old new; do
      bin=$old; [ "$which" = new ] && bin=$new
      run_dir=$(mktemp -d "$dir/compare-step.XXXXXX")
      "$bin" bench step --tier "$tier" --dir "$run_dir" --numel "$numel" --steps 5 --json \
          > "$work/$tier-$which-$r.json" 2>/dev/null
      rm -rf "$run_dir"
    done
  done
done
python3 - "$work" "$rounds" <<'PY'
import json, statistics, sys
work, rounds = sys.argv[1], int(sys.argv[2])
for tier in ("cpu", "nvme"):
    med = {}
    for which in ("old", "new"):
        steps = [json.load(open(f"{work}/{tier}-{which}-{r}.json"))["step_seconds"]
                 for r in range(1, rounds + 1)]
        med[which] = statistics.median(steps)
        print(f"{tier:4} {which}: step s {' '.join(f'{s:.4f}' for s in steps)} "
              f"(median {med[which]:.4f})")
    print(f"{tier:4} new/old step median ratio {med['new'] / med['old']:.3f}")
PY
