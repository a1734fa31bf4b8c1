#!/bin/bash
# launch.sh - launch cost: gorun -np 2 of a prebuilt Go program that calls
# mpi.Init and mpi.Finalize, against mpirun.openmpi -np 2 of the same in C,
# in one hyperfine run (interleaving is not possible in hyperfine; the two
# commands run back to back, WARMUP and RUNS each).
#
# Usage: bench/launch.sh [RUNS]     (default 20; run from the repository root)
#   BTL=self,tcp bench/launch.sh    transports for both (default self,tcp)
# Needs: apt-get install -y openmpi-bin libopenmpi-dev hyperfine
set -euo pipefail
RUNS=${1:-20}
BTL=${BTL:-self,tcp}
BIN=$(mktemp -d)
go build -o "$BIN/gorun" ./cmd/gorun
go build -o "$BIN/launch" ./bench/launch
mpicc.openmpi -O2 -Wall -o "$BIN/initfin" bench/launch-initfin.c
hyperfine -N -w 3 -r "$RUNS" --export-markdown "$BIN/launch.md" \
  -n "gorun -np 2 --btl $BTL" "$BIN/gorun -np 2 --btl $BTL $BIN/launch" \
  -n "mpirun.openmpi -np 2 --mca btl $BTL" "mpirun.openmpi --allow-run-as-root --oversubscribe -np 2 --mca btl $BTL $BIN/initfin"
cat "$BIN/launch.md"
