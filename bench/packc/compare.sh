#!/bin/sh
# Runs the Go convertor benchmarks and the Open MPI MPI_Pack program back to
# back RUNS times (default 5) and prints the median ns/op of each.
# Usage: bench/packc/compare.sh [RUNS]   (from anywhere in the tree)
set -eu
cd "$(dirname "$0")/../.."
RUNS=${1:-5}
OUT=${TMPDIR:-/tmp}/gompi-packc-compare
mkdir -p "$OUT"
: >"$OUT/go.txt"
: >"$OUT/c.txt"
go test -c -o "$OUT/convertor.test" ./convertor/
BIN=$OUT/gompi-packc
mpicc -O2 -o "$BIN" bench/packc/pack.c
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
i=1
while [ "$i" -le "$RUNS" ]; do
	"$OUT/convertor.test" -test.run '^$' -test.bench 'Pack|Unpack|Copy' -test.benchtime 1s -test.benchmem >>"$OUT/go.txt"
	mpirun --allow-run-as-root --bind-to none -np 1 "$BIN" >>"$OUT/c.txt"
	i=$((i + 1))
done
median() { sort -n | awk '{v[NR]=$1} END {if (NR%2) print v[(NR+1)/2]; else print (v[NR/2]+v[NR/2+1])/2}'; }
echo "# Go (median of $RUNS, ns/op)"
for name in $(awk '/^Benchmark/ {print $1}' "$OUT/go.txt" | sort -u); do
	printf '%-40s %s\n' "$name" "$(awk -v n="$name" '$1==n {print $3}' "$OUT/go.txt" | median)"
done
echo "# Open MPI MPI_Pack (median of $RUNS, ns/op)"
for key in $(awk '{print $1 "/" $2}' "$OUT/c.txt" | sort -u); do
	l=${key%%/*}
	o=${key#*/}
	printf '%-40s %s\n' "$key" "$(awk -v l="$l" -v o="$o" '$1==l && $2==o {split($4, a, "="); print a[2]}' "$OUT/c.txt" | median)"
done
echo "# raw results: $OUT/go.txt $OUT/c.txt"
