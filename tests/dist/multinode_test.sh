#!/usr/bin/env bash
# Several nodes simulated on one machine (scripts/multinode.sh: a network namespace, a host
# name and a node-local drive per node, MPI over TCP only): the data-parallel demo across 2 and
# 3 nodes ends with the weights of the same ranks on one node; each rank reads and writes only
# its own 1/N of the state, the bytes `zinf plan --nodes N` gives per node; a sharded
# checkpoint saved on node-local drives keeps each rank's folder on its own node and resumes
# at the same world size as on one node; a load at another world size, or of node-local copies
# from different saves, fails on every rank before loading anything, naming what is missing
# or different (the "same file system" error); a node lost mid-step fails every other rank
# within the collectives' timeout naming the lost rank, and leaves the checkpoint it resumed
# from as it was; zinf.distributed over torch.distributed's gloo across 3 nodes is bitwise one
# process; every namespace, link and file is gone afterwards, also after an interrupted run.
# Usage: multinode_test.sh ZINF_BINARY MULTINODE_SH MPIRUN...   (exit 77: skipped, with why)
set -uo pipefail
here=$(dirname "$(realpath "$0")")
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
state_before=$(ls -d "${TMPDIR:-/tmp}"/zinf-multinode.* 2>/dev/null | wc -l)
drive_before=$([ -e "$drive" ] && echo yes)

# bytes_match JSON N: the demo's --json summary in JSON (rank 0's stdout) gives every rank's NVMe
# bytes in its last step; each rank must move what `zinf plan` gives one node of N with one
# rank (stage 3, parameters and optimizer state on NVMe), which is 1/N of one rank's: writes
# W = (P + O) x params / N within 1% (the stores pad each slice to their alignment); reads at
# most R = (2P + O) x params / N (+1%), the plan's figure, which reads every parameter slice
# twice a step, and at least W, one read of each: the engine's prefetch may still hold a
# slice from the forward pass when the backward pass needs it (more of them the smaller the
# slices), and then does not read it again.
bytes_match() {
  local out=$1 n=$2 json params plan
  json=$(grep -a -m1 -o '{"command":"demo".*}' "$out") || { echo "no JSON summary in $out"; return 1; }
  params=$(echo "$json" | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["parameters"])')
  plan=$("$zinf" plan --params "$params" --nodes "$n" --gpus-per-node 1 --offload-optimizer nvme \
    --offload-params nvme --json) || { echo "zinf plan failed"; return 1; }
  /usr/bin/python3 - "$json" "$plan" "$n" <<'PY'
import json, sys
demo, plan, n = json.loads(sys.argv[1]), json.loads(sys.argv[2]), int(sys.argv[3])
setup = plan["setups"][0]
want = {"read": setup["nvme_read_bytes_per_step_per_node"],
        "written": setup["nvme_write_bytes_per_step_per_node"]}
bounds = {"read": (0.99 * want["written"], 1.01 * want["read"]),
          "written": (0.99 * want["written"], 1.01 * want["written"])}
ok = True
for what in ("read", "written"):
    got = demo["rank_step_nvme_bytes_" + what]
    if len(got) != n:
        print(f"{len(got)} ranks' bytes {what}, expected {n}"); ok = False; continue
    low, high = bounds[what]
    for rank, b in enumerate(got):
        print(f"rank {rank} of {n}: {what} {b} bytes in its last step (zinf plan per node: "
              f"{want[what]:.0f})", file=sys.stderr)
        if not low <= b <= high:
            print(f"rank {rank} {what} {b} bytes in its last step, not in [{low:.0f}, {high:.0f}] "
                  f"(zinf plan per node of {n}: read {want['read']:.0f}, written "
                  f"{want['written']:.0f})"); ok = False
sys.exit(0 if ok else 1)
PY
}

