#!/usr/bin/env bash
# pgo.sh - regenerate pgo/gompi.pgo, the CPU profile of gompi's message paths
# that Go's profile-guided optimization reads (go build -pgo=FILE). It holds
# samples of gompi's own functions only as far as a program spends its time
# in them, so it serves any program that links gompi: build yours with
#   go build -pgo=$(go list -m -f '{{.Dir}}' github.com/gompi-org/gompi)/pgo/gompi.pgo
# or merge it with your own profile (go tool pprof -proto yours.pprof gompi.pgo
# > default.pgo). docs/tuning.md says what it changes and what it measured.
#
# The workload: gompi-bench latency, rate, bw and bibw over sm (gorun -np 2),
# latency and bw over tcp, and the in-process ping-pong over self; each rank
# writes a profile, all are merged.
#
# Usage: bench/pgo.sh [OUT]   (default pgo/gompi.pgo; run from anywhere)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-pgo/gompi.pgo}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Profiles are taken from a build without PGO, so that the profile does not
# describe the inlining of an earlier profile.
go build -pgo=off -o "$tmp/gorun" ./cmd/gorun
go build -pgo=off -o "$tmp/gompi-bench" ./cmd/gompi-bench
run() { # NAME BTL MODE SIZES
	"$tmp/gorun" -np 2 --btl "$2" "$tmp/gompi-bench" "$3" --sizes "$4" --batches 41 \
		--cpuprofile "$tmp/$1" --csv >/dev/null
}
run sm-lat self,sm latency 0,8,64,512,4k,16k,64k
run sm-rate self,sm rate 8,512,4k
run sm-bw self,sm bw 4k,64k,1m
run sm-bibw self,sm bibw 16k,64k,1m
run tcp-lat self,tcp latency 0,8,512,4k,64k
run tcp-bw self,tcp bw 64k,1m
go test -pgo=off -c -o "$tmp/mpi.test" ./mpi
"$tmp/mpi.test" -test.run '^$' -test.bench 'SelfPingPong' -test.benchtime 2s \
	-test.cpuprofile "$tmp/self.rank0" >/dev/null
mkdir -p "$(dirname "$out")"
go tool pprof -proto "$tmp"/*.rank* >"$out"
echo "wrote $out ($(wc -c <"$out") bytes) from: $(cd "$tmp" && ls ./*.rank* | tr '\n' ' ')"
