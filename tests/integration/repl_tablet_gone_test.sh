#!/usr/bin/env bash
# repl_tablet_gone_test.sh — writes still unshipped to a peer cluster when their tablet id goes
# away. A log record names its tablet only; the shipper finds the table through the tablet.
# 1. Split, then restart: east takes rows while cut from west, one of its tablets splits, east
#    is killed (-9) and started again, the link heals. Every row must reach west, and the
#    consistency check must not say yes before it has (the parent's id was unknown after the
#    restart: its rows were skipped for good and `cbt waitforreplication` returned at once).
# 2. Delete and create again: east takes rows of table t while cut from west, t is deleted and
#    created again, the link heals. The old rows must not appear in the new t on west (the
#    shipper still knew the old tablet's table by name and sent them into the new table).
# 3. West's node wiped and started again: it holds none of t's tablets while east's positions
#    say it took every write; the consistency check must not say yes.
# Usage: repl_tablet_gone_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
HOSTILE=$(cd "$(dirname "$0")" && pwd)/hostile
if [ -z "$CBT" ]; then echo "cbt not installed: skipping"; exit 77; fi
command -v python3 >/dev/null || { echo "python3 not installed: skipping"; exit 77; }

instance_init repl_tablet_gone
"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 2 --nodes 1 >"$TMPD/up.out" 2>&1 ||
  { cat "$TMPD/up.out"; fail "strata up"; }
node_addr() { awk -v c="[cluster $1]" '$0 == c {f=1; next} /^\[/{f=0} f && /^node =/{print $3; exit}' "$DIR/topology"; }
EAST=$(node_addr east); WEST=$(node_addr west); R=127.0.0.1:$PORT
[ -n "$EAST" ] && [ -n "$WEST" ] || fail "no node addresses in $DIR/topology"
py() { timeout 120 python3 "$HOSTILE/repl_tablet_gone.py" "${EAST##*:}" "$@"; }
count() { cbtr "$1" count "$2" | grep -Eo '^[0-9]+$'; }
# until_count ADDR T N: waits (bounded) until table T at ADDR holds N rows; 1 if it never does.
until_count() {
  local i c
  for i in $(seq 1 50); do
    c=$(count "$1" "$2"); [ "$c" = "$3" ] && return 0; sleep 0.2
  done
  echo "$1 holds ${c:-?} rows of $2, expected $3" >&2; return 1
}
# consistent T: the router's CheckConsistency on a fresh token: prints true or false.
consistent() {
  python3 - "$PORT" "$1" <<'PY'
import os, sys
sys.path.insert(0, os.environ['HOSTILE'])
from cslib import ADMIN, call, fields, fld, msgs, tname
port, t = int(sys.argv[1]), sys.argv[2]
d, _, why = call(port, ADMIN + 'GenerateConsistencyToken', fld(1, tname(t)))
tok = [v for m in msgs(d) for n, _, v in fields(m) if n == 1]
assert why == 'end' and tok, why
d, _, why = call(port, ADMIN + 'CheckConsistency', fld(1, tname(t)) + fld(2, tok[0]))
assert why == 'end', why
print('true' if any(n == 1 and v for m in msgs(d) for n, _, v in fields(m)) else 'false')
PY
}
export HOSTILE

echo "== 1. rows cut from west, a split, kill -9 and restart, heal"
cbtr "$R" createtable s >/dev/null && cbtr "$R" createfamily s cf >/dev/null || fail "create s"
"$STRATA" chaos partition east west --dir "$DIR" >/dev/null || fail "partition"
py write s a 40 || fail "writes to s"
py split s a0020 || fail "split"
py write s b 10 || fail "writes after the split"
[ "$(count "$EAST" s)" = 50 ] || fail "east lacks rows of s"
[ "$(count "$WEST" s)" = 0 ] || fail "rows crossed a cut link"
[ "$(consistent s)" = false ] || fail "consistent while cut"
# kill -9: the split's record must already be on disk, nothing is saved at exit
"$STRATA" chaos kill-cluster east --dir "$DIR" >/dev/null || fail "kill east"
"$STRATA" chaos restart-cluster east --dir "$DIR" >/dev/null || fail "restart east"
"$STRATA" chaos heal --dir "$DIR" >/dev/null || fail "heal"
until_count "$WEST" s 50 || fail "rows written before the split never reached west"
[ "$(consistent s)" = true ] || fail "not consistent after west got every row"

echo "== 2. rows cut from west, the table deleted and created again, heal"
cbtr "$R" createtable t >/dev/null && cbtr "$R" createfamily t cf >/dev/null || fail "create t"
"$STRATA" chaos partition east west --dir "$DIR" >/dev/null || fail "partition"
py write t old 20 || fail "writes to t"
cbtr "$R" deletetable t >/dev/null || fail "deletetable"
cbtr "$R" createtable t >/dev/null && cbtr "$R" createfamily t cf >/dev/null || fail "create t again"
py write t new 3 || fail "writes to the new t"
"$STRATA" chaos heal --dir "$DIR" >/dev/null || fail "heal"
until_count "$WEST" t 3 || fail "west's new t does not hold exactly the new rows"
[ "$(consistent t)" = true ] || fail "not consistent after heal"
[ "$(count "$WEST" t)" = 3 ] || fail "rows of the deleted table reached the new one on west"
[ "$(count "$EAST" t)" = 3 ] || fail "east's new t changed"

echo "== 3. west's node started again on an empty data directory"
"$STRATA" chaos kill-cluster west --dir "$DIR" >/dev/null || fail "kill west"
rm -rf "$DIR/west-0"
"$STRATA" chaos restart-cluster west --dir "$DIR" >/dev/null || fail "restart west"
[ "$(consistent t)" = false ] || fail "consistent while west's node holds none of t"
echo "PASS"
