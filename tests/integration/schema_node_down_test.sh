#!/usr/bin/env bash
# schema_node_down_test.sh — a schema change while a node is down changes no node, on `strata up
# --clusters 2 --nodes 1` (table cs with change streams on, row a written, west's node killed):
#   1. `strata changes --disable` fails (UNAVAILABLE), and east's history is intact: row a is
#      still read from before the attempt (east used to turn streams off, deleting its history,
#      while the table's record, GetTable and west kept them on; the router's best-effort undo
#      then started a new, empty history);
#   2. ModifyColumnFamilies dropping family cf fails, and east keeps row a's cells (east used to
#      drop them while the record kept the family);
#   3. CreateTable fails saying the change was made on no node and to retry once every node is
#      back (it used to give only the unreachable node).
# Skips (77) without python3.
# Usage: schema_node_down_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
command -v python3 >/dev/null || { echo "python3 missing: skipped"; exit 77; }
[ -n "$CBT" ] || { echo "cbt missing: skipped"; exit 77; }
instance_init schema_node_down
"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 2 --nodes 1 >"$TMPD/up.out" 2>&1 ||
  { cat "$TMPD/up.out"; fail "strata up"; }
cs_py create cs || fail "creating table cs"
FROM=$(date -u +%Y-%m-%dT%H:%M:%S.%NZ)
cs_py write cs a || fail "writing row a"
kill -9 "$(cat "$DIR/run/west-0.pid")"

echo "== 1. turning streams off with west down"
"$STRATA" changes --dir "$DIR" --table cs --disable >"$TMPD/1.out" 2>&1 &&
  fail "turning streams off with a node down succeeded: $(cat "$TMPD/1.out")"
grep -q UNAVAILABLE "$TMPD/1.out" || fail "the refusal is not UNAVAILABLE: $(cat "$TMPD/1.out")"
timeout 60 "$STRATA" changes --dir "$DIR" --table cs --from "$FROM" --quiet >"$TMPD/1.jsonl" 2>"$TMPD/1.err" ||
  { cat "$TMPD/1.err"; fail "east's stream from before the failed --disable was refused"; }
grep -q '"row":"a"' "$TMPD/1.jsonl" || fail "east lost row a's record: $(cat "$TMPD/1.jsonl")"

echo "== 2. dropping family cf with west down"
HOSTILE=$(cd "$(dirname "$0")" && pwd)/hostile python3 - "$PORT" <<'EOF' || fail "the drop of cf"
import os, sys
sys.path.insert(0, os.environ['HOSTILE'])
from cslib import ADMIN, BT, call, fld, tname
port = int(sys.argv[1])
drop = fld(1, tname('cs')) + fld(2, fld(1, 'cf') + fld(4, 1))  # Modification{id cf, drop}
data, _, why = call(port, ADMIN + 'ModifyColumnFamilies', drop)
assert not data, 'ModifyColumnFamilies dropping cf succeeded with a node down'
rows, _, why = call(port, BT + 'ReadRows', fld(1, tname('cs')))
assert b'va' in rows, 'east dropped the cells of cf: %r %s' % (rows, why)
EOF
echo "== 3. CreateTable with west down says no node took it"
out=$(cbtr "127.0.0.1:$PORT" createtable t3 families=cf)
[ $? -ne 0 ] || fail "CreateTable with a node down succeeded: $out"
case "$out" in *"made on no node (retry once every node is back)"*) ;;
  *) fail "CreateTable's refusal does not say no node took it: $out" ;; esac
cbtr "127.0.0.1:$PORT" ls | grep -qx t3 && fail "t3 is listed after the refused CreateTable"
echo "PASS"
