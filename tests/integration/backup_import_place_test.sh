#!/usr/bin/env bash
# backup_import_place_test.sh — an import keeps the pieces that share files together, and a
# restore of a damaged backup fails at once with what to do:
#   1. instance A (one cluster, two nodes, 256 KiB split threshold), table sp split while it
#      loads, so its backup s1 has pieces sharing files (split children keep their parent's
#      SSTables whole);
#   2. import of its export into instance B (three nodes): pieces that share a file land on one
#      node and are stored once there (hard links), so B holds each distinct file once, on one
#      node, and the import's size_bytes equals s1's on A; a restore on B reads the same rows;
#   3. a piece directory of s1 moved away on A: the restore fails within 20 s (not after the
#      30 s the router waits for a node restarting), NOT_FOUND, naming `strata backup delete s1`;
#   4. a truncated PIECE manifest: the export refuses it, naming `strata backup delete ID`, not
#      the node's internal RPC;
#   5. `restore --target` with $TMPDIR on a full file system (a 1 MiB tmpfs, root only): says to
#      free space in $TMPDIR or point TMPDIR at a file system with room for the backup's bytes,
#      not to "remove it and export again";
#   6. a node whose storage/MANIFEST was removed refuses to start naming the storage directory.
# Skips (77) without cbt or python3.
# Usage: backup_import_place_test.sh PATH/TO/strata PATH/TO/strata-node
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
NODE=$2
if [ -z "$CBT" ]; then echo "cbt not installed: skipping"; exit 77; fi
command -v python3 >/dev/null || { echo "python3 not installed: skipping"; exit 77; }

instance_init backup_import_place_test
DIRB=$TMPD/instb
PORTB=$(free_port)
TINY=$TMPD/tiny
finish() {
  "$STRATA" down --dir "$DIRB" >/dev/null 2>&1
  mountpoint -q "$TINY" 2>/dev/null && umount "$TINY"
  instance_teardown
}
trap finish EXIT
FAIL_TAIL_LINES=20

cbtat() { # cbtat PORT ARGS...
  local port=$1
  shift
  BIGTABLE_EMULATOR_HOST=127.0.0.1:$port timeout 60 "$CBT" -project p -instance i "$@" 2>&1 |
    grep -v 'creds flag unset'
  return "${PIPESTATUS[0]}"
}
bka() { timeout 300 "$STRATA" backup --dir "$DIR" --quiet "$@"; }
bkb() { timeout 300 "$STRATA" backup --dir "$DIRB" --quiet "$@"; }
size_of() { # size_of FILE.json: the backup's size_bytes
  python3 -c 'import json, sys; v = json.load(open(sys.argv[1])); print(int(v.get("sizeBytes", v.get("size_bytes", -1))))' "$1"
}

echo "== 1. instance A, table sp split while loading, backup s1 with shared files"
"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 1 --nodes 2 --split-bytes 262144 >/dev/null ||
  fail "strata up (A) failed"
timeout 120 "$STRATA" bench --dir "$DIR" --project p --instance i --table sp --workload bulkwrite \
  --dist sequential --keys 96 --requests 1 --value-size 65536 --no-lag --quiet >"$TMPD/1l.out" 2>&1 ||
  fail "loading sp: $(cat "$TMPD/1l.out")"
for try in $(seq 1 60); do
  bka create sp --id s1 --expire 1d --wait >"$TMPD/1c.out" 2>&1 || fail "create s1: $(cat "$TMPD/1c.out")"
  rm -rf "$TMPD/exp"
  bka export s1 "$TMPD/exp" >"$TMPD/1e.out" 2>&1 || fail "export s1: $(cat "$TMPD/1e.out")"
  listed=$(grep -c '^file ' "$TMPD/exp/MANIFEST")
  distinct=$(awk '$1 == "file" { print $5 "." $2 }' "$TMPD/exp/MANIFEST" | sort -u | wc -l)
  pieces=$(grep -c '^piece ' "$TMPD/exp/MANIFEST")
  [ "$listed" -gt "$distinct" ] && [ "$pieces" -ge 4 ] && break
  bka delete s1 >/dev/null 2>&1 || fail "delete s1"
  sleep 1
done
[ "$listed" -gt "$distinct" ] || fail "no piece shares a file after $try tries: sp did not split"
bka describe s1 --json >"$TMPD/1d.json" || fail "describe s1"
src_size=$(size_of "$TMPD/1d.json")
echo "ok: $pieces pieces, $listed files listed, $distinct distinct, size_bytes $src_size"

