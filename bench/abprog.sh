#!/bin/bash
# abprog.sh - bench/ab.sh for the programs that time one shape (bench/ring,
# bench/shapes): alternate two or more builds of one of them under gorun
# -np 2 --btl self,sm, one run of each per round and mode, and print each
# build's median per mode, then its figures over the first build's in the
# same rounds (paired ratios: median, range, rounds above 1).
#
# Usage: bench/abprog.sh ROUNDS "MODES" "ARGS" BUILD...
#   bench/abprog.sh 8 "nb sr" "-steps 50000" /tmp/old/ring /tmp/new/ring
#   bench/abprog.sh 8 "ssend probe" "-iters 200000" /tmp/old/shapes /tmp/new/shapes
# A build is a binary of bench/ring or bench/shapes (go build -o DIR/ring
# ./bench/ring at each commit, e.g. in a git worktree); every build is
# given -mode MODE and ARGS and must print one line ending in "N us" or "N
# us/step". QUIET_NS as for bench/ab.sh. Needs gcc and Go; run from the
# repository root.
set -euo pipefail
[ $# -ge 4 ] || { sed -n '2,15p' "$0"; exit 2; }
ROUNDS=$1 MODES=$2 ARGS=$3
shift 3
BIN=$(mktemp -d)
trap 'rm -rf "$BIN"' EXIT
. bench/gate.sh
go build -o "$BIN/gorun" ./cmd/gorun
for r in $(seq "$ROUNDS"); do
  for m in $MODES; do
    for build in "$@"; do
      out=FAIL
      for _ in 1 2 3; do
        for _ in $(seq 60); do quiet && break; sleep 1; done
        # shellcheck disable=SC2086 # ARGS is a list of flags
        out=$(timeout 300 "$BIN/gorun" -np 2 --btl self,sm "$build" -mode "$m" $ARGS 2>&1 |
          awk '/ us(\/step)?$/ { print $(NF-1) }') || out=FAIL
        [ -n "$out" ] || out=FAIL
        quiet && break
      done
      echo "r$r $m $build $out"
    done
  done
done | tee "$BIN/runs"
echo "# median over $ROUNDS rounds; then each build over $1, paired by round: median (min-max), rounds above 1"
awk -v first="$1" '$4 ~ /^[0-9.]+$/ { v[$1, $2, $3] = $4; all[$2, $3] = all[$2, $3] " " $4; modes[$2]; builds[$3]; rounds[$1] }
function sort(s, a,   n, i, j, x) { n = split(s, a, " ")
  for (i = 2; i <= n; i++) { x = a[i] + 0; for (j = i - 1; j >= 1 && a[j] + 0 > x; j--) a[j + 1] = a[j]; a[j + 1] = x }
  return n }
function med(s,   a, n) { n = sort(s, a); return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
END {
  for (m in modes) for (b in builds) {
    if (!((m, b) in all)) continue
    line = sprintf("%s %s  %.3f", m, b, med(all[m, b]))
    if (b != first) {
      q = ""; above = 0; k = 0
      for (r in rounds) if ((r, m, b) in v && (r, m, first) in v && v[r, m, first] > 0) {
        x = v[r, m, b] / v[r, m, first]; q = q " " x; k++; if (x > 1) above++ }
      if (k > 0) { n = sort(q, a); line = line sprintf("  paired %.3f (%.3f-%.3f) %d/%d", med(q), a[1], a[n], above, k) }
    }
    print line
  }
}' "$BIN/runs" | sort
