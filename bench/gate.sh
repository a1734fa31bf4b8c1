# gate.sh - sourced by the bench scripts after they made $BIN: builds the
# anchor's cache-line probe (c2c.c, from $ANCHOR) there and defines quiet,
# which is true when QUIET_NS is 0 (unset) or the probe reads below
# QUIET_NS nanoseconds (the host's fast regime; CONTRIBUTING.md).
ANCHOR=${ANCHOR:-/work/shared/anchor}
QUIET_NS=${QUIET_NS:-0}
gcc -O2 -o "$BIN/c2c" "$ANCHOR/c2c.c" -lpthread
quiet() {
	[ "$QUIET_NS" = 0 ] && return 0
	awk -v p="$(timeout 30 "$BIN/c2c" | tail -1 || echo 9999)" -v q="$QUIET_NS" 'BEGIN { exit !(p + 0 < q + 0) }'
}
