#!/usr/bin/env bash
# backup_damaged_test.sh — a backup whose file is damaged on disk is never restored into a table
# that then fails its reads (docs/backups.md, "Damaged backups"):
#   1. one cluster, one node: table t (300 rows), backup b1; one byte of b1's SSTable is flipped
#      (in a copy put in place of the piece's file: the piece's file is a hard link of the live
#      SSTable, which stays whole). `restore b1 --to t2` fails DATA_LOSS naming the backup, the
#      file and what to do, and no table t2 is left; backup b2 of the same table (whole files)
#      restores into t3, which reads all 300 rows;
#   2. two clusters of one node: the same damage in a backup of east; `copy --to west` fails
#      naming the source backup and saying its file is damaged (not "the copy"), and
#      `restore` fails DATA_LOSS and leaves no table.
# Skips (77) without cbt or python3.
# Usage: backup_damaged_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
if [ -z "$CBT" ]; then echo "cbt not installed: skipping"; exit 77; fi
command -v python3 >/dev/null || { echo "python3 not installed: skipping"; exit 77; }

instance_init backup_damaged_test
DIRB=$TMPD/instb
PORTB=$(free_port)
finish() {
  "$STRATA" down --dir "$DIRB" >/dev/null 2>&1
  instance_teardown
}
trap finish EXIT

cbtat() { # cbtat PORT ARGS...
  local port=$1
  shift
  BIGTABLE_EMULATOR_HOST=127.0.0.1:$port timeout 60 "$CBT" -project p -instance i "$@" 2>&1 |
    grep -v 'creds flag unset'
  return "${PIPESTATUS[0]}"
}
# rows PORT TABLE: table TABLE with 300 rows of 200 bytes (several SSTable blocks), one cbt call
rows() {
  cbtat "$1" createtable "$2" families=cf >/dev/null || fail "createtable $2"
  python3 -c '
print(",cf,cf")
print(",v,w")
import hashlib
for i in range(300): print("r%03d,%s,%d" % (i, hashlib.sha256(b"%d" % i).hexdigest() * 3, i))' >"$TMPD/rows.csv"
  cbtat "$1" import "$2" "$TMPD/rows.csv" column-family=cf >"$TMPD/import.out" ||
    fail "cbt import: $(cat "$TMPD/import.out")"
}
# damage INSTDIR BACKUP: flips one byte in the middle of the backup's one SSTable, in a copy put
# in place of the piece's file (the live SSTable it is a hard link of stays whole); prints the
# file's name
damage() {
  local f
  f=$(find "$1" -path "*/backups/*/$2/*" -name '*.sst' | head -n1)
  [ -n "$f" ] || fail "no SSTable of backup $2 under $1"
  python3 - "$f" <<'PY' || fail "damaging $f"
import os, shutil, sys
f = sys.argv[1]
shutil.copyfile(f, f + ".x")
with open(f + ".x", "r+b") as h:
    at = os.path.getsize(f) // 3
    h.seek(at); b = h.read(1); h.seek(at); h.write(bytes([b[0] ^ 1]))
os.rename(f + ".x", f)
PY
  basename "$f"
}
# no_table PORT TABLE: TABLE does not exist (the cleanup of a failed restore has dropped it)
no_table() {
  local i
  for i in $(seq 1 50); do
    cbtat "$1" ls >"$TMPD/ls.out" || fail "cbt ls: $(cat "$TMPD/ls.out")"
    grep -qx "$2" "$TMPD/ls.out" || return 0
    sleep 0.2
  done
  fail "table $2 exists after its restore failed: $(cat "$TMPD/ls.out")"
}

# op_code INSTDIR NAME CODE: the router logged the failed operation on NAME (its operation name
# holds it) with CODE (the CLI prints the operation's message, not its code)
op_code() {
  grep -Eq "operation operations/[^ ]*/$2/[0-9]+: $3: " "$1/logs/router.log" ||
    fail "no operation on $2 failed $3: $(grep -E "operation operations/[^ ]*/$2/" "$1/logs/router.log")"
}

echo "== 1. one cluster: a damaged backup is not restored, a whole one is"
"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 1 --nodes 1 >"$TMPD/up.out" 2>&1 ||
  fail "strata up: $(cat "$TMPD/up.out")"
bk() { timeout 120 "$STRATA" backup --dir "$DIR" --quiet "$@"; }
rows "$PORT" t
bk create t --id b1 --wait >/dev/null || fail "create b1"
bk create t --id b2 --wait >/dev/null || fail "create b2"
file=$(damage "$DIR" b1)
bk restore b1 --to t2 --wait >"$TMPD/1.out" 2>&1 && fail "the damaged b1 restored: $(cat "$TMPD/1.out")"
for want in "file $file of piece" "backups/b1 on node" "CRC32C" "restore from another backup" \
  "another cluster or an export"; do
  grep -q "$want" "$TMPD/1.out" || fail "restore b1 does not say '$want': $(cat "$TMPD/1.out")"
done
op_code "$DIR" t2 DATA_LOSS
echo "ok: $(grep -o "file $file.*" "$TMPD/1.out" | head -c 400)"
no_table "$PORT" t2
bk restore b2 --to t3 --wait >"$TMPD/1b.out" 2>&1 || fail "restore b2: $(cat "$TMPD/1b.out")"
n=$(cbtat "$PORT" count t3 | tail -n1)
[ "$n" = 300 ] || fail "t3 counts '$n' rows, not 300"
echo "ok: b2 restored, 300 rows"

echo "== 2. two clusters: the pull names the source backup's file"
"$STRATA" up --dir "$DIRB" --port "$PORTB" --clusters 2 --nodes 1 >"$TMPD/upb.out" 2>&1 ||
  fail "strata up (2 clusters): $(cat "$TMPD/upb.out")"
bkb() { timeout 120 "$STRATA" backup --dir "$DIRB" --quiet "$@"; }
rows "$PORTB" t
bkb create t --id b1 --wait >/dev/null || fail "create b1 (2 clusters)"
file=$(damage "$DIRB" b1)
bkb copy b1 --to west --as c1 --wait >"$TMPD/2.out" 2>&1 && fail "the damaged b1 was copied: $(cat "$TMPD/2.out")"
op_code "$DIRB" c1 DATA_LOSS
for want in "of projects/p/instances/i/clusters/east/backups/b1 from" "file $file has CRC32C" \
  "the source backup's file is damaged, not the copy" "another cluster or an export"; do
  grep -q "$want" "$TMPD/2.out" || fail "copy b1 does not say '$want': $(cat "$TMPD/2.out")"
done
grep -q "send the file again" "$TMPD/2.out" && fail "copy b1 advises sending again: $(cat "$TMPD/2.out")"
echo "ok: $(grep -o "pulling piece.*" "$TMPD/2.out" | head -c 400)"
bkb restore b1 --to t2 --wait >"$TMPD/2b.out" 2>&1 && fail "the damaged b1 restored: $(cat "$TMPD/2b.out")"
op_code "$DIRB" t2 DATA_LOSS
grep -q "send the file again" "$TMPD/2b.out" && fail "restore b1 advises sending again: $(cat "$TMPD/2b.out")"
no_table "$PORTB" t2
echo "ok: $(grep -o "failed: .*" "$TMPD/2b.out" | head -c 400)"
echo "PASS"