nodes() {  # nodes N OUT [harness options...] -- demo args...
  local n=$1 out=$2
  shift 2
  "$harness" --nodes "$n" --timeout 90 "$@" >"$out" 2>&1
}
# The same with stdout (the demo's --json summary) in a file of its own: mpirun forwards the
# ranks' stdout and stderr separately, and in one file a long JSON line could be cut by
# another stream's output (seen once in 22 runs).
nodes_json() {  # nodes_json N OUT JSON [harness options...] -- demo args...
  local n=$1 out=$2 json=$3
  shift 3
  "$harness" --nodes "$n" --timeout 90 "$@" >"$json" 2>"$out"
}
one_node() {  # one_node N OUT demo args...
  local n=$1 out=$2
  shift 2
  "${mpirun_cmd[@]}" -np "$n" "$zinf" demo "$@" >"$out" 2>&1
}

# 1. Two nodes against two ranks on one node, saving a checkpoint; then a resume of each.
nodes_json 2 n2.txt n2.json --keep-drives kept -- "$zinf" demo --offload nvme --dir "$drive" \
  --steps 4 --save "$drive/ck" --json
rc=$?
[ $rc -eq 77 ] && { cat n2.txt >&2; exit 77; }
[ $rc -eq 0 ] || { cat n2.txt >&2; fail "the 2-node demo exited $rc"; }
mkdir -p shared
one_node 2 o2.txt --offload nvme --dir shared --steps 4 --save shared/ck ||
  { cat o2.txt >&2; fail "the 1-node 2-rank demo failed"; }
[ -n "$(hash_of n2.txt)" ] && [ "$(hash_of n2.txt)" = "$(hash_of o2.txt)" ] ||
  fail "2 nodes ended with $(hash_of n2.txt), 2 ranks on one node with $(hash_of o2.txt)"
why=$(bytes_match n2.json 2) || fail "2 nodes: $why"
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

# 2. Three nodes against three ranks on one node, saving a checkpoint for case 5.
nodes_json 3 n3.txt n3.json --keep-drives kept3 -- "$zinf" demo --offload nvme --dir "$drive" --steps 3 \
  --batch 24 --save "$drive/ck" --json || { cat n3.txt >&2; fail "the 3-node demo failed"; }
one_node 3 o3.txt --offload nvme --dir shared --steps 3 --batch 24 ||
  { cat o3.txt >&2; fail "the 1-node 3-rank demo failed"; }
[ "$(hash_of n3.txt)" = "$(hash_of o3.txt)" ] ||
  fail "3 nodes ended with $(hash_of n3.txt), 3 ranks on one node with $(hash_of o3.txt)"
why=$(bytes_match n3.json 3) || fail "3 nodes: $why"

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
# The "same file system" error, for real: rank 1 sees another commit record at the same path.
grep -q "the ranks see different checkpoints at $drive/ck: $drive/ck/zinf-sharded on rank 1 is not rank 0.s (is it the same file system on every node, or are the node-local copies from different saves?)" mixed.txt ||
  { cat mixed.txt >&2; fail "mixed saves were not refused naming the rank and the file system"; }
grep -q "^step" mixed.txt && fail "the mixed load trained"

# 5. Node 1 of 3 lost mid-step: its link down, its processes killed, while the job trains from
# the 3-node checkpoint (and would save over it at the end). Ranks 0 and 2 each fail in a
# collective once its timeout (10 s) has passed, naming rank 1 as the peer that did not answer;
# no rank is left running (bounded waits: a hang fails the test). mpirun itself keeps waiting
# for the lost node's daemon, as it would for a machine gone from the network, until the job is
# ended. The checkpoint on every node's drive is then byte for byte what it was, and loads.
"$harness" --nodes 3 --timeout 150 --drives-from kept3 --keep-drives lost -- "$zinf" demo \
  --offload nvme --dir "$drive" --steps 100000 --batch 24 --resume "$drive/ck" \
  --save "$drive/ck" --collective-timeout 10s >lost.txt 2>&1 &
job=$!
for _ in $(seq 600); do grep -aq "step    2/" lost.txt && break; sleep 0.2; done
grep -aq "step    2/" lost.txt || { kill -TERM $job; wait $job; cat lost.txt >&2; fail "the job to lose a node did not train"; }
ip link set "zt${job}v1" down && kill -KILL $(ip netns pids "zt${job}n1") ||
  { kill -TERM $job; wait $job; fail "could not take node 1 away"; }
for _ in $(seq 300); do  # 60 s: twice the timeout and the probe, and room for a loaded machine
  [ "$(grep -ac "zinf demo: error" lost.txt)" -ge 2 ] && break
  sleep 0.2
