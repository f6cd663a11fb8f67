#!/usr/bin/env bash
# backup_restored_share_test.sh — a restored table keeps one file for what its source's split
# children shared, so a backup of the restored table is the size of the backup it came from:
#   1. instance of two clusters (east, west) of two nodes, 256 KiB split threshold; table sp
#      split while it loads, its backup s1 in east has pieces sharing files;
#   2. `restore s1 --to sp2` (east links the pieces, west pulls them), then a backup of sp2 in
#      each cluster: each one's size_bytes is s1's (give or take a compaction), and its pieces on
#      a node name a shared file by one name. Before, each restored tablet linked the shared
#      file under a number of its own, and the backups listed it once per tablet (2x here,
#      4.9x on a larger table);
#   3. sp2 has every row, and a restore of the backup of sp2 does too.
# Skips (77) without cbt or python3.
# Usage: backup_restored_share_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
if [ -z "$CBT" ]; then echo "cbt not installed: skipping"; exit 77; fi
command -v python3 >/dev/null || { echo "python3 not installed: skipping"; exit 77; }

instance_init backup_restored_share_test
FAIL_TAIL_LINES=20
bk() { timeout 300 "$STRATA" backup --dir "$DIR" --quiet "$@"; }
size_of() { # size_of ID CLUSTER: the backup's size_bytes
  bk describe "$1" --cluster "$2" --json | python3 -c 'import json, sys; v = json.load(sys.stdin); print(int(v.get("sizeBytes", v.get("size_bytes", -1))))'
}
names_per_inode() { # names_per_inode DIR...: the most distinct file names one SSTable inode has
  find "$@" -type f -name '*.sst' -printf '%i %f\n' 2>/dev/null | sort -u | awk '{ n[$1]++ } END { m = 0; for (i in n) if (n[i] > m) m = n[i]; print m }'
}
rows_of() { # rows_of TABLE
  BIGTABLE_EMULATOR_HOST=127.0.0.1:$PORT timeout 60 "$CBT" -project p -instance i count "$1" 2>&1 | grep -v 'creds flag unset'
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
echo "ok: $listed files listed, $distinct distinct, size_bytes $src_size"

echo "== 2. restore s1 into sp2, back sp2 up in each cluster: the size of s1"
bk restore s1 --cluster east --to sp2 --wait >"$TMPD/2r.out" 2>&1 || fail "restore: $(cat "$TMPD/2r.out")"
# a compaction of a restored tablet between the restore and the backup only shrinks what it
# lists (its own rows, no change history), so the bound is s1's size and a little
limit=$((src_size + src_size / 10))
for c in east west; do
  bk create sp2 --id "r-$c" --cluster "$c" --expire 1d --wait >"$TMPD/2$c.out" 2>&1 ||
    fail "create r-$c: $(cat "$TMPD/2$c.out")"
  sz=$(size_of "r-$c" "$c")
  [ "$sz" -le "$limit" ] ||
    fail "the backup of restored sp2 in $c holds $sz bytes, s1 $src_size: the restored tablets list a shared file under a name each"
  names=$(names_per_inode "$DIR"/$c-*/backups/i/$c/r-$c)
  [ "$names" -le 1 ] || fail "a file of r-$c is listed under $names names on one node"
  echo "ok: r-$c $sz bytes (s1 $src_size)"
done

echo "== 3. every row in sp2 and in a restore of its backup"
grep -qx 96 <<<"$(rows_of sp2)" || fail "sp2 has not 96 rows: $(rows_of sp2)"
bk restore r-west --cluster west --to sp3 --wait >"$TMPD/3r.out" 2>&1 || fail "restore sp3: $(cat "$TMPD/3r.out")"
grep -qx 96 <<<"$(rows_of sp3)" || fail "sp3 has not 96 rows: $(rows_of sp3)"
echo "ok: 96 rows in each"
echo PASS
