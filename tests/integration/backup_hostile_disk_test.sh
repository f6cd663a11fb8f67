#!/usr/bin/env bash
# backup_hostile_disk_test.sh — backups on a node whose disk is full (docs/backups.md): the node's
# data directory is a 48 MiB tmpfs, filled up with a file after the table is loaded.
#   1. import of a 4 MiB export: refused naming "No space left on device", the backup not left
#      behind, no piece directory left on the node, the node still serves reads;
#   2. CreateBackup of a table with 4 MiB in its memtable (the freeze must flush them): the
#      operation fails RESOURCE_EXHAUSTED saying the disk is full, no backup and no piece left,
#      the source table's rows intact;
#   3. the filler removed: the same import and create succeed, and the imported backup restores.
# Needs root (mount -t tmpfs); skips (77) without it, or without cbt.
# Usage: backup_hostile_disk_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
if [ -z "$CBT" ]; then echo "cbt not installed: skipping"; exit 77; fi
[ "$(id -u)" = 0 ] || { echo "not root (cannot mount a small tmpfs): skipping"; exit 77; }
instance_init backup_hostile_disk_test
MNT=$DIR/east-0
mkdir -p "$MNT"
mount -t tmpfs -o size=48m tmpfs "$MNT" 2>/dev/null || { echo "cannot mount a tmpfs: skipping"; exit 77; }
finish() {
  "$STRATA" down --dir "$DIR" >/dev/null 2>&1
  umount "$MNT" 2>/dev/null || umount -l "$MNT"
  instance_teardown
}
trap finish EXIT
bk() { timeout 120 "$STRATA" backup --dir "$DIR" --quiet "$@"; }
cbtq() {
  BIGTABLE_EMULATOR_HOST=127.0.0.1:$PORT timeout 60 "$CBT" -project p -instance i "$@" 2>&1 | grep -v 'creds flag unset'
  return "${PIPESTATUS[0]}"
}
BKD=$MNT/backups/i/east

"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 1 --nodes 1 >/dev/null || fail "strata up failed"
"$STRATA" bench --dir "$DIR" --project p --instance i --table big --workload bulkwrite \
  --dist sequential --keys 64 --requests 1 --value-size 65536 --no-lag --quiet >"$TMPD/load" 2>&1 ||
  fail "load: $(tail -3 "$TMPD/load")"
bk create big --id src --wait >/dev/null || fail "create src"
bk export src "$TMPD/exp" >/dev/null || fail "export src"
# 4 MiB in table small's memtable: a freeze must flush it, which the full disk cannot hold
"$STRATA" bench --dir "$DIR" --project p --instance i --table small --workload bulkwrite \
  --dist sequential --keys 64 --requests 1 --value-size 65536 --no-lag --quiet >"$TMPD/load" 2>&1 ||
  fail "load small: $(tail -3 "$TMPD/load")"
cbtq read small >"$TMPD/small.before" || fail "read small"
BIG=$(cbtq count big | tail -1)
# fill the disk, leaving about 1 MiB
avail=$(df -m --output=avail "$MNT" | tail -1)
dd if=/dev/zero of="$MNT/filler" bs=1M count=$((avail - 1)) >/dev/null 2>&1
echo "disk: $(df -h --output=used,avail "$MNT" | tail -1)"

echo "== 1. import onto a full disk"
bk import "$TMPD/exp" --as imp >/dev/null 2>"$TMPD/1.err" && fail "import onto a full disk succeeded"
grep -q 'No space left on device' "$TMPD/1.err" || fail "import: $(cat "$TMPD/1.err")"
grep -q 'was deleted' "$TMPD/1.err" || fail "import did not delete its backup: $(cat "$TMPD/1.err")"
bk describe imp >/dev/null 2>&1 && fail "imp stayed after a failed import"
[ -z "$(ls -A "$BKD/imp" 2>/dev/null)" ] || fail "pieces left: $(find "$BKD/imp")"
[ "$(cbtq count big | tail -1)" = "$BIG" ] || fail "big does not read $BIG rows with the disk full"
echo "ok: $(head -c 300 "$TMPD/1.err")"

echo "== 2. CreateBackup with the disk full (the freeze must flush)"
bk create small --id full --wait >/dev/null 2>"$TMPD/2.err" && fail "create on a full disk succeeded"
grep -q 'No space left on device' "$TMPD/2.err" || fail "create: $(cat "$TMPD/2.err")"
bk describe full >/dev/null 2>&1 && fail "the failed backup stayed"
[ -z "$(ls -A "$BKD/full" 2>/dev/null)" ] || fail "pieces left: $(find "$BKD/full")"
cbtq read small >"$TMPD/small.full"
diff "$TMPD/small.before" "$TMPD/small.full" >/dev/null || fail "small changed: $(cat "$TMPD/small.full")"
echo "ok: $(head -c 400 "$TMPD/2.err")"

echo "== 3. space back: import and create succeed"
rm -f "$MNT/filler"
bk import "$TMPD/exp" --as imp >/dev/null 2>"$TMPD/3.err" || fail "import after: $(cat "$TMPD/3.err")"
bk create small --id full --wait >/dev/null 2>"$TMPD/3c.err" || fail "create after: $(cat "$TMPD/3c.err")"
bk restore imp --to bigr --wait >/dev/null || fail "restore imp"
[ "$(cbtq count bigr | tail -1)" = "$BIG" ] || fail "bigr has not $BIG rows"
cbtq read small >"$TMPD/small.after"
diff "$TMPD/small.before" "$TMPD/small.after" >/dev/null || fail "small changed after"
echo PASS
