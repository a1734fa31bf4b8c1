#!/bin/bash
# launch.sh - launch cost: a prebuilt program that calls only Init and
# Finalize, started with 2 and with 16 ranks on this host by gorun (Go,
# bench/launch), by Open MPI's mpirun and by MPICH's hydra (mpiexec.hydra;
# both bench/launch-initfin.c in C, built with each one's mpicc), and by
# hydra running the gompi program (PMI wire-up), all in one hyperfine run
# per rank count (the commands run back to back, WARMUP and RUNS each).
#
# Usage: bench/launch.sh [RUNS] [NPS]  (defaults 20 and "2 16"; from the repository root)
#   BTL=self,tcp bench/launch.sh       transports for all (default self,tcp)
# Needs: apt-get install -y openmpi-bin libopenmpi-dev mpich hyperfine
# (a launcher that is missing is left out, saying so)
set -euo pipefail
RUNS=${1:-20}
NPS=${2:-2 16}
BTL=${BTL:-self,tcp}
BIN=$(mktemp -d)
trap 'rm -rf "$BIN"' EXIT
go build -o "$BIN/gorun" ./cmd/gorun
go build -o "$BIN/launch" ./bench/launch
have_ompi=0 have_hydra=0
if command -v mpicc.openmpi >/dev/null && command -v mpirun.openmpi >/dev/null; then
	mpicc.openmpi -O2 -Wall -o "$BIN/initfin-ompi" bench/launch-initfin.c && have_ompi=1
else
	echo "launch.sh: Open MPI not installed: mpirun left out" >&2
fi
if command -v mpicc.mpich >/dev/null && command -v mpiexec.hydra >/dev/null; then
	mpicc.mpich -O2 -Wall -o "$BIN/initfin-mpich" bench/launch-initfin.c && have_hydra=1
else
	echo "launch.sh: MPICH not installed: mpiexec.hydra left out" >&2
fi
ompi_btl=${BTL/sm/vader}
for np in $NPS; do
	args=(-n "gorun -np $np --btl $BTL" "$BIN/gorun -np $np --oversubscribe --btl $BTL $BIN/launch")
	if [ $have_hydra = 1 ]; then
		args+=(-n "mpiexec.hydra -n $np (gompi, PMI-1)" "env GOMPI_BTL=$BTL mpiexec.hydra -n $np $BIN/launch")
		args+=(-n "mpiexec.hydra -n $np (MPICH)" "mpiexec.hydra -n $np $BIN/initfin-mpich")
	fi
	if [ $have_ompi = 1 ]; then
		args+=(-n "mpirun.openmpi -np $np --mca btl $ompi_btl" "mpirun.openmpi --allow-run-as-root --oversubscribe -np $np --mca btl $ompi_btl $BIN/initfin-ompi")
	fi
	hyperfine -N -w 3 -r "$RUNS" --export-markdown "$BIN/launch-$np.md" "${args[@]}" >&2
	cat "$BIN/launch-$np.md"
	echo
done
