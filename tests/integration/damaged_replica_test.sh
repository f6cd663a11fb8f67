#!/usr/bin/env bash
# damaged_replica_test.sh — a multi-cluster app profile moves off a cluster whose tablet is
# damaged, two clusters of one node (docs/router.md, "Moving on"). 400 rows of 1 KiB are written
# through a single-cluster profile on east and replicated, and flushed there by a backup; east-0
# is stopped, four bytes in the middle of its largest SSTable are overwritten, and it is started
# again. Then:
# 1. a full scan through the east profile fails DATA_LOSS (the node found the bad block), while
#    one through the multi-cluster profile returns every row: it resumes on west after the last
#    row east delivered. It used to end DATA_LOSS for every multi-cluster client, for good;
# 2. a MutateRow (cbt set) and a MutateRows (cbt import) of rows of that tablet through the
#    multi-cluster profile are stored on west, while east's tablet, read-only after the
#    corruption, refuses them through the east profile (DATA_LOSS), as it should;
# 3. `strata status` flags east-0 as holding a tablet read-only after corruption.
# Skips (77) without cbt.
# Usage: damaged_replica_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
[ -n "$CBT" ] || { echo "cbt missing: skipped"; exit 77; }
instance_init damaged_replica
"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 2 --nodes 1 >"$TMPD/up.out" 2>&1 ||
  { cat "$TMPD/up.out"; fail "strata up"; }
cbtq() { cbtr "127.0.0.1:$PORT" "$@"; }
cbtq createappprofile i oneast d route-to=east force=true >/dev/null || fail "profile oneast"
cbtq createappprofile i onwest d route-to=west force=true >/dev/null || fail "profile onwest"
cbtq createappprofile i multi d route-any >/dev/null || fail "profile multi"
cbtq createtable t families=cf >/dev/null || fail "createtable"
# rows: the number of rows a `cbt read` printed.
rows() { grep -c '^----' "$1"; }

echo "== 400 rows of 1 KiB on both clusters"
python3 - "$TMPD/rows.csv" <<'EOF'
import os, sys
with open(sys.argv[1], 'w') as f:
    f.write(',cf\n,q\n')
    for i in range(400):
        f.write('r%04d,%s\n' % (i, os.urandom(512).hex()))
EOF
cbtq import t "$TMPD/rows.csv" app-profile=oneast >"$TMPD/import.out" ||
  { cat "$TMPD/import.out"; fail "import"; }
cbtq waitforreplication t >/dev/null || fail "waitforreplication"
cbtq read t app-profile=onwest >"$TMPD/west.out" || fail "read through onwest"
[ "$(rows "$TMPD/west.out")" = 400 ] || fail "west holds $(rows "$TMPD/west.out") rows, not 400"

echo "== damage east-0's largest SSTable"
# A backup flushes east's memtable into SSTables (a stop does not).
"$STRATA" backup create t --cluster east --id b1 --wait --dir "$DIR" >"$TMPD/backup.out" 2>&1 ||
  { cat "$TMPD/backup.out"; fail "backup"; }
pid=$(cat "$DIR/run/east-0.pid")
kill -TERM "$pid"
for _ in $(seq 1 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
kill -0 "$pid" 2>/dev/null && fail "east-0 did not stop"
sst=$(ls -S "$DIR"/east-0/storage/sst/*.sst | head -n1)
size=$(stat -c %s "$sst")
[ "$size" -gt 200000 ] || fail "east-0's largest SSTable is only $size bytes"
printf '\xff\xfe\xfd\xfc' | dd of="$sst" bs=1 seek=$((size / 3)) conv=notrunc 2>/dev/null
ups() { grep -c 'cluster=east health=up' "$DIR/logs/router.log"; }
ups_before=$(ups)
"$STRATA" restart east-0 --dir "$DIR" >"$TMPD/restart.out" 2>&1 ||
  { cat "$TMPD/restart.out"; fail "restart east-0"; }
# Multi-cluster requests go to east first again once the router's probes see it up.
for _ in $(seq 1 300); do [ "$(ups)" -gt "$ups_before" ] && break; sleep 0.1; done
[ "$(ups)" -gt "$ups_before" ] || fail "the router never saw east up again"

echo "== reads"
cbtq read t app-profile=oneast >"$TMPD/east.out" 2>&1 &&
  fail "a full scan through oneast succeeded: the damaged block was not read"
grep -q 'DataLoss\|checksum' "$TMPD/east.out" ||
  { cat "$TMPD/east.out"; fail "the oneast scan did not fail DATA_LOSS"; }
cbtq read t app-profile=multi >"$TMPD/multi.out" 2>&1 ||
  { tail -c 300 "$TMPD/multi.out"; fail "a full scan through the multi-cluster profile failed"; }
[ "$(rows "$TMPD/multi.out")" = 400 ] ||
  fail "the multi-cluster scan returned $(rows "$TMPD/multi.out") rows, not 400"
cmp -s <(grep -v '^ ' "$TMPD/multi.out") <(grep -v '^ ' "$TMPD/west.out") ||
  fail "the multi-cluster scan differs from west's rows"
# strata status flags the node: it answers, so nothing else showed the damage.
"$STRATA" status --dir "$DIR" >"$TMPD/status.out" 2>&1
grep -q "east-0 holds 1 tablet read-only after corruption" "$TMPD/status.out" ||
  { cat "$TMPD/status.out"; fail "strata status does not flag east-0's read-only tablet"; }

echo "== writes"
cbtq set t r0123 app-profile=oneast cf:z=east >"$TMPD/set_east.out" 2>&1 &&
  fail "east's read-only tablet took a write through oneast"
grep -q 'read-only after corruption' "$TMPD/set_east.out" ||
  { cat "$TMPD/set_east.out"; fail "the oneast write was not refused as read-only"; }
cbtq set t r0123 app-profile=multi cf:z=multi >"$TMPD/set_multi.out" 2>&1 ||
  { cat "$TMPD/set_multi.out"; grep -i "failover\|tablet\|mutate" "$DIR"/logs/router.log | tail -5; fail "a MutateRow through the multi-cluster profile failed"; }
printf ',cf\n,z\nr0001,bulk1\nr0200,bulk2\nr0399,bulk3\n' >"$TMPD/bulk.csv"
cbtq import t "$TMPD/bulk.csv" app-profile=multi >"$TMPD/bulk.out" 2>&1 ||
  { cat "$TMPD/bulk.out"; fail "a MutateRows through the multi-cluster profile failed"; }
grep -qi 'error\|fail' "$TMPD/bulk.out" && { cat "$TMPD/bulk.out"; fail "import reported errors"; }
cbtq read t app-profile=onwest columns=cf:z >"$TMPD/z.out" || fail "read cf:z through onwest"
for v in multi bulk1 bulk2 bulk3; do
  grep -q "\"$v\"" "$TMPD/z.out" || { cat "$TMPD/z.out"; fail "west lacks the value $v"; }
done
echo "PASS"