done
survivors_left() {  # the zinf processes of nodes 0 and 2
  local r p
  for r in 0 2; do
    for p in $(ip netns pids "zt${job}n$r"); do
      [ "$(cat /proc/$p/comm 2>/dev/null)" = zinf ] && echo -n " $p"
    done
  done
}
# After its error a rank aborts the job (MPI_Abort), which ends the ranks of every node still
# reachable.
for _ in $(seq 300); do [ -z "$(survivors_left)" ] && break; sleep 0.2; done
left=$(survivors_left)
kill -TERM $job
wait $job
for r in 0 2; do
  grep -aq "zinf demo: error: .* failed: .*engine=mpi: rank $r of 3: timed out after 10000 ms waiting for the other ranks in [a-z_]*; rank 1 did not answer a liveness probe" lost.txt ||
    { cat lost.txt >&2; fail "rank $r did not fail naming the lost rank 1"; }
done
[ -z "$left" ] || fail "ranks of nodes 0 and 2 still ran 60 s after their errors (pids$left)"
for r in 0 1 2; do
  diff -r "kept3/node$r/ck" "lost/node$r/ck" >&2 ||
    fail "node $r's checkpoint changed while its job lost node 1"
done
nodes 3 back.txt --drives-from lost -- "$zinf" demo --offload nvme --dir "$drive" --steps 1 \
  --batch 24 --resume "$drive/ck" || { cat back.txt >&2; fail "the checkpoint no longer loads"; }

# 6. torch.distributed's gloo over TCP across 3 nodes (multinode_gloo.py, mpirun only starting
# it): zinf.distributed.ShardedAdamW with its state on each node's own drive ends bitwise where
# one process's zinf.torch.AdamW on the average gradient does, each rank on its own host with
# only its own state folder on its drive.
if [ -z "${ZINF_TEST_PYTHON:-}" ]; then
  echo "multinode_test: the gloo case skipped: this build has no Python package (ZINF_TEST_PYTHON unset)" >&2
elif ! "$ZINF_TEST_PYTHON" -c "import torch.distributed" 2>/dev/null; then
  echo "multinode_test: the gloo case skipped: $ZINF_TEST_PYTHON cannot import torch.distributed" >&2
else
  nodes 3 gloo.txt -- -x GLOO_SOCKET_IFNAME=eth0 -x PYTHONPATH="${ZINF_TEST_PYTHONPATH:-}" \
    -x PYTHONDONTWRITEBYTECODE=1 "$ZINF_TEST_PYTHON" "$here/multinode_gloo.py" "$drive" ||
    { cat gloo.txt >&2; fail "zinf.distributed over gloo across 3 nodes failed"; }
  for r in 0 1 2; do
    grep -aq "gloo rank $r of 3 on zt[0-9]*n$r: 3 steps bitwise one AdamW on the average; state in $drive/rank$r only" gloo.txt ||
      { cat gloo.txt >&2; fail "gloo rank $r did not report its parity"; }
  done
  grep -a "gloo rank" gloo.txt >&2
fi

# 7. Nothing of the nodes is left, also after a run interrupted mid-job.
"$harness" --nodes 2 -- "$zinf" demo --offload nvme --dir "$drive" --steps 500 >int.txt 2>&1 &
pid=$!
sleep 4
kill -TERM $pid
wait $pid
[ "$(ip -o link show | wc -l)" = "$links_before" ] && [ "$(ip netns list | wc -l)" = "$ns_before" ] ||
  { ip -o link show >&2; ip netns list >&2; fail "namespaces or links were left behind"; }
[ "$(ls -d "${TMPDIR:-/tmp}"/zinf-multinode.* 2>/dev/null | wc -l)" = "$state_before" ] ||
  fail "a run left its state folder (${TMPDIR:-/tmp}/zinf-multinode.*)"
[ -n "$drive_before" ] || [ ! -e "$drive" ] || fail "the runs left the drive's mount point $drive"
echo "multinode_test: 2 and 3 nodes match one node and move 1/N of the bytes each, as zinf plan says; node-local checkpoints resume; bad loads refused; a lost node fails the others naming it and damages no checkpoint; gloo across nodes is one process; nothing left"
