#!/usr/bin/env bash
# Several "nodes" on one machine: each a network namespace with its own address on a private
# bridge, its own host name (the namespace's name), and its own mount namespace in which DRIVE
# is the node's own folder (a node-local drive at the same path on every node, invisible to
# the others). Runs an MPI job with one rank per node (TCP only: no shared-memory transport),
# launched into the namespaces through mpirun's rsh agent (this script again), and removes
# every namespace, link, mount and file it made on exit, also when the job fails or the script
# is interrupted.
#
# Usage: scripts/multinode.sh --nodes N [--drive DIR] [--drives-from DIR] [--keep-drives DIR]
#                             [--timeout S] -- [MPIRUN OPTIONS] PROGRAM [ARGS...]
#   N        2 or more nodes, one rank each
#   DRIVE    the node-local folder, the same path on every node (default /tmp/zinf-node-drive;
#            made if missing and removed at the end: runs at once need different ones)
#   --drives-from DIR: node R's drive starts as a copy of DIR/node<R> (empty where missing)
#   --keep-drives DIR: after the job (also one that failed or was ended), copy node R's
#            drive to DIR/node<R> (a later run's --drives-from, or for inspection)
#   --timeout S: end the job after S seconds (0, the default: no limit)
# Node R's network namespace is zt<PID>n<R>, its host name the same, and its link to the bridge
# zt<PID>v<R> (PID: this script's). To lose node R mid-job as a machine that vanishes, set
# that link down (`ip link set zt<PID>v<R> down`) and kill the processes of its namespace
# (`ip netns pids zt<PID>n<R>`): mpirun hears of it as it would across a network (not at all).
# Every rank sees ZT_NODE_ADDRS, the nodes' addresses in rank order (where a program that is
# not an MPI one, torch.distributed's, meets: node 0's).
# Needs root, `ip`, `unshare` and mpirun (Open MPI). Exit status: the job's; 77 where nodes
# cannot be made here (not root, no ip or mpirun, namespaces refused), saying why.
set -uo pipefail

# ---- the rsh agent: mpirun runs "<this script> --rsh HOST COMMAND..." to start its daemon ----
if [ "${1:-}" = "--rsh" ]; then
  host=$2
  shift 2
  node=${ZT_NODES_BY_ADDR:-}
  ns=""
  for pair in $node; do [ "${pair%%=*}" = "$host" ] && ns=${pair#*=}; done
  [ -n "$ns" ] || { echo "multinode.sh: no node has address $host" >&2; exit 1; }
  # The daemon and every rank it starts live in the node's network namespace and in mount and
  # UTS namespaces of their own: DRIVE is this node's folder (kept in ZT_STATE so that a later
  # command for the node sees the same files) and the host name is the node's. Open MPI keys
  # its per-node session directory by host name (<tmpdir>/ompi.<host>.<uid>/jf.<job>); nodes
  # that shared one name shared that directory, and one daemon removing it at startup while
  # another was creating its own below it killed the second (mkdir: ENOENT).
  ip netns exec "$ns" unshare --mount --uts --propagation private /bin/sh -c \
    "hostname \"$ns\" && mount --bind \"$ZT_STATE/$ns\" \"$ZT_DRIVE\" && exec $*" <&0 &
  daemon=$!
  echo $$ >"$ZT_STATE/$ns.agent"
  trap 'kill -TERM $daemon 2>/dev/null' TERM INT HUP
  wait $daemon
  rc=$?
  # This agent stands for an ssh session and stays outside the node, so a lost node (its link
  # down, its processes killed) looks to mpirun as one across a network does: the session to
  # it neither ends nor answers, and only the job's own timeouts can end the job. (An agent
  # that ended with its daemon would let mpirun abort the job at once.) Bounded by the run:
  # its state folder goes at the end.
  if ! ip -o link show "${ns%n*}v${ns##*n}" 2>/dev/null | grep -q "state UP"; then
    while [ -d "$ZT_STATE" ]; do sleep 1; done
  fi
  exit $rc
fi

nodes=0
drive=/tmp/zinf-node-drive
keep=""
from=""
limit=0
while [ $# -gt 0 ]; do
  case "$1" in
    --nodes) nodes=$2; shift 2 ;;
    --drive) drive=$2; shift 2 ;;
    --keep-drives) keep=$2; shift 2 ;;
    --drives-from) from=$2; shift 2 ;;
    --timeout) limit=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "multinode.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done
