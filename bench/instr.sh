#!/bin/bash
# instr.sh - instructions per message of the sending and the receiving halves
# of a gompi-bench rate 8 B window (64 eager sends over sm, then 64 receives
# with sinks and their waits, as mpi.Irecv and mpi.WaitallInto make them),
# counted by valgrind's callgrind in btl/sm's TestCGWindow on one goroutine.
# A count, not a time: the same build gives the same figure to the tenth, so
# a change of a few instructions shows where timings on this machine drown
# it in noise. Needs valgrind (apt-get install -y valgrind). Run from the
# repository root.
#
# Usage: bench/instr.sh [WINDOWS]   (default 3000)
#   OUT=DIR bench/instr.sh   also keeps the profiles (DIR/cg.Send.out,
#     DIR/cg.Recv.out) for callgrind_annotate --auto=yes
set -euo pipefail
BIN=$(mktemp -d)
trap 'rm -rf "$BIN"' EXIT
go test -c -o "$BIN/sm.test" ./btl/sm >/dev/null
cd "$BIN"
N=${1:-3000}
for side in Send Recv; do
  CG_WINDOWS=$N GODEBUG=asyncpreemptoff=1 valgrind --tool=callgrind --toggle-collect='*cg'$side'*' --callgrind-out-file="$BIN/cg.$side.out" ./sm.test -test.run TestCGWindow -test.bench NONE >/dev/null 2>&1
  tot=$(callgrind_annotate "$BIN/cg.$side.out" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",","",$1); print $1}')
  echo "$side $(awk -v t="$tot" -v m=$((N * 64)) 'BEGIN { printf "%.1f", t / m }') instructions/message"
done
if [ -n "${OUT:-}" ]; then mkdir -p "$OUT" && cp "$BIN"/cg.*.out "$OUT"/; fi
