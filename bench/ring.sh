#!/bin/bash
# ring.sh - the neighbour exchange of a 1-D decomposition (bench/ring: two
# Sendrecv per step, Irecv/Isend/Waitall, or Irecv/Send/Wait) in gompi and in Open MPI on
# this machine, side by side: ROUNDS rounds, each running every
# combination of rank count, transport and mode once for each library,
# back to back. Rank counts above the number of CPUs oversubscribe the
# machine (gorun --oversubscribe; mpirun --oversubscribe, where Open MPI
# yields the CPU while it polls). Prints, per combination, the median
# time per step of each library, gompi/Open MPI, and the median of the
# rounds' own ratios (paired: runs made one after the other).
#
# Usage: bench/ring.sh [ROUNDS]   (default 5; from the repository root)
#   NPS="2 4 8" BTLS="sm tcp" MODES="sr nb isr" SIZE=8 STEPS=20000 bench/ring.sh
#   CORES=0 NPS=2 bench/ring.sh   both libraries' ranks on CPU 0 alone
#     (taskset -c CORES): gorun then counts fewer CPUs than ranks and its
#     waits yield; mpirun, which counts the host's cores, is told to yield
#     (mpi_yield_when_idle) and not to bind. Runs on one core vary less
#     than runs spread over two, which move with the ranks' placement.
#   QUIET_NS=60 bench/ring.sh   each pair of runs waits (up to a minute) for
#     the anchor's cache-line probe to read below 60 ns, and runs again (at
#     most three tries) when the probe after it does not (bench/ab.sh)
# Needs: apt-get install -y openmpi-bin libopenmpi-dev; Go.
set -euo pipefail
ROUNDS=${1:-5}
NPS=${NPS:-2 4 8}
BTLS=${BTLS:-sm tcp}
MODES=${MODES:-sr nb isr}
SIZE=${SIZE:-8}
STEPS=${STEPS:-20000}
CORES=${CORES:-}
pin=() ompi_pin=()
if [ -n "$CORES" ]; then
	pin=(taskset -c "$CORES")
	ompi_pin=(--bind-to none --mca mpi_yield_when_idle 1)
fi
BIN=$(mktemp -d)
trap 'rm -rf "$BIN"' EXIT
. bench/gate.sh
build_side_by_side ring
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) CPUs${CORES:+ (runs on CPUs $CORES)}, $ROUNDS rounds, $SIZE B, $STEPS steps"
for r in $(seq "$ROUNDS"); do
	for np in $NPS; do
		for t in $BTLS; do
			ob=$t
			[ "$t" = sm ] && ob=vader
			for m in $MODES; do
				gompi_run() { timeout 300 "${pin[@]}" "$BIN/gorun" -np "$np" --oversubscribe --btl "self,$t" "$BIN/ring" -steps "$STEPS" -size "$SIZE" -mode "$m" | awk '/us\/step/ { print $(NF-1) }'; }
				ompi_run() { timeout 300 "${pin[@]}" mpirun.openmpi --allow-run-as-root --oversubscribe "${ompi_pin[@]}" -np "$np" --mca btl "self,$ob" "$BIN/ring-ompi" "$STEPS" "$SIZE" "$m" 2>/dev/null | awk '/us\/step/ { print $(NF-1) }'; }
				pair
				echo "r$r $np $t $m gompi=$g ompi=$o"
			done
		done
	done
done | tee "$BIN/runs.txt"
echo "# median us/step over $ROUNDS rounds"
echo "| ranks | transport | mode | gompi | Open MPI | gompi/Open MPI | paired |"
echo "| ---: | --- | --- | ---: | ---: | ---: | ---: |"
pair_table "$BIN/runs.txt" | sort -t'|' -k2,2n -k3,3 -k4,4
