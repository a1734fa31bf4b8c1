#!/bin/bash
# tcp-vs-ompi.sh - gompi's tcp transport against Open MPI's btl tcp on this
# machine, side by side in one session: ROUNDS rounds, each running Open
# MPI's anchor harness (shared/anchor/pingpong.c: latency, bw, bibw) and
# gompi-bench latency, bw and bibw under gorun, back to back. Prints, per
# size, the median over rounds of each library's figure (each run's figure
# is itself the median of 21 batches) and the ratio gompi/Open MPI, plus
# the best round and the spread ((max-min)/median).
#
# Usage: bench/tcp-vs-ompi.sh [ROUNDS] [OUTDIR]   (defaults: 5, a new temporary folder)
#   GOMPI_ARGS="--param btl_tcp_busy_poll=20us" bench/tcp-vs-ompi.sh   extra gorun flags
#   MODES="latency bw" bench/tcp-vs-ompi.sh                            skip bibw
#
# Needs: apt-get install -y openmpi-bin libopenmpi-dev; Go. Run from the repository root.
HERE=$(cd "$(dirname "$0")" && pwd)
set -euo pipefail

ROUNDS=${1:-5}
BIN=$(mktemp -d)
OUT=${2:-$BIN/results}
ANCHOR=${ANCHOR:-/work/shared/anchor}
MODES=${MODES:-"latency bw bibw"}
GOMPI_ARGS=${GOMPI_ARGS:-}
mkdir -p "$OUT"

mpicc.openmpi -O2 -Wall -o "$BIN/pingpong.ompi" "$ANCHOR/pingpong.c"
gcc -O2 -Wall -o "$BIN/c2c" "$ANCHOR/c2c.c"
go build -o "$BIN/gorun" ./cmd/gorun
go build -o "$BIN/gompi-bench" ./cmd/gompi-bench

OMPI="mpirun.openmpi --allow-run-as-root --oversubscribe -np 2 --mca btl self,tcp $BIN/pingpong.ompi"
PPARGS=""
case " $MODES " in *" bibw "*) ;; *) PPARGS="-nobibw" ;; esac
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $ROUNDS rounds, results in $OUT" >&2
echo "# ompi:  $OMPI $PPARGS" >&2
echo "# gompi: $BIN/gorun -np 2 --btl self,tcp $GOMPI_ARGS $BIN/gompi-bench MODE --csv" >&2

for r in $(seq 1 "$ROUNDS"); do
  probe=$(timeout 30 "$BIN/c2c" || echo "?")
  echo ">> round $r/$ROUNDS (c2c probe $probe ns)" >&2
  echo "$r $probe" >> "$OUT/probes.txt"
  # Open MPI: one run gives latency, bw and bibw columns.
  timeout 600 $OMPI $PPARGS > "$OUT/ompi.$r.txt" 2> "$OUT/ompi.$r.err" || echo "!! ompi round $r failed" >&2
  for m in $MODES; do
    timeout 600 "$BIN/gorun" -np 2 --btl self,tcp $GOMPI_ARGS "$BIN/gompi-bench" "$m" --csv \
      > "$OUT/gompi-$m.$r.csv" 2> "$OUT/gompi-$m.$r.err" || echo "!! gompi $m round $r failed" >&2
  done
done

# Normalise to "mode size value" lines per round.
for r in $(seq 1 "$ROUNDS"); do
  awk -v r="$r" '/^#/ || $1 == "size" { next }
    { print "latency", $1, $2, r; if ($3 != "-") print "bw", $1, $3, r; if ($4 != "-" && $4 != "") print "bibw", $1, $4, r }' \
    "$OUT/ompi.$r.txt" >> "$OUT/ompi.all"
  for m in $MODES; do
    awk -F, -v m="$m" -v r="$r" 'NR > 1 { print m, $1, $2, r }' "$OUT/gompi-$m.$r.csv" >> "$OUT/gompi.all"
  done
done

echo "c2c probes (ns) per round: $(awk '{printf "%s ", $2}' "$OUT/probes.txt")"
for m in $MODES; do
  unit=us; better=lower
  [ "$m" != latency ] && unit=MB/s && better=higher
  echo
  echo "### $m ($unit, $better is better; median over $ROUNDS rounds, best round, spread)"
  echo
  echo "| size (B) | gompi median | gompi best | gompi spread | Open MPI median | Open MPI best | Open MPI spread | gompi/OMPI (medians) |"
  echo "|---:|---:|---:|---:|---:|---:|---:|---:|"
  awk -v m="$m" -v better="$better" -f "$HERE/median-table.awk" "$OUT/gompi.all" "$OUT/ompi.all"
done
