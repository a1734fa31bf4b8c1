# gate.sh - sourced by the bench scripts after they made $BIN: builds the
# anchor's cache-line probe (c2c.c, from $ANCHOR) there and defines quiet,
# which is true when QUIET_NS is 0 (unset) or the probe reads below
# QUIET_NS nanoseconds (the host's fast regime; CONTRIBUTING.md); pair,
# which runs one gompi and one Open MPI measurement back to back in that
# regime; and pair_table, their medians.
ANCHOR=${ANCHOR:-/work/shared/anchor}
QUIET_NS=${QUIET_NS:-0}
gcc -O2 -o "$BIN/c2c" "$ANCHOR/c2c.c" -lpthread
quiet() {
	[ "$QUIET_NS" = 0 ] && return 0
	awk -v p="$(timeout 30 "$BIN/c2c" | tail -1 || echo 9999)" -v q="$QUIET_NS" 'BEGIN { exit !(p + 0 < q + 0) }'
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
