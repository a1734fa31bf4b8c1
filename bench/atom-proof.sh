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
#   atommutex   sm's endpoints and the PML's engine lock with atom.Mutex (a
#               release-store Unlock whose waiters park with timed parks,
#               brought back by reverting 8fc252f) instead of sync.Mutex
#
# Usage: bench/atom-proof.sh ROUNDS   (8 is enough to see a 2% difference
# on a quiet guest). QUIET_NS as for bench/ab.sh. amd64 only; run from the
# repository root with a clean work tree (the builds are of HEAD).
set -euo pipefail
[ $# -eq 1 ] || { sed -n '2,18p' "$0"; exit 2; }
ROUNDS=$1
[ "$(go env GOARCH)" = amd64 ] || { echo "atom-proof.sh: internal/atom's assembly is amd64 only" >&2; exit 2; }
W=$(mktemp -d)
cleanup() {
  for v in base xchg noprefetch atommutex; do
    git worktree remove --force "$W/$v" 2>/dev/null || true
  done
  git worktree prune
  rm -rf "$W"
}
trap cleanup EXIT
for v in base xchg noprefetch atommutex; do
  git worktree add -q -f --detach "$W/$v" HEAD
done
# Each change must apply exactly, or the build would measure nothing.
s=internal/atom/rel_amd64.s
grep -q '^	MOVQ BX, (AX)$' "$W/xchg/$s"
sed -i 's/^	MOVQ BX, (AX)$/	XCHGQ BX, (AX)/' "$W/xchg/$s"
grep -q '^	BYTE \$0x0F; BYTE \$0x0D; BYTE \$0x08$' "$W/noprefetch/$s"
grep -q '^	PREFETCHT0 (AX)$' "$W/noprefetch/$s"
sed -i -e '/^	BYTE \$0x0F; BYTE \$0x0D; BYTE \$0x08$/d' -e '/^	PREFETCHT0 (AX)$/d' "$W/noprefetch/$s"
git -C "$W/atommutex" revert --no-commit 8fc252f >/dev/null
for v in base xchg noprefetch atommutex; do
  (cd "$W/$v" && go build -o "$W/$v.bin" ./cmd/gompi-bench)
done
echo "# internal/atom pieces, $ROUNDS rounds, gompi $(git rev-parse --short HEAD), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
echo "# builds: base=$W/base.bin xchg noprefetch atommutex"
bench/ab.sh "$ROUNDS" rate 8 "$W/base.bin" "$W/xchg.bin" "$W/noprefetch.bin" "$W/atommutex.bin"
bench/ab.sh "$ROUNDS" latency 0,8,64 "$W/base.bin" "$W/xchg.bin" "$W/noprefetch.bin" "$W/atommutex.bin"
