#!/usr/bin/env bash
# backup_copy_export_test.sh — the export of a backup copy (CopyBackup) lists its pieces in key
# order, so it verifies, imports and restores like the export of any backup (it listed them in
# the order the copy placed them on its nodes, and verify, import and restore --target refused
# it as damaged):
#   1. instance of two clusters (east, west) of two nodes, 256 KiB split threshold: table ps
#      pre-split at b, d, f, h with a row in each range, table sp split while it loads (its
#      pieces share SSTables);
#   2. backups of both in east, copied into west;
#   3. each copy exported from west: the MANIFEST's pieces sorted by start key, each starting
#      where the previous one ends (the key space covered once), and `verify` takes it;
#   4. each export imported into east and restored there: every row back.
# Skips (77) without cbt or python3.
# Usage: backup_copy_export_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
if [ -z "$CBT" ]; then echo "cbt not installed: skipping"; exit 77; fi
command -v python3 >/dev/null || { echo "python3 not installed: skipping"; exit 77; }

instance_init backup_copy_export_test
FAIL_TAIL_LINES=20
bk() { timeout 120 "$STRATA" backup --dir "$DIR" --quiet "$@"; }
cbtx() {
  BIGTABLE_EMULATOR_HOST=127.0.0.1:$PORT timeout 60 "$CBT" -project p -instance i "$@" 2>&1 | grep -v 'creds flag unset'
  return "${PIPESTATUS[0]}"
}
# pieces_sorted MANIFEST: the piece lines' ranges, in the file's order, tile the key space
pieces_sorted() {
  python3 - "$1" <<'EOF'
import sys
prev = None
for line in open(sys.argv[1]):
    f = line.split()
    if f[0] != 'piece':
        continue
    start = '' if f[2] == '-' else f[2]
    if prev is None and start != '' or prev is not None and (prev == '' or bytes.fromhex(prev) != bytes.fromhex(start)):
        sys.exit('piece %s starts at %r, the piece before ends at %r' % (f[1], start, prev))
    prev = '' if f[3] == '-' else f[3]
sys.exit(0 if prev == '' else 'the last piece ends at %r' % prev)
EOF
}

echo "== 1. two clusters; ps pre-split, sp split while loading"
"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 2 --nodes 2 --split-bytes 262144 >"$TMPD/up.out" 2>&1 ||
  fail "strata up failed: $(cat "$TMPD/up.out")"
cbtx createtable ps splits=b,d,f,h >/dev/null && cbtx createfamily ps cf >/dev/null || fail "creating ps"
for k in a c e g i j; do cbtx set ps "$k" cf:q="v$k" >/dev/null || fail "writing ps row $k"; done
timeout 120 "$STRATA" bench --dir "$DIR" --project p --instance i --table sp --workload bulkwrite \
  --dist sequential --keys 32 --requests 1 --value-size 65536 --no-lag --quiet >"$TMPD/1l.out" 2>&1 ||
  fail "loading sp: $(cat "$TMPD/1l.out")"
sp_rows=$(cbtx count sp)
[ "$sp_rows" -eq 32 ] || fail "sp holds $sp_rows rows, not 32"

for t in ps sp; do
  echo "== 2. $t: backup in east, copied into west"
  bk create "$t" --id "b$t" --cluster east --expire 1d --wait >"$TMPD/2$t.out" 2>&1 || fail "create b$t: $(cat "$TMPD/2$t.out")"
  bk copy "b$t" --to west --as "c$t" --wait >"$TMPD/2c$t.out" 2>&1 || fail "copy b$t: $(cat "$TMPD/2c$t.out")"

  echo "== 3. $t: the copy's export lists its pieces in key order and verifies"
  bk --cluster west export "c$t" "$TMPD/ex-$t" >"$TMPD/3$t.out" 2>&1 || fail "export c$t: $(cat "$TMPD/3$t.out")"
  grep '^piece' "$TMPD/ex-$t/MANIFEST" | cut -c1-80
  pieces_sorted "$TMPD/ex-$t/MANIFEST" || fail "c$t's export does not list its pieces in key order"
  n=$(grep -c '^piece' "$TMPD/ex-$t/MANIFEST")
  [ "$n" -ge 2 ] || fail "c$t has $n piece(s): the test wants a table of several tablets"
  "$STRATA" backup verify "$TMPD/ex-$t" --quiet >"$TMPD/3v$t.out" 2>&1 || fail "verify of c$t's export: $(cat "$TMPD/3v$t.out")"

  echo "== 4. $t: imported into east and restored"
  bk import "$TMPD/ex-$t" --cluster east --as "i$t" >"$TMPD/4$t.out" 2>&1 || fail "import of c$t's export: $(cat "$TMPD/4$t.out")"
  bk restore "i$t" --to "r$t" --wait >"$TMPD/4r$t.out" 2>&1 || fail "restore of i$t: $(cat "$TMPD/4r$t.out")"
  want=$(cbtx count "$t")
  got=$(cbtx count "r$t")
  [ "$got" = "$want" ] || fail "r$t holds $got rows, $t $want"
  echo "ok: $n pieces in key order; r$t holds $got rows"
done
echo PASS
