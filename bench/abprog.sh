#!/bin/bash
# abprog.sh - bench/ab.sh for the programs that time one shape (bench/ring,
# bench/shapes): alternate two or more builds of one of them under gorun
# -np NP --btl self,BTL (default 2 ranks over sm), one run of each per
# round and mode, and print each build's median per mode, then its figures
# over the first build's in the same rounds (paired ratios: median, range,
# rounds above 1).
#
# Usage: bench/abprog.sh ROUNDS "MODES" "ARGS" BUILD...
#   bench/abprog.sh 8 "nb sr" "-steps 50000" /tmp/old/ring /tmp/new/ring
#   bench/abprog.sh 8 "ssend probe" "-iters 200000" /tmp/old/shapes /tmp/new/shapes
# A build is a binary of bench/ring or bench/shapes (go build -o DIR/ring
# ./bench/ring at each commit, e.g. in a git worktree); every build is
# given -mode MODE and ARGS and must print one line ending in "N us" or "N
# us/step". QUIET_NS as for bench/ab.sh; NP=4 runs four ranks (more ranks
# than CPUs oversubscribe: gorun --oversubscribe), BTL=tcp over tcp. Needs
# gcc and Go; run from the repository root.
set -euo pipefail
[ $# -ge 4 ] || { sed -n '2,17p' "$0"; exit 2; }
ROUNDS=$1 MODES=$2 ARGS=$3
NP=${NP:-2} BTL=${BTL:-sm}
shift 3
BIN=$(mktemp -d)
trap 'rm -rf "$BIN"' EXIT
. bench/gate.sh
go build -o "$BIN/gorun" ./cmd/gorun
run() { # BUILD MODE: the figure the build prints
  # shellcheck disable=SC2086 # ARGS is a list of flags
  timeout 300 "$BIN/gorun" -np "$NP" --oversubscribe --btl "self,$BTL" "$1" -mode "$2" $ARGS 2>&1 | awk '/ us(\/step)?$/ { print $(NF-1) }'
}
for r in $(seq "$ROUNDS"); do
  for build in "$@"; do
    out=
    for m in $MODES; do
      v=$(gated run "$build" "$m")
      [ -z "$v" ] || out="$out $m=$v"
    done
    echo "r$r $build$out"
  done
done | tee "$BIN/runs"
ab_tables "$BIN/runs" "us per call or step, by mode"
