#!/usr/bin/env bash
# read_recreate_test.sh — ReadRows scans held (paused or parked: their client does not read) while
# their table is deleted, or deleted and created again under the same name, must each fail or
# return every old row: never end OK after part of the rows, never bring a row of the later
# table, never stay open (docs/router.md, "Flow control"). A read that resumed went on by table
# name in whatever table had that name: scans ended OK with part of the rows, or with old rows
# followed by new ones (the later table's tablets may be on a node the scan had not been to).
#
# `strata up`: one cluster of two nodes and a router; a table of four tablets, 400 rows of
# 8 KiB; 150 full scans on one connection (past the router's share of paused reads per node, so
# some park). Rounds (hostile/read_recreate.js): deleted and created again, deleted only (also
# with a table of one tablet: a node's scan that met the deletion ended OK, the end of its only
# tablet), and left alone (every scan must then end with every row).
# Usage: read_recreate_test.sh PATH/TO/strata
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
STRATA=$1
command -v node >/dev/null || { echo "SKIP: node (Node.js) not found"; exit 77; }

instance_init read_recreate_test
"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 1 --nodes 2 >"$TMPD/up.out" 2>&1 ||
  { cat "$TMPD/up.out"; fail "strata up"; }

rc=0
for mode in recreate delete delete1 keep; do
  echo "== 150 held scans, table: $mode"
  timeout 120 node "$HERE/hostile/read_recreate.js" "$PORT" 150 400 8192 $mode ||
    { echo "FAIL: $mode"; rc=1; }
done
[ $rc -eq 0 ] || { tail -n 20 "$DIR/logs/router.log"; exit 1; }
echo PASS
