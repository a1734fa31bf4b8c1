#!/usr/bin/env bash
# locked-samples.sh - how much of a CPU profile sits right after locked
# instructions (LOCK-prefixed or XCHG): perf charges a locked instruction's
# cost to the instruction after it. Prints, per hot function, that share of
# all samples. For example, on the PML's 8 B round trip over sm:
#   go test -c -o /tmp/smpml.test ./pml/smpml
#   perf record -o /tmp/perf.rt /tmp/smpml.test -test.run XXX -test.bench 'PMLRoundTrip/size=8B$' -test.benchtime 3s
#   bench/locked-samples.sh /tmp/perf.rt
# Needs perf and python3.
set -euo pipefail
data=${1:?usage: locked-samples.sh PERF_DATA [FUNCTIONS]}
n=${2:-25}
perf report -i "$data" --no-children --stdio 2>/dev/null | grep -E '^ +[0-9]' | head -"$n" | awk '{print $1, $5}' |
	while read -r pct fn; do
		perf annotate -i "$data" --stdio -s "$fn" 2>/dev/null | grep -E '^\s+[0-9.]+ :' |
			python3 -c '
import re, sys
pct, fn = float(sys.argv[1].rstrip("%")), sys.argv[2]
tot, prev = 0.0, ""
for l in sys.stdin:
    m = re.match(r"\s+([0-9.]+)\s*:\s*[0-9a-f]+:\s*(.*)", l)
    if not m:
        continue
    if prev.startswith(("lock", "xchg")):
        tot += float(m.group(1))
    prev = m.group(2).strip()
if tot > 0:
    print(f"{pct*tot/100:5.2f}% of all samples ({tot:4.1f}% of {fn})")
' "$pct" "$fn"
	done
