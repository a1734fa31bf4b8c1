# gate.sh - sourced by the bench scripts after they made $BIN: builds the
# anchor's cache-line probe (c2c.c, from $ANCHOR) there and defines quiet,
# which is true when QUIET_NS is 0 (unset) or the probe reads below
# QUIET_NS nanoseconds (the host's fast regime; CONTRIBUTING.md); gated,
# which runs one measurement in that regime; pair, which runs one gompi
# and one Open MPI measurement back to back in it; pair_table, their
# medians; ab_tables, the medians and paired ratios of alternated builds;
# and build_side_by_side, the binaries of a bench program and its C twin.
ANCHOR=${ANCHOR:-/work/shared/anchor}
QUIET_NS=${QUIET_NS:-0}
gcc -O2 -o "$BIN/c2c" "$ANCHOR/c2c.c" -lpthread
quiet() {
	[ "$QUIET_NS" = 0 ] && return 0
	awk -v p="$(timeout 30 "$BIN/c2c" | tail -1 || echo 9999)" -v q="$QUIET_NS" 'BEGIN { exit !(p + 0 < q + 0) }'
}
# gated CMD...: prints what CMD prints, run in the fast regime: it waits
# (up to a minute) for it, and runs CMD again (at most three tries) when
# the probe after it does not read it. A CMD that fails prints nothing
# here and a line on stderr.
gated() {
	local out=
	for _ in 1 2 3; do
		for _ in $(seq 60); do quiet && break; sleep 1; done
		out=$("$@") || { echo "gated: $1 failed (exit $?)" >&2; out=; }
		quiet && break
	done
	printf '%s\n' "$out"
}
# build_side_by_side PROG: $BIN/gorun, $BIN/PROG from ./bench/PROG and
# $BIN/PROG-ompi from bench/PROG.c (Open MPI's mpicc).
build_side_by_side() {
	go build -o "$BIN/gorun" ./cmd/gorun
	go build -o "$BIN/$1" "./bench/$1"
	mpicc.openmpi -O2 -Wall -o "$BIN/$1-ompi" "bench/$1.c"
}
# pair sets g and o to the figures that the caller's functions gompi_run
# and ompi_run print: it waits (up to a minute) for the fast regime, runs
# both, and runs them again (at most three tries) when the probe after
# them does not read the fast regime. A run that fails (its exit status,
# a timeout) gives FAIL, which pair_table leaves out of the medians, and
# a line on stderr: the other runs go on.
pair() {
	for _ in 1 2 3; do
		for _ in $(seq 60); do quiet && break; sleep 1; done
		g=$(gompi_run) || { echo "pair: a gompi run failed (exit $?)" >&2; g=FAIL; }
		o=$(ompi_run) || { echo "pair: an Open MPI run failed (exit $?)" >&2; o=FAIL; }
		quiet && break
	done
}
# pair_table FILE: from lines "rROUND KEY... gompi=G ompi=O", one
# Markdown row per KEY: "| KEY fields | median G | median O | ratio of the
# medians | median of the rounds' G/O |". The last, the paired ratio, is
# the one to quote on a guest whose runs fall into a fast and a slow state:
# it compares runs made one after the other.
pair_table() {
	awk '{ k = $2; for (i = 3; i < NF - 1; i++) k = k " | " $i
  gv = substr($(NF - 1), 7); ov = substr($NF, 6)
  if (gv ~ /^[0-9.]+$/) g[k] = g[k] " " gv
  if (ov ~ /^[0-9.]+$/) o[k] = o[k] " " ov
  if (gv ~ /^[0-9.]+$/ && ov ~ /^[0-9.]+$/ && ov + 0 > 0) q[k] = q[k] " " gv / ov }
function med(s,   a, n, i, j, v) { n = split(s, a, " ")
  for (i = 2; i <= n; i++) { v = a[i] + 0; for (j = i - 1; j >= 1 && a[j] + 0 > v; j--) a[j + 1] = a[j]; a[j + 1] = v }
  return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
END { for (k in g) { mg = med(g[k]); if (o[k] == "") { printf "| %s | %.3f | FAIL | - | - |\n", k, mg; continue }
  mo = med(o[k]); printf "| %s | %.3f | %.3f | %.2fx | %.2fx |\n", k, mg, mo, mg / mo, med(q[k]) } }' "$1"
}
# ab_tables FILE LABEL: from lines "rROUND BUILD key=value ...", each
# BUILD's median (min-max) per key over the rounds, then, with more than
# one build, each build's value over the first build's in the same round:
# the median (min-max) of those ratios and in how many rounds it was above
# 1. On a guest whose runs fall into a fast and a slow state, the medians
# depend on how many runs each build had in each state; the paired ratios
# much less. Plain POSIX awk and sort (Debian's default awk, mawk, has no
# asort): the values of a group are sorted lines, the median the middle one.
ab_tables() {
	local tab first
	tab=$(printf '\t')
	first=$(awk 'NR == 1 { print $2 }' "$1")
	echo "# median (min-max) over the rounds, $2:"
	awk '{ for (i = 3; i <= NF; i++) { split($i, kv, "="); printf "%s %s\t%s\n", $2, kv[1], kv[2] } }' "$1" |
		sort -t "$tab" -k1,1 -k2,2g |
		awk -F '\t' 'function out() { printf "%s  %s (%s-%s)\n", k, a[int((n + 1) / 2)], a[1], a[n]; n = 0 }
			$1 != k && n > 0 { out() }
			{ k = $1; a[++n] = $2 }
			END { if (n > 0) out() }'
	[ "$(awk '{ print $2 }' "$1" | sort -u | wc -l)" -gt 1 ] || return 0
	echo "# paired with $first: median (min-max) of the ratio, rounds above 1, $2:"
	awk -v first="$first" '{ for (i = 3; i <= NF; i++) { split($i, kv, "="); v[$1, $2, kv[1]] = kv[2]; if (!(kv[1] in seen)) { seen[kv[1]]; keys[++nk] = kv[1] } }
			if (!($2 in bseen)) { bseen[$2]; builds[++nb] = $2 }; rounds[$1] }
		END { for (r in rounds) for (b = 1; b <= nb; b++) if (builds[b] != first) for (s = 1; s <= nk; s++) {
			base = v[r, first, keys[s]]; x = v[r, builds[b], keys[s]]
			if (base > 0 && x != "") printf "%s %s\t%.4f\n", builds[b], keys[s], x / base } }' "$1" |
		sort -t "$tab" -k1,1 -k2,2g |
		awk -F '\t' 'function out() { printf "%s  %.3f (%.3f-%.3f) %d/%d\n", k, a[int((n + 1) / 2)], a[1], a[n], above, n; n = 0; above = 0 }
			$1 != k && n > 0 { out() }
			{ k = $1; a[++n] = $2; if ($2 > 1) above++ }
			END { if (n > 0) out() }'
}
