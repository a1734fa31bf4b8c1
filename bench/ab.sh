#!/bin/bash
# ab.sh - alternate two or more gompi-bench builds under gorun -np 2 --btl
# self,sm, each run in the fast cache-line regime: before a run, wait (up to
# a minute) for the anchor's probe to read below QUIET_NS (default 60) ns;
# after it, when the probe does not, run it again (at most three tries). One
# line per run: round, build, and the figure of each size.
#
# Usage: bench/ab.sh ROUNDS MODE SIZES BUILD...
#   bench/ab.sh 8 latency 0,8 /tmp/old/gompi-bench /tmp/new/gompi-bench
#   bench/ab.sh 4 rate 8,512 /tmp/old/gompi-bench /tmp/new/gompi-bench
# A build is a gompi-bench binary (go build -o DIR/gompi-bench ./cmd/gompi-bench
# at each commit, e.g. in a git worktree). Needs gcc and Go; run from the
# repository root.
set -euo pipefail
[ $# -ge 4 ] || { sed -n '2,13p' "$0"; exit 2; }
ROUNDS=$1 MODE=$2 SIZES=$3
shift 3
ANCHOR=${ANCHOR:-/work/shared/anchor}
QUIET_NS=${QUIET_NS:-60}
BIN=$(mktemp -d)
trap 'rm -rf "$BIN"' EXIT
gcc -O2 -o "$BIN/c2c" "$ANCHOR/c2c.c" -lpthread
go build -o "$BIN/gorun" ./cmd/gorun
quiet() { awk -v p="$(timeout 30 "$BIN/c2c" || echo 9999)" -v q="$QUIET_NS" 'BEGIN { exit !(p + 0 < q + 0) }'; }
for r in $(seq "$ROUNDS"); do
  for build in "$@"; do
    for try in 1 2 3; do
      for _ in $(seq 60); do quiet && break; sleep 1; done
      out=$(timeout 120 "$BIN/gorun" -np 2 --btl self,sm "$build" "$MODE" --sizes "$SIZES" --csv 2>&1 |
        awk -F, 'NR > 1 && !/^#/ { printf "%s=%s ", $1, $2 }') || true
      quiet && break
    done
    echo "r$r $build $out"
  done
done
