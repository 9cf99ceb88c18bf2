#!/usr/bin/env bash
# Several nodes simulated on one machine (scripts/multinode.sh: a network namespace and a
# node-local drive per node, MPI over TCP only): the data-parallel demo across 2 and 3 nodes
# ends with the weights of the same ranks on one node; a sharded checkpoint saved on
# node-local drives keeps each rank's folder on its own node and resumes at the same world
# size as on one node; a load at another world size, or of node-local copies from different
# saves, fails on every rank before loading anything, naming what is missing or different;
# every namespace and link is gone afterwards, also after an interrupted run.
# Usage: multinode_test.sh ZINF_BINARY MULTINODE_SH MPIRUN...   (exit 77: skipped, with why)
set -uo pipefail
zinf=$(realpath "$1")
harness=$(realpath "$2")
shift 2
mpirun_cmd=("$@")
[ "$(id -u)" -eq 0 ] || { echo "multinode_test: skipped: not root" >&2; exit 77; }
command -v ip >/dev/null || { echo "multinode_test: skipped: no 'ip'" >&2; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
drive=/tmp/zinf-node-drive
fail() { echo "multinode_test: FAILED: $*" >&2; exit 1; }
hash_of() { grep -m1 '^weights_sha256 ' "$1" | cut -d' ' -f2; }
links_before=$(ip -o link show | wc -l)
ns_before=$(ip netns list | wc -l)

nodes() {  # nodes N OUT [harness options...] -- demo args...
  local n=$1 out=$2
  shift 2
  "$harness" --nodes "$n" --timeout 90 "$@" >"$out" 2>&1
}
one_node() {  # one_node N OUT demo args...
  local n=$1 out=$2
  shift 2
  "${mpirun_cmd[@]}" -np "$n" "$zinf" demo "$@" >"$out" 2>&1
}

# 1. Two nodes against two ranks on one node, saving a checkpoint; then a resume of each.
nodes 2 n2.txt --keep-drives kept -- "$zinf" demo --offload nvme --dir "$drive" --steps 4 \
  --save "$drive/ck"
rc=$?
[ $rc -eq 77 ] && { cat n2.txt >&2; exit 77; }
[ $rc -eq 0 ] || { cat n2.txt >&2; fail "the 2-node demo exited $rc"; }
mkdir -p shared
one_node 2 o2.txt --offload nvme --dir shared --steps 4 --save shared/ck ||
  { cat o2.txt >&2; fail "the 1-node 2-rank demo failed"; }
[ -n "$(hash_of n2.txt)" ] && [ "$(hash_of n2.txt)" = "$(hash_of o2.txt)" ] ||
  fail "2 nodes ended with $(hash_of n2.txt), 2 ranks on one node with $(hash_of o2.txt)"
# Each rank's folder on its own node only; the commit record on rank 0's.
[ -d kept/node0/ck/rank0 ] && [ -f kept/node0/ck/zinf-sharded ] && [ ! -e kept/node0/ck/rank1 ] &&
  [ -d kept/node1/ck/rank1 ] && [ ! -e kept/node1/ck/rank0 ] && [ ! -e kept/node1/ck/zinf-sharded ] ||
  { find kept >&2; fail "the checkpoint's folders are not node-local as expected"; }
nodes 2 r2.txt --drives-from kept -- "$zinf" demo --offload nvme --dir "$drive" --steps 2 \
  --resume "$drive/ck" || { cat r2.txt >&2; fail "resuming on 2 nodes from node-local drives failed"; }
one_node 2 ro2.txt --offload nvme --dir shared --steps 2 --resume shared/ck ||
  { cat ro2.txt >&2; fail "resuming on one node failed"; }
grep -q "resumed from the checkpoint" r2.txt || fail "the 2-node run did not resume"
[ "$(hash_of r2.txt)" = "$(hash_of ro2.txt)" ] ||
  fail "resumed on 2 nodes: $(hash_of r2.txt), on one node: $(hash_of ro2.txt)"

# 2. Three nodes against three ranks on one node.
nodes 3 n3.txt -- "$zinf" demo --offload nvme --dir "$drive" --steps 3 --batch 24 ||
  { cat n3.txt >&2; fail "the 3-node demo failed"; }
one_node 3 o3.txt --offload nvme --dir shared --steps 3 --batch 24 ||
  { cat o3.txt >&2; fail "the 1-node 3-rank demo failed"; }
[ "$(hash_of n3.txt)" = "$(hash_of o3.txt)" ] ||
  fail "3 nodes ended with $(hash_of n3.txt), 3 ranks on one node with $(hash_of o3.txt)"

# 3. The 2-node checkpoint loaded by 3 nodes: node 2 has no copy. Every rank fails before
# loading; the rank that lacks it names the folder.
if nodes 3 w3.txt --drives-from kept -- "$zinf" demo --offload nvme --dir "$drive" --steps 1 \
    --batch 24 --resume "$drive/ck"; then
  fail "a 3-node load of a checkpoint only 2 nodes hold succeeded"
fi
grep -q "open directory failed: $drive/ck: No such file or directory" w3.txt &&
  grep -q "ShardedEngine::load failed: 1 of 3 ranks failed (rank 2); this rank (0) did not" w3.txt ||
  { cat w3.txt >&2; fail "the 3-node load did not say which rank lacks the checkpoint"; }
grep -q "^step" w3.txt && fail "the 3-node load trained"

# 4. Node-local copies from different saves: node 1's drive holds another run's checkpoint.
nodes 2 other.txt --keep-drives other -- "$zinf" demo --offload nvme --dir "$drive" --steps 2 \
  --seed 9 --save "$drive/ck" || { cat other.txt >&2; fail "the second save failed"; }
mkdir -p mixed && cp -a kept/node0 mixed/node0 && cp -a other/node1 mixed/node1 &&
  cp other/node0/ck/zinf-sharded mixed/node1/ck/zinf-sharded
if nodes 2 mixed.txt --drives-from mixed -- "$zinf" demo --offload nvme --dir "$drive" \
    --steps 1 --resume "$drive/ck"; then
  fail "a load of node-local copies of different saves succeeded"
fi
grep -q "the ranks see different checkpoints at $drive/ck: $drive/ck/zinf-sharded on rank 1 is not rank 0.s" mixed.txt ||
  { cat mixed.txt >&2; fail "mixed saves were not refused naming the rank"; }
grep -q "^step" mixed.txt && fail "the mixed load trained"

# 5. Nothing of the nodes is left, also after a run interrupted mid-job.
"$harness" --nodes 2 -- "$zinf" demo --offload nvme --dir "$drive" --steps 500 >int.txt 2>&1 &
pid=$!
sleep 4
kill -TERM $pid
wait $pid
[ "$(ip -o link show | wc -l)" = "$links_before" ] && [ "$(ip netns list | wc -l)" = "$ns_before" ] ||
  { ip -o link show >&2; ip netns list >&2; fail "namespaces or links were left behind"; }
echo "multinode_test: 2 and 3 nodes match one node; node-local checkpoints resume; bad loads refused; nothing left"