echo "== 2. import into three nodes: shared files stored once, size_bytes as the source's"
"$STRATA" up --dir "$DIRB" --port "$PORTB" --clusters 1 --nodes 3 >/dev/null || fail "strata up (B) failed"
bkb import "$TMPD/exp" >"$TMPD/2i.out" 2>&1 || fail "import s1: $(cat "$TMPD/2i.out")"
bkb describe s1 --json >"$TMPD/2d.json" || fail "describe s1 on B"
imp_size=$(size_of "$TMPD/2d.json")
[ "$imp_size" -eq "$src_size" ] || fail "the import's size_bytes is $imp_size, the source's $src_size"
# every distinct file once over B's nodes: one inode per (node, file), and no file on two nodes
find "$DIRB"/*-[0-9]*/backups/i/*/s1 -name '*.sst' -printf '%h %i %s %f\n' >"$TMPD/2f.txt"
inodes=$(awk '{ print $2 }' "$TMPD/2f.txt" | sort -u | wc -l)
stored=$(awk '!seen[$2]++ { n += $3 } END { print n + 0 }' "$TMPD/2f.txt")
[ "$inodes" -eq "$distinct" ] ||
  fail "B holds $inodes files of s1 for $distinct distinct contents: shared files were written once per node"
[ "$stored" -eq "$imp_size" ] || fail "B's files of s1 hold $stored bytes, size_bytes says $imp_size"
bkb restore s1 --to sp2 --wait >"$TMPD/2r.out" 2>&1 || fail "restore s1 on B: $(cat "$TMPD/2r.out")"
cbtat "$PORT" read sp >"$TMPD/sp.a" || fail "cbt read sp on A"
cbtat "$PORTB" read sp2 >"$TMPD/sp.b" || fail "cbt read sp2 on B"
[ "$(grep -c '^----' "$TMPD/sp.a")" -eq 96 ] || fail "sp on A has not 96 rows"
cmp -s "$TMPD/sp.a" "$TMPD/sp.b" || fail "sp2 on B differs from sp on A"
echo "ok: $inodes files, $stored bytes on B for size_bytes $imp_size; 96 rows identical"

echo "== 3. a missing piece: the restore fails at once, naming the CLI's delete"
victim=$(find "$DIR"/*-[0-9]*/backups/i/*/s1 -mindepth 1 -maxdepth 1 -type d | sort | head -n1)
[ -n "$victim" ] || fail "no piece directory of s1 on A"
mv "$victim" "$TMPD/moved"
t0=$SECONDS
bka restore s1 --to sp3 --wait >"$TMPD/3.out" 2>&1 && fail "restore with a missing piece succeeded"
took=$((SECONDS - t0))
grep -q 'NOT_FOUND\|has no piece' "$TMPD/3.out" || fail "missing piece: $(cat "$TMPD/3.out")"
grep -qF 'strata backup delete s1' "$TMPD/3.out" || fail "missing piece, no advice: $(cat "$TMPD/3.out")"
[ "$took" -lt 20 ] || fail "the restore retried a missing piece for $took s: $(cat "$TMPD/3.out")"
mv "$TMPD/moved" "$victim"
echo "ok: failed in $took s: $(tail -n1 "$TMPD/3.out")"

echo "== 4. a damaged PIECE manifest: the export names the CLI's delete"
bka create sp --id s2 --expire 1d --wait >"$TMPD/4c.out" 2>&1 || fail "create s2: $(cat "$TMPD/4c.out")"
piece=$(find "$DIR"/*-[0-9]*/backups/i/*/s2 -mindepth 2 -maxdepth 2 -name PIECE | sort | head -n1)
[ -n "$piece" ] || fail "no PIECE of s2 on A"
truncate -s 20 "$piece"
bka export s2 "$TMPD/exp2" >"$TMPD/4.out" 2>&1 && fail "export of a damaged piece succeeded"
grep -q 'damaged\|does not decode' "$TMPD/4.out" || fail "damaged PIECE: $(cat "$TMPD/4.out")"
grep -qF 'strata backup delete' "$TMPD/4.out" || fail "damaged PIECE, no CLI advice: $(cat "$TMPD/4.out")"
grep -q 'DeleteBackupPieces' "$TMPD/4.out" && fail "damaged PIECE names an internal RPC: $(cat "$TMPD/4.out")"
echo "ok: $(tail -n1 "$TMPD/4.out")"

echo "== 5. restore --target with a full TMPDIR"
mkdir -p "$TINY"
if [ "$(id -u)" = 0 ] && mount -t tmpfs -o size=1m tmpfs "$TINY" 2>/dev/null; then
  TMPDIR=$TINY timeout 300 "$STRATA" backup --dir "$DIR" --quiet restore s1 --to sp4 --target "$DIRB" \
    >"$TMPD/5.out" 2>&1 && fail "restore --target through a 1 MiB TMPDIR succeeded"
  grep -qF "point TMPDIR at a file system with room for $src_size bytes" "$TMPD/5.out" ||
    fail "full TMPDIR: $(cat "$TMPD/5.out")"
  grep -q 'export again' "$TMPD/5.out" && fail "full TMPDIR: tells to export again: $(cat "$TMPD/5.out")"
  [ -z "$(ls -A "$TINY")" ] || fail "left in TMPDIR: $(ls -A "$TINY")"
  echo "ok: $(grep -m1 TMPDIR "$TMPD/5.out")"
else
  echo "skipped: no tmpfs (needs root)"
fi

echo "== 6. a node without its MANIFEST names its storage directory"
ND=$TMPD/node
"$NODE" --data "$ND" --listen 127.0.0.1:0 >"$TMPD/6a.log" 2>&1 &
npid=$!
wait_line "$TMPD/6a.log" '127\.0\.0\.1:[0-9]+' >/dev/null || fail "strata-node did not start"
kill "$npid"
wait "$npid"
rm -f "$ND/storage/MANIFEST"
timeout 30 "$NODE" --data "$ND" --listen 127.0.0.1:0 >"$TMPD/6b.log" 2>&1 && fail "the node started without its MANIFEST"
grep -qF "$ND/storage has no MANIFEST" "$TMPD/6b.log" || fail "no MANIFEST: $(cat "$TMPD/6b.log")"
echo ok
echo PASS
