#!/usr/bin/env bash
# backup_damaged_sst_test.sh — a backup of a table whose live SSTable was damaged on disk fails
# instead of ending READY with a fresh CRC32C over the damage (which every later check of the
# backup would then accept, and every restore bring back). On `strata up` (one cluster, one
# node): rows are written and flushed by a first backup b0; with the node down, one byte inside
# the SSTable's first data block is flipped (a copy renamed over the file: b0's hard link keeps the
# sound bytes); after `strata up`, the node's background checksum pass logs the file damaged,
# and `strata backup create --wait` fails DATA_LOSS naming the file
# and what to do, no backup of that id is listed and no piece of it is left on the node, the
# tablet is read-only in `strata status`, and the sound b0 still restores every row
# (docs/backups.md "A damaged SSTable").
# Usage: backup_damaged_sst_test.sh PATH/TO/strata (skips, 77, without cbt or python3)
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
if [ -z "$CBT" ]; then echo "cbt not installed: skipping"; exit 77; fi
command -v python3 >/dev/null || { echo "python3 not installed: skipping"; exit 77; }
instance_init backup_damaged_sst
bk() { timeout 120 "$STRATA" backup --dir "$DIR" --quiet "$@"; }
cbtq() {
  BIGTABLE_EMULATOR_HOST=127.0.0.1:$PORT timeout 60 "$CBT" -project p -instance i "$@" 2>&1 | grep -v 'creds flag unset'
  return "${PIPESTATUS[0]}"
}

"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 1 --nodes 1 >/dev/null || fail "strata up failed"
cbtq createtable t families=cf >/dev/null || fail "createtable t"
for r in 1 2 3 4 5 6; do
  cbtq set t "r$r" "cf:a=$(head -c 3000 /dev/urandom | od -An -tx1 | tr -d ' \n')" >/dev/null ||
    fail "set r$r"
done
bk create t --id b0 --wait >/dev/null || fail "create b0" # flushes the rows into an SSTable

echo "== damage the live SSTable with the node down"
"$STRATA" down --dir "$DIR" >/dev/null || fail "strata down"
SST=$(ls "$DIR"/east-0/storage/sst/*.sst)
[ "$(echo "$SST" | wc -l)" = 1 ] || fail "expected one SSTable, found: $SST"
python3 - "$SST" <<'PY' || fail "flipping a byte"
import os, shutil, sys
f = sys.argv[1]
shutil.copyfile(f, f + '.x')
with open(f + '.x', 'r+b') as h:  # offset 100: inside data block 0, which starts the file
    h.seek(100); b = h.read(1); h.seek(100); h.write(bytes([b[0] ^ 1]))
os.rename(f + '.x', f)
PY
"$STRATA" up --dir "$DIR" --port "$PORT" >/dev/null || fail "strata up after the damage"

echo "== the node's background checksum pass finds the damage"
wait_line "$DIR/logs/east-0.log" "event=sst_damaged path=$SST reason=\"data block 0, block checksum mismatch" ||
  fail "the background pass did not report the damaged file"

echo "== a backup of the damaged table fails, naming the file"
bk create t --id bx --wait >"$TMPD/bx.out" 2>"$TMPD/bx.err" &&
  fail "the backup of a damaged SSTable ended: $(cat "$TMPD/bx.out")"
cat "$TMPD/bx.err"
grep -Eq "operation [^ ]*/backups/bx/[0-9]+: DATA_LOSS: .*SSTable $SST is damaged" \
  "$DIR"/logs/router.log || fail "the operation did not end DATA_LOSS naming the file"
grep -qF "SSTable $SST is damaged on this node, its tablet read-only" "$TMPD/bx.err" || fail "the file is not named"
grep -q "restore the tablet from the other cluster or a backup" "$TMPD/bx.err" ||
  fail "the error says nothing to do"
bk list >"$TMPD/list.out" 2>&1 || fail "backup list: $(cat "$TMPD/list.out")"
grep -q bx "$TMPD/list.out" && fail "backup bx is listed: $(cat "$TMPD/list.out")"
grep -q b0 "$TMPD/list.out" || fail "backup b0 is not listed: $(cat "$TMPD/list.out")"
left=$(find "$DIR"/east-0/backups -path '*bx*' -name '*.sst' 2>/dev/null)
[ -z "$left" ] || fail "pieces of bx are left: $left"
"$STRATA" status --dir "$DIR" >"$TMPD/status.out" 2>&1
grep -q "read-only after corruption" "$TMPD/status.out" ||
  fail "strata status shows no read-only tablet: $(cat "$TMPD/status.out")"
echo "ok"

echo "== the backup made before the damage restores every row"
bk restore b0 --to t2 --wait >/dev/null 2>"$TMPD/r.err" || fail "restore b0: $(cat "$TMPD/r.err")"
[ "$(cbtq count t2 | tail -1)" = 6 ] || fail "t2 does not hold 6 rows: $(cbtq count t2)"
echo "ok"
echo "PASS"
