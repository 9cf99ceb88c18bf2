#!/usr/bin/env bash
# Issues #41 and #52's done-when for sharded checkpoints, at full length: 2-rank and 3-rank
# `mpirun zinf demo --resume CK --save CK` jobs whose rank 0, 1 or 2 (drawn) is SIGKILLed at a
# random point inside its save, ROUNDS rounds each (20 unless given); every round must resume
# one committed step bitwise, on the job's ranks and on one. This is
# DemoMpi.ASaveKilledOnOneRankResumesOneCommittedStep (demo_mpi_np2/_np3 in CI run six
# rounds) with ZINF_TEST_ROUNDS. Prints each run's seed (ZINF_TEST_SEED=... replays it) and
# its tally; exits non-zero if any round failed to resume or mixed steps.
# Usage: scripts/kill-rounds.sh [BUILD_DIR (build/release)] [ROUNDS (20)]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build/release}
rounds=${2:-20}
test_bin="$build/tests/tools/demo_mpi_test"
[ -x "$test_bin" ] || { echo "kill-rounds: $test_bin not built (needs MPI)" >&2; exit 2; }
status=0
for np in 2 3; do
  echo "== $np ranks, $rounds rounds"
  ZINF_TEST_ROUNDS=$rounds "$test_bin" --np "$np" \
    --gtest_filter='DemoMpi.ASaveKilledOnOneRankResumesOneCommittedStep' \
    | grep -E 'ZINF_TEST_SEED=|rounds, |OK \]|FAILED|Failure|resumed on' || status=1
done
exit $status
