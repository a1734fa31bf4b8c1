#!/bin/bash
# instr.sh - instructions per message of mpi's nonblocking calls' path
# through the PML, Handles included: the sending and the receiving halves
# of a gompi-bench rate 8 B window over sm (64 eager IsendHandle, then 64
# IrecvHandle, each followed by the PML calls of mpi.Comm.WaitallRelease),
# and of an 8-byte ping-pong (blocking Send and Recv; then with Probe and
# Recv, and with Mprobe and Mrecv), counted by valgrind's callgrind in
# pml/smpml's TestCGWindow, TestCGRoundTrip and TestCGProbeRoundTrip (the
# PML over sm) on one goroutine. mpi's own argument checks are not counted.
# A count, not a time: the same build gives the same figure to the tenth, so
# a change of a few instructions shows where timings on this machine drown
# it in noise. Needs valgrind (apt-get install -y valgrind). Run from the
# repository root.
#
# Usage: bench/instr.sh [WINDOWS]   (default 3000)
#   CG_SIZE=64 bench/instr.sh   the rate window with 64-byte messages
#   OUT=DIR bench/instr.sh   also keeps the profiles (DIR/cg.Send.out,
#     DIR/cg.Recv.out, DIR/cg.Round.out, DIR/cg.probe.out, DIR/cg.mprobe.out,
#     DIR/cg.ssend.out)
#     for callgrind_annotate --auto=yes
set -euo pipefail
BIN=$(mktemp -d)
trap 'rm -rf "$BIN"' EXIT
go test -c -o "$BIN/smpml.test" ./pml/smpml >/dev/null
cd "$BIN"
N=${1:-3000}
# One processor (GOMAXPROCS=1): with more, a run now and then stalls under
# valgrind for minutes, and the runtime's own work on another thread can
# land inside the counted functions; with one, three runs agree within 0.1
# instructions per message.
for side in Send Recv RecvPost; do
  CG_WINDOWS=$N GOMAXPROCS=1 GODEBUG=asyncpreemptoff=1 timeout 120 valgrind --tool=callgrind --toggle-collect='*.cg'$side --callgrind-out-file="$BIN/cg.$side.out" ./smpml.test -test.run TestCGWindow -test.bench NONE >/dev/null 2>&1
  tot=$(callgrind_annotate "$BIN/cg.$side.out" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",","",$1); print $1}')
  echo "$side $tot"
done | awk -v m=$((N * 64)) '{ if (!($1 in best) || $2 < best[$1]) best[$1] = $2 }
  END { printf "send %.1f, receive %.1f (of which posting %.1f) instructions/message\n", best["Send"] / m, best["Recv"] / m, best["RecvPost"] / m }'
# The 8-byte ping-pong of gompi-bench latency, both sides on one goroutine
# (TestCGRoundTrip): per message, the blocking Send's and Recv's work.
R=$((N * 30))
CG_ROUNDS=$R GOMAXPROCS=1 GODEBUG=asyncpreemptoff=1 timeout 120 valgrind --tool=callgrind --toggle-collect='*cgRound*' --callgrind-out-file="$BIN/cg.Round.out" ./smpml.test -test.run TestCGRoundTrip -test.bench NONE >/dev/null 2>&1
callgrind_annotate "$BIN/cg.Round.out" 2>/dev/null | awk -v m=$((R * 2)) '/PROGRAM TOTALS/ { gsub(",", "", $1); printf "ping-pong 8 B: %.1f instructions/message (send and receive)\n", $1 / m }'
# The same ping-pong with a receiver that learns the size from a probe
# (TestCGProbeRoundTrip): Probe then Recv, and Mprobe then Mrecv.
for mode in probe mprobe; do
  CG_MODE=$mode CG_ROUNDS=$R GOMAXPROCS=1 GODEBUG=asyncpreemptoff=1 timeout 120 valgrind --tool=callgrind --toggle-collect='*cgProbeRound*' --callgrind-out-file="$BIN/cg.$mode.out" ./smpml.test -test.run TestCGProbeRoundTrip -test.bench NONE >/dev/null 2>&1
  callgrind_annotate "$BIN/cg.$mode.out" 2>/dev/null | awk -v m=$((R * 2)) -v mode=$mode '/PROGRAM TOTALS/ { gsub(",", "", $1); printf "ping-pong 8 B, %s: %.1f instructions/message\n", mode, $1 / m }'
done
# Synchronous sends (TestCGSsendRoundTrip): Isend in synchronous mode, the
# peer's Recv (which answers the RNDV with an ACK), the sender's Wait; one
# way the RNDV finds the Recv posted, the other it arrives before it, as
# in a ping-pong of Ssend and Recv.
CG_ROUNDS=$R GOMAXPROCS=1 GODEBUG=asyncpreemptoff=1 timeout 120 valgrind --tool=callgrind --toggle-collect='*cgSsendRound*' --callgrind-out-file="$BIN/cg.ssend.out" ./smpml.test -test.run TestCGSsendRoundTrip -test.bench NONE >/dev/null 2>&1
callgrind_annotate "$BIN/cg.ssend.out" 2>/dev/null | awk -v m=$((R * 2)) '/PROGRAM TOTALS/ { gsub(",", "", $1); printf "ping-pong 8 B, ssend: %.1f instructions/message\n", $1 / m }'
if [ -n "${OUT:-}" ]; then mkdir -p "$OUT" && cp "$BIN"/cg.*.out "$OUT"/; fi
