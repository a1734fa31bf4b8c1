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
    out=
    for try in 1 2 3; do
      for _ in $(seq 60); do quiet && break; sleep 1; done
      out=$(one "$build") || true
      quiet && break
    done
    echo "r$r $build $out"
  done
done | tee "$BIN/runs"
echo "# median (min-max) over $ROUNDS rounds, $MODE:"
# One "build figure<TAB>value" line per figure of every run, sorted by
# figure then value, so the median is the middle line of each group (plain
# POSIX awk: Debian's default awk, mawk, has no asort).
awk '{ for (i = 3; i <= NF; i++) { split($i, kv, "="); printf "%s %s\t%s\n", $2, kv[1], kv[2] } }' "$BIN/runs" |
  sort -t "$(printf '\t')" -k1,1 -k2,2g |
  awk -F '\t' 'function out() { printf "%s  %s (%s-%s)\n", k, a[int((n + 1) / 2)], a[1], a[n]; n = 0 }
    $1 != k && n > 0 { out() }
    { k = $1; a[++n] = $2 }
    END { if (n > 0) out() }'
# The same rounds paired: each build's figure over the first build's in the
# same round, median (min-max) of those ratios per size, and in how many
# rounds the ratio was above 1. On a guest whose runs fall into a fast and a
# slow mode, the medians above depend on how many runs each build had in
# each mode; the paired ratios much less.
[ $# -ge 2 ] || exit 0
echo "# paired with $1: median (min-max) of the ratio, rounds above 1, $MODE:"
awk -v first="$1" '{ for (i = 3; i <= NF; i++) { split($i, kv, "="); v[$1, $2, kv[1]] = kv[2]; if (!(kv[1] in seen)) { seen[kv[1]]; sizes[++ns] = kv[1] } }
    if (!($2 in bseen)) { bseen[$2]; builds[++nb] = $2 }; rounds[$1] }
  END { for (r in rounds) for (b = 1; b <= nb; b++) if (builds[b] != first) for (s = 1; s <= ns; s++) {
      base = v[r, first, sizes[s]]; x = v[r, builds[b], sizes[s]]
      if (base > 0 && x != "") printf "%s %s\t%.4f\n", builds[b], sizes[s], x / base } }' "$BIN/runs" |
  sort -t "$(printf '\t')" -k1,1 -k2,2g |
  awk -F '\t' 'function out() { printf "%s  %.3f (%.3f-%.3f) %d/%d\n", k, a[int((n + 1) / 2)], a[1], a[n], above, n; n = 0; above = 0 }
    $1 != k && n > 0 { out() }
    { k = $1; a[++n] = $2; if ($2 > 1) above++ }
    END { if (n > 0) out() }'
