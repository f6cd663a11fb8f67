#!/usr/bin/env bash
# backup_copy_place_test.sh — CopyBackup and a restore into the other clusters store a file that
# split pieces share once per destination node, not once per piece:
#   1. instance of two clusters (east, west) of two nodes, 256 KiB split threshold; table sp
#      split while it loads, its backup s1 in east has pieces sharing files;
#   2. `backup copy s1 --to west --as c1`: c1's size_bytes equals s1's, and west's files of c1
#      hold that many bytes (pieces sharing a file pulled onto one node, the file pulled once
#      and hard-linked into the others);
#   3. `restore s1 --to sp2`: west's disk grows by about the backup's size (the pulls of the
#      restore link shared files too), and the table has every row.
# Skips (77) without cbt or python3.
# Usage: backup_copy_place_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
if [ -z "$CBT" ]; then echo "cbt not installed: skipping"; exit 77; fi
command -v python3 >/dev/null || { echo "python3 not installed: skipping"; exit 77; }

instance_init backup_copy_place_test
FAIL_TAIL_LINES=20
bk() { timeout 300 "$STRATA" backup --dir "$DIR" --quiet "$@"; }
size_of() { # size_of ID CLUSTER: the backup's size_bytes
  bk describe "$1" --cluster "$2" --json | python3 -c 'import json, sys; v = json.load(sys.stdin); print(int(v.get("sizeBytes", v.get("size_bytes", -1))))'
}
uniq_bytes() { # uniq_bytes DIR...: bytes of the distinct files (hard links once) under DIR...
  find "$@" -type f -printf '%i %s\n' 2>/dev/null | sort -u | awk '{ n += $2 } END { print n + 0 }'
}
sst_bytes() { # sst_bytes DIR...: the same for the SSTables (not the pieces' manifests)
  find "$@" -type f -name '*.sst' -printf '%i %s\n' 2>/dev/null | sort -u | awk '{ n += $2 } END { print n + 0 }'
}

echo "== 1. two clusters, table sp split while loading, backup s1 in east"
"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 2 --nodes 2 --split-bytes 262144 >/dev/null ||
  fail "strata up failed"
timeout 120 "$STRATA" bench --dir "$DIR" --project p --instance i --table sp --workload bulkwrite \
  --dist sequential --keys 96 --requests 1 --value-size 65536 --no-lag --quiet >"$TMPD/1l.out" 2>&1 ||
  fail "loading sp: $(cat "$TMPD/1l.out")"
for try in $(seq 1 60); do
  bk create sp --id s1 --cluster east --expire 1d --wait >"$TMPD/1c.out" 2>&1 || fail "create s1: $(cat "$TMPD/1c.out")"
  listed=$(find "$DIR"/east-*/backups/i/east/s1 -name '*.sst' | wc -l)
  distinct=$(find "$DIR"/east-*/backups/i/east/s1 -name '*.sst' -printf '%i\n' | sort -u | wc -l)
  [ "$listed" -ge 8 ] && [ "$listed" -ge $((2 * distinct)) ] && break
  bk delete s1 >/dev/null 2>&1 || fail "delete s1"
  sleep 1
done
[ "$listed" -ge 8 ] && [ "$listed" -ge $((2 * distinct)) ] || fail "s1's pieces share too few files after $try tries ($listed listed, $distinct distinct)"
src_size=$(size_of s1 east)
[ "$(sst_bytes "$DIR"/east-*/backups/i/east/s1)" -eq "$src_size" ] || fail "s1's files do not hold its size_bytes"
echo "ok: $listed files listed, $distinct distinct, size_bytes $src_size"

echo "== 2. copy into west: size_bytes and disk as the source's"
bk copy s1 --to west --as c1 --wait >"$TMPD/2.out" 2>&1 || fail "copy: $(cat "$TMPD/2.out")"
copy_size=$(size_of c1 west)
[ "$copy_size" -eq "$src_size" ] || fail "c1's size_bytes is $copy_size, s1's $src_size"
on_disk=$(sst_bytes "$DIR"/west-*/backups/i/west/c1)
[ "$on_disk" -eq "$src_size" ] ||
  fail "west holds $on_disk bytes of c1 for a backup of $src_size: shared files were pulled once per piece"
echo "ok: c1 $copy_size bytes listed, $on_disk on disk"

echo "== 3. restore: west grows by about the backup's size"
before=$(uniq_bytes "$DIR"/west-*)
bk restore s1 --to sp2 --wait >"$TMPD/3.out" 2>&1 || fail "restore: $(cat "$TMPD/3.out")"
after=$(uniq_bytes "$DIR"/west-*)
grown=$((after - before))
# the restored tablets link the pulled files; new log segments and MANIFEST lines are small
[ "$grown" -le $((src_size + src_size / 10 + 1048576)) ] ||
  fail "west grew by $grown bytes restoring a backup of $src_size bytes"
BIGTABLE_EMULATOR_HOST=127.0.0.1:$PORT timeout 60 "$CBT" -project p -instance i count sp2 >"$TMPD/3c.out" 2>&1 ||
  fail "cbt count sp2: $(cat "$TMPD/3c.out")"
grep -qx 96 "$TMPD/3c.out" || fail "sp2 has not 96 rows: $(cat "$TMPD/3c.out")"
echo "ok: west grew by $grown bytes for a backup of $src_size; 96 rows"
echo PASS