[ "$nodes" -ge 2 ] 2>/dev/null || { echo "multinode.sh: --nodes N with N >= 2" >&2; exit 2; }
[ $# -gt 0 ] || { echo "multinode.sh: no program after --" >&2; exit 2; }
skip() { echo "multinode.sh: skipped: $*" >&2; exit 77; }
[ "$(id -u)" -eq 0 ] || skip "not root (network and mount namespaces need it)"
for tool in ip unshare mpirun; do command -v "$tool" >/dev/null || skip "no '$tool'"; done

# Names unique to this run, so that concurrent runs never touch each other's.
tag="zt$$"
net=$(( ($$ % 200) + 20 ))
for _ in $(seq 200); do
  [ -z "$(ip -o addr show to "10.$net.0.0/24" 2>/dev/null)" ] && break
  net=$(( (net - 20 + 1) % 200 + 20 ))
done
bridge="${tag}b"
state=$(mktemp -d "${TMPDIR:-/tmp}/zinf-multinode.XXXXXX")
made_ns=()
made_drive=""
job=""
watchdog=""
cleanup() {
  local rc=$?
  # Nothing may cut the cleanup short: mpirun, ending an aborted job, signals its process
  # group, and a second signal here would skip the deletions below.
  trap '' INT TERM
  # The watchdog ends its sleep itself (below): killing the sleep from here let it go on to
  # report a timeout that never happened, killing only the watchdog left the sleep running,
  # holding the caller's output open until its time was up.
  [ -n "$watchdog" ] && kill -TERM "$watchdog" 2>/dev/null
  # The job first (an interrupted run): a namespace with processes in it outlives its name,
  # and its veth pair with it.
  if [ -n "$job" ] && kill -0 "$job" 2>/dev/null; then
    kill -TERM "$job" 2>/dev/null
    for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$job" 2>/dev/null || break; sleep 0.5; done
    kill -KILL "$job" 2>/dev/null
  fi
  # Then whatever is left in the namespaces, until nothing is (bounded: a process in
  # uninterruptible sleep may take a while to die).
  for _ in $(seq 50); do
    local left=0
    for ns in "${made_ns[@]}"; do
      for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; left=1; done
    done
    [ "$left" -eq 0 ] && break
    sleep 0.1
  done
  # The drives once nothing writes to them any more: also those of a job that was ended.
  if [ -n "$keep" ]; then
    for ((r = 0; r < ${#made_ns[@]}; ++r)); do
      rm -rf "$keep/node$r" && mkdir -p "$keep/node$r" &&
        cp -a "$state/${tag}n$r/." "$keep/node$r/"
    done
  fi
  # The rsh agents of lost nodes, still standing in for their sessions.
  for f in "$state"/*.agent; do [ -f "$f" ] && kill -KILL "$(cat "$f")" 2>/dev/null; done
  # Each veth pair by its end here, which removes both ends at once: a namespace's own devices
  # go only when the kernel gets to destroying it, after `ip netns del` has returned, and a
  # caller checking for leftovers at once would still see its pair.
  for ((r = 0; r < ${#made_ns[@]}; ++r)); do ip link del "${tag}v$r" 2>/dev/null; done
  for ns in "${made_ns[@]}"; do ip netns del "$ns" 2>/dev/null; done
  ip link del "$bridge" 2>/dev/null
  # The drives are folders of this run's state directory, bind-mounted inside the namespaces
  # only: nothing is mounted in the caller's namespace.
  rm -rf "$state"
  [ -n "$made_drive" ] && rmdir "$drive" 2>/dev/null
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
# (A signal interrupts the `wait` for the job below; the EXIT trap then ends the job.)

ip link add "$bridge" type bridge 2>/dev/null || skip "cannot make a bridge (ip link add: refused)"
ip addr add "10.$net.0.1/24" dev "$bridge" && ip link set "$bridge" up || exit 1
hosts=()
by_addr=""
for ((r = 0; r < nodes; ++r)); do
  ns="${tag}n$r"
  addr="10.$net.0.$((r + 2))"
  ip netns add "$ns" || skip "cannot make a network namespace"
  made_ns+=("$ns")
  ip link add "${tag}v$r" type veth peer name eth0 netns "$ns" || exit 1
  ip link set "${tag}v$r" master "$bridge" up || exit 1
  ip netns exec "$ns" ip addr add "$addr/24" dev eth0 || exit 1
  ip netns exec "$ns" ip link set eth0 up && ip netns exec "$ns" ip link set lo up || exit 1
  mkdir -p "$state/$ns"
  if [ -n "$from" ] && [ -d "$from/node$r" ]; then cp -a "$from/node$r/." "$state/$ns/"; fi
  hosts+=("$addr")
  by_addr+="$addr=$ns "
done
# DRIVE is only a mount point here (each node mounts its own folder on it); made if missing and
# then removed at the end, so that it is not left behind either.
[ -d "$drive" ] || made_drive=1
mkdir -p "$drive" "$state/tmp"

export ZT_NODES_BY_ADDR="$by_addr" ZT_STATE="$state" ZT_DRIVE="$drive"
host_list=$(IFS=,; echo "${hosts[*]}")
self=$(realpath "$0")
# One rank per node; TCP between them on the bridge's subnet only (the rsh launch's own
# connections too). --mca plm_rsh_no_tree_spawn: every daemon is started from here.
# --leave-session-attached: a daemon stays the child of its rsh agent, so one that fails is
# an agent exiting non-zero, which mpirun reports (with the daemon's own error) and ends the
# job on, where a daemonized one (stderr closed) vanished and left mpirun waiting forever.
# Open MPI's session directories (mpirun's and every node's, passed on to the daemons) go
# to the run's state folder, removed with it also after a kill.
mpirun --allow-run-as-root --oversubscribe -np "$nodes" --host "$host_list" \
  --mca plm_rsh_agent "$self --rsh" --mca plm_rsh_no_tree_spawn 1 --leave-session-attached \
  --mca orte_tmpdir_base "$state/tmp" -x ZT_NODE_ADDRS="$host_list" \
  --mca btl tcp,self --mca btl_tcp_if_include "10.$net.0.0/24" \
  --mca oob_tcp_if_include "10.$net.0.0/24" "$@" 2> >(grep --line-buffered -v "setpgid" >&2) &
job=$!
if [ "$limit" -gt 0 ] 2>/dev/null; then
  # A job past its time is ended (and reported) rather than left to whoever runs this to
  # kill: a harness killed outright cannot remove its namespaces.
  (
    trap 'kill "$sleeper" 2>/dev/null; exit 0' TERM
    sleep "$limit" &
    sleeper=$!
    wait "$sleeper"
    echo "multinode.sh: the job ran past --timeout $limit s; ending it" >&2
    kill -TERM "$job" 2>/dev/null
  ) &
  watchdog=$!
fi
wait "$job"
rc=$?
job=""
exit $rc
