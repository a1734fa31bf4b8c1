#!/bin/bash
# ab.sh - alternate two or more gompi-bench builds under gorun -np 2 --btl
# self,sm, one run of each per round, and print each build's median, min
# and max per size at the end (one line per run before that: round, build,
# the figure of each size).
#
# Usage: bench/ab.sh ROUNDS MODE SIZES BUILD...
#   bench/ab.sh 8 latency 0,8 /tmp/old/gompi-bench /tmp/new/gompi-bench
#   bench/ab.sh 21 rate 8 ompi /tmp/old/gompi-bench /tmp/new/gompi-bench
# A build is a gompi-bench binary (go build -o DIR/gompi-bench ./cmd/gompi-bench
# at each commit, e.g. in a git worktree), or "ompi" for Open MPI's vader
# running bench/ompi-rate.c (rate only; needs mpicc.openmpi).
# The end: each build's median, min and max per size, then its figures over
# the first build's in the same rounds (paired ratios).
# QUIET_NS=60: before a run, wait (up to a minute) for the anchor's probe to
# read below that many ns, and after it, when the probe does not, run it
# again (at most three tries): for the host whose regimes were ~30 and ~170
# ns. Unset or 0 (the default): no gating (an Intel guest whose probe reads
# 70-110 ns throughout). Needs gcc and Go; run from the repository root.
set -euo pipefail
[ $# -ge 4 ] || { sed -n '2,19p' "$0"; exit 2; }
ROUNDS=$1 MODE=$2 SIZES=$3
shift 3
BIN=$(mktemp -d)
trap 'rm -rf "$BIN"' EXIT
. bench/gate.sh
go build -o "$BIN/gorun" ./cmd/gorun
for b in "$@"; do
  if [ "$b" = ompi ]; then
    [ "$MODE" = rate ] || { echo "ab.sh: ompi runs rate only" >&2; exit 2; }
    mpicc.openmpi -O2 -o "$BIN/ompi-rate" bench/ompi-rate.c
  fi
done
one() { # BUILD: the run's "size=value " pairs
  if [ "$1" = ompi ]; then
    timeout 120 mpirun.openmpi --allow-run-as-root --oversubscribe -np 2 --mca btl self,vader \
      "$BIN/ompi-rate" $(echo "$SIZES" | awk -F, '{ for (i = 1; i <= NF; i++) { v = $i; m = 1
        if (v ~ /k$/) m = 1024; else if (v ~ /m$/) m = 1048576
        printf "%d ", v * m } }') 2>/dev/null
  else
    timeout 120 "$BIN/gorun" -np 2 --btl self,sm "$1" "$MODE" --sizes "$SIZES" --csv 2>&1
  fi | awk -F, 'NR > 1 && !/^#/ { printf "%s=%s ", $1, $2 }'
}
for r in $(seq "$ROUNDS"); do
  for build in "$@"; do
    echo "r$r $build $(gated one "$build")"
  done
done | tee "$BIN/runs"
ab_tables "$BIN/runs" "$MODE"
