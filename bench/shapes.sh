#!/bin/bash
# shapes.sh - blocking calls in the shapes a plain ping-pong leaves out
# (bench/shapes: a receiver that learns the size from Probe or Mprobe, one
# that receives from AnySource with AnyTag, one that polls with Test or
# waits with Waitany, synchronous sends, Barrier),
# 2 ranks, in gompi and in Open MPI on this machine, side by side: ROUNDS
# rounds, each running every combination of transport and mode once for
# each library, back to back. Prints, per combination, the median half
# round trip (the whole Barrier) of each library, gompi/Open MPI, and the
# median of the rounds' own ratios (paired: runs made one after the other).
#
# Usage: bench/shapes.sh [ROUNDS]   (default 5; from the repository root)
#   BTLS="sm tcp" MODES="probe mprobe any test waitany ssend barrier" SIZE=8 ITERS=200000 bench/shapes.sh
#   QUIET_NS=60 bench/shapes.sh   each pair of runs waits (up to a minute)
#     for the anchor's cache-line probe to read below 60 ns, and runs again
#     (at most three tries) when the probe after it does not (bench/ab.sh)
# Needs: apt-get install -y openmpi-bin libopenmpi-dev; Go.
set -euo pipefail
ROUNDS=${1:-5}
BTLS=${BTLS:-sm tcp}
MODES=${MODES:-probe mprobe any test waitany ssend barrier}
SIZE=${SIZE:-8}
ITERS=${ITERS:-200000}
BIN=$(mktemp -d)
trap 'rm -rf "$BIN"' EXIT
. bench/gate.sh
build_side_by_side shapes
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) CPUs, $ROUNDS rounds, $SIZE B, $ITERS steps"
for r in $(seq "$ROUNDS"); do
	for t in $BTLS; do
		ob=$t
		[ "$t" = sm ] && ob=vader
		for m in $MODES; do
			gompi_run() { timeout 300 "$BIN/gorun" -np 2 --btl "self,$t" "$BIN/shapes" -iters "$ITERS" -size "$SIZE" -mode "$m" | awk '/ us$/ { print $(NF-1) }'; }
			ompi_run() { timeout 300 mpirun.openmpi --allow-run-as-root -np 2 --mca btl "self,$ob" "$BIN/shapes-ompi" "$ITERS" "$SIZE" "$m" 2>/dev/null | awk '/ us$/ { print $(NF-1) }'; }
			pair
			echo "r$r $t $m gompi=$g ompi=$o"
		done
	done
done | tee "$BIN/runs.txt"
echo "# median us over $ROUNDS rounds"
echo "| transport | mode | gompi | Open MPI | gompi/Open MPI | paired |"
echo "| --- | --- | ---: | ---: | ---: | ---: |"
pair_table "$BIN/runs.txt" | sort
