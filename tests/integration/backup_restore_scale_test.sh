#!/usr/bin/env bash
# backup_restore_scale_test.sh — restores of imports with thousands of pieces make few tablets
# where pieces hold nothing, spread the empty ones over the nodes, and never hold a node's loop
# (docs/backups.md, "Restore", "Export and import"). One local instance (`strata up`, one
# cluster of three nodes), a one-piece export re-signed here into exports of many pieces:
#   1. 4,000 pieces, the first holding the export's file, the others empty: the import merges the
#      3,999 empty ones into one piece, so the restore makes 2 tablets (it made 4,000, one by one
#      on one node, each slower than the last) and reads the row;
#   2. 2,000 pieces, every other one holding the (shared) file: the holders stay together on one
#      node, the 1,000 empty ones go half to each of the two other nodes (all of them went to one
#      node); a node makes its 1,000 tablets in batches (one catalog save and one storage manifest
#      write per batch: one per tablet cost n^2), and while the restore runs a read of another
#      table through the router answers every time and no node logs `event loop blocked`.
# Usage: backup_restore_scale_test.sh PATH/TO/strata PATH/TO/bk_crc32c
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
CRC32C=$2
if [ -z "$CBT" ]; then echo "cbt not installed: skipping"; exit 77; fi
command -v python3 >/dev/null || { echo "python3 not installed: skipping"; exit 77; }
instance_init backup_restore_scale_test
bk() { timeout 300 "$STRATA" backup --dir "$DIR" --quiet "$@"; }
cbtq() {
  BIGTABLE_EMULATOR_HOST=127.0.0.1:$PORT timeout 60 "$CBT" -project p -instance i "$@" 2>&1 | grep -v 'creds flag unset'
  return "${PIPESTATUS[0]}"
}

# manypieces SRC DST N MODE: a copy of the one-piece export SRC whose manifest lists N pieces
# [-, k000001), [k000001, k000002), ... [k00N-1, -), re-signed. MODE first: only the first piece
# lists SRC's file; alternate: every even-numbered piece does. The first piece keeps SRC's piece
# id, which format 3's file lines name as the holder.
manypieces() {
  python3 - "$@" "$CRC32C" <<'PY'
import hashlib, shutil, subprocess, sys
src, dst, n, mode, crctool = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
shutil.copytree(src, dst)
lines = [l for l in open(dst + "/MANIFEST").read().split("\n") if l and not l.startswith("end ")]
out = [l for l in lines if not l.startswith(("piece ", "file "))]
first = [l for l in lines if l.startswith("piece ")][0].split()
orig, frozen = first[1], first[4]
f = [l for l in lines if l.startswith("file ")][0]
for i in range(n):
    s = "-" if i == 0 else ("k%06d" % i).encode().hex()
    e = "-" if i == n - 1 else ("k%06d" % (i + 1)).encode().hex()
    out.append("piece %s %s %s %s" % (orig if i == 0 else "p%d" % i, s, e, frozen))
    if i == 0 or (mode == "alternate" and i % 2 == 0):
        out.append(f)
text = ("\n".join(out) + "\n").encode()
open(dst + "/MANIFEST", "wb").write(text)
crc = subprocess.check_output([crctool, dst + "/MANIFEST"]).strip()
open(dst + "/MANIFEST", "ab").write(b"end %s %s\n" % (crc, hashlib.sha256(text).hexdigest().encode()))
PY
}

# restored TABLE LOG: how many tablets of TABLE the node of LOG restored.
restored() { grep -c "event=tablet_restored table=[^ ]*/tables/$1 " "$2"; }

"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 1 --nodes 3 >"$TMPD/up.out" 2>&1 ||
  { cat "$TMPD/up.out"; fail "strata up"; }
cbtq createtable t families=cf >/dev/null || fail "createtable t"
cbtq set t a cf:c=v >/dev/null || fail "set a"
bk create t --id src --wait >/dev/null || fail "create src"
bk export src "$TMPD/one" >/dev/null || fail "export src"
manypieces "$TMPD/one" "$TMPD/e4k" 4000 first || fail "writing the 4,000-piece export"
manypieces "$TMPD/one" "$TMPD/alt" 2000 alternate || fail "writing the 2,000-piece export"
"$STRATA" backup verify "$TMPD/e4k" --quiet >/dev/null || fail "the re-signed export does not verify"

echo "== 1. 3,999 adjacent empty pieces are one piece: the restore makes 2 tablets"
bk import "$TMPD/e4k" --as e4k >/dev/null 2>"$TMPD/1.err" || fail "import e4k: $(cat "$TMPD/1.err")"
grep -q 'e4k: begun (4000 pieces, 2 once runs of empty ones are merged)' "$DIR/logs/router.log" ||
  fail "BeginImport did not merge the empty pieces: $(grep 'e4k: begun' "$DIR/logs/router.log")"
bk restore e4k --to e4k --wait >/dev/null 2>"$TMPD/1.err" || fail "restore e4k: $(cat "$TMPD/1.err")"
made=0
for f in "$DIR"/logs/east-*.log; do made=$((made + $(restored e4k "$f"))); done
[ "$made" -eq 2 ] || fail "the restore of e4k made $made tablets, not 2"
[ "$(cbtq count e4k | tail -1)" = 1 ] || fail "e4k does not hold row a: $(cbtq count e4k)"
echo "ok: 2 tablets"

echo "== 2. 2,000 pieces, half empty: spread, made in batches, the nodes keep answering"
bk import "$TMPD/alt" --as alt >/dev/null 2>"$TMPD/2.err" || fail "import alt: $(cat "$TMPD/2.err")"
bk restore alt --to alt >"$TMPD/2.out" 2>&1 || fail "restore alt: $(cat "$TMPD/2.out")"
probes=0
while true; do # each probe waits for its answer; the loop ends with the restore
  cbtq lookup t a >"$TMPD/2.probe" 2>&1 || fail "a read during the restore failed: $(cat "$TMPD/2.probe")"
  probes=$((probes + 1))
  n=0
  for f in "$DIR"/logs/east-*.log; do n=$((n + $(restored alt "$f"))); done
  [ "$n" -ge 2000 ] && break
  [ "$probes" -lt 3000 ] || fail "the restore of alt made $n of 2000 tablets" # hang guard
  sleep 0.2
done
counts=$(for f in "$DIR"/logs/east-*.log; do restored alt "$f"; done | sort -n | tr '\n' ' ')
[ "$counts" = "500 500 1000 " ] ||
  fail "tablets of alt per node: $counts (want the 1,000 empty pieces spread: 500 500 1000)"
grep -l 'event loop blocked' "$DIR"/logs/east-*.log &&
  fail "a node's loop was blocked during the restore: $(grep -h 'event loop blocked' "$DIR"/logs/east-*.log)"
for _ in $(seq 1 300); do # hang guard: the restore's operation ends after its last tablet
  [ "$(cbtq count alt 2>/dev/null | tail -1)" = 1 ] && break
  sleep 0.2
done
[ "$(cbtq count alt | tail -1)" = 1 ] || fail "alt does not hold row a: $(cbtq count alt)"
echo "ok: $probes reads answered during the restore; tablets per node: $counts"
echo PASS
