#!/usr/bin/env bash
# The program output docs/demo.md quotes under "Sample output" is what the build prints: every
# step line's loss and the weights' hash, from the default demo (--offload none gives the nvme
# run's losses and hash bit for bit, in less time). Fails when the sample or the program
# changes without the other.
# Usage: doc_samples_test.sh ZINF_BINARY DOCS_DEMO_MD
set -euo pipefail
zinf=$(realpath "$1")
doc=$(realpath "$2")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
sample=$(sed -n '/^## Sample output/,/^## /p' "$doc")
out=$("$zinf" demo --offload none --every 5 2>&1)
# "step   30/50  loss 0.006539 ..." -> "30 0.006539"
losses() { sed -n 's/^step *\([0-9]*\)\/[0-9]*  loss \([0-9.e+-]*\).*/\1 \2/p'; }
want=$(losses <<<"$sample")
got=$(losses <<<"$out")
[ -n "$want" ] || { echo "doc_samples_test: no step lines in $doc's sample" >&2; exit 1; }
while read -r step loss; do
  line=$(grep "^$step " <<<"$got" || true)
  if [ "$line" != "$step $loss" ]; then
    echo "doc_samples_test: $doc says step $step loss $loss, the build prints '${line:-nothing}'" >&2
    exit 1
  fi
done <<<"$want"
want_hash=$(grep -m1 '^weights_sha256 ' <<<"$sample" || true)
got_hash=$(grep -m1 '^weights_sha256 ' <<<"$out" || true)
if [ -z "$want_hash" ] || [ "$want_hash" != "$got_hash" ]; then
  echo "doc_samples_test: $doc says '$want_hash', the build prints '$got_hash'" >&2
  exit 1
fi
echo "doc_samples_test: $(wc -l <<<"$want") step lines and the weights' hash match $doc"
