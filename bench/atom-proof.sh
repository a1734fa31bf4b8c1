#!/bin/bash
# atom-proof.sh - what each piece of internal/atom buys on this guest: four
# gompi-bench builds of the current commit, each differing from the first
# in one piece, alternated round by round over sm by bench/ab.sh (rate 8 B,
# then latency 0, 8 and 64 B). The figures go into the table of
# internal/atom's package doc, one column per guest kind.
#
#   base        the commit as it is
#   xchg        StoreRel64 an XCHG (sync/atomic's Store) instead of a MOV
#   noprefetch  PrefetchW and Prefetch do nothing
#   neither     both: what sync/atomic alone would give
#
# Usage: bench/atom-proof.sh ROUNDS   (8 is enough to see a 2% difference
# on a quiet guest). QUIET_NS as for bench/ab.sh. amd64 only; run from the
# repository root with a clean work tree (the builds are of HEAD).
set -euo pipefail
[ $# -eq 1 ] || { sed -n '2,16p' "$0"; exit 2; }
ROUNDS=$1
[ "$(go env GOARCH)" = amd64 ] || { echo "atom-proof.sh: internal/atom's assembly is amd64 only" >&2; exit 2; }
W=$(mktemp -d)
cleanup() {
  for v in base xchg noprefetch neither; do
    git worktree remove --force "$W/$v" 2>/dev/null || true
  done
  git worktree prune
  rm -rf "$W"
}
trap cleanup EXIT
for v in base xchg noprefetch neither; do
  git worktree add -q -f --detach "$W/$v" HEAD
done
# Each change must apply exactly, or the build would measure nothing.
s=internal/atom/rel_amd64.s
grep -q '^	MOVQ BX, (AX)$' "$W/xchg/$s"
sed -i 's/^	MOVQ BX, (AX)$/	XCHGQ BX, (AX)/' "$W/xchg/$s"
grep -q '^	BYTE \$0x0F; BYTE \$0x0D; BYTE \$0x08$' "$W/noprefetch/$s"
grep -q '^	PREFETCHT0 (AX)$' "$W/noprefetch/$s"
for v in noprefetch neither; do
  sed -i -e '/^	BYTE \$0x0F; BYTE \$0x0D; BYTE \$0x08$/d' -e '/^	PREFETCHT0 (AX)$/d' "$W/$v/$s"
done
sed -i 's/^	MOVQ BX, (AX)$/	XCHGQ BX, (AX)/' "$W/neither/$s"
for v in base xchg noprefetch neither; do
  (cd "$W/$v" && go build -o "$W/$v.bin" ./cmd/gompi-bench)
done
echo "# internal/atom pieces, $ROUNDS rounds, gompi $(git rev-parse --short HEAD), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
echo "# builds: base=$W/base.bin xchg noprefetch neither; rate also against Open MPI (ompi)"
bench/ab.sh "$ROUNDS" rate 8 ompi "$W/base.bin" "$W/xchg.bin" "$W/noprefetch.bin" "$W/neither.bin"
bench/ab.sh "$ROUNDS" latency 0,8,64 "$W/base.bin" "$W/xchg.bin" "$W/noprefetch.bin" "$W/neither.bin"
