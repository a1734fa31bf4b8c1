#!/bin/sh
# Builds pack.c with Open MPI's mpicc and runs it RUNS times (default 1) as
# one rank, unbound, printing ns/op per layout and operation.
# Needs: apt-get install -y openmpi-bin libopenmpi-dev
set -eu
cd "$(dirname "$0")"
RUNS=${1:-1}
BIN=${TMPDIR:-/tmp}/gompi-packc
mpicc -O2 -o "$BIN" pack.c
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
i=1
while [ "$i" -le "$RUNS" ]; do
	echo "# run $i"
	mpirun --allow-run-as-root --bind-to none -np 1 "$BIN"
	i=$((i + 1))
done
