#!/usr/bin/env bash
# cs_kinds_test.sh — the DataChange of every kind of write, read with the official Node.js client
# (nodejs/cs_kinds.js) through the router of `strata up --clusters 2 --nodes 1`: SetCell with the
# server's timestamp (-1: the record holds the cell's timestamp) and with 0, DeleteFromColumn
# without a range and with closed, open-ended and open-started ranges, DeleteFromFamily,
# DeleteFromRow (one DeleteFromFamily per family), binary row keys with 0x00 / 0xff, a 4 KiB row
# key, empty qualifiers and values, values around the 256 KiB message budget, both branches of
# CheckAndMutateRow (a branch without mutations leaves no record), ReadModifyWriteRow append
# and increment (the record holds the resulting cell), MutateRows whose failed entries leave no
# record. Every record is compared mod by mod after folding the messages as the official Java
# client does: 1. live on east; 2. on west; 3. from storage on east after kill -9 of its node.
# Skips (77) without cbt, node or the installed client package (nodejs_client_test installs it).
# Usage: cs_kinds_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
CACHE=${STRATA_NODEJS_CACHE:-$(cd "$(dirname "$STRATA")/.." && pwd)/nodejs-deps}
JS=$(cd "$(dirname "$0")/nodejs" && pwd)/cs_kinds.js
if [ -z "$CBT" ]; then echo "SKIP: cbt not installed"; exit 77; fi
command -v node >/dev/null || { echo "SKIP: node not installed"; exit 77; }
if [ ! -f "$CACHE/node_modules/@google-cloud/bigtable/package.json" ]; then
  echo "SKIP: @google-cloud/bigtable is not installed in $CACHE (nodejs_client_test installs it)"
  exit 77
fi
instance_init cskinds
export BIGTABLE_EMULATOR_HOST=127.0.0.1:$PORT METADATA_SERVER_DETECTION=none
cbtq() { timeout 60 "$CBT" -project p -instance i "$@" 2>&1 | grep -v 'creds flag unset'; return "${PIPESTATUS[0]}"; }
js() { NODE_PATH="$CACHE/node_modules" timeout 120 node "$JS" "$@" 2> >(grep -v -e MetadataLookupWarning -e trace-warnings >&2); }

"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 2 --nodes 1 >"$TMPD/up.out" 2>&1 ||
  { cat "$TMPD/up.out"; fail "strata up"; }
cbtq createtable k "families=cf:maxversions=5,f2,f3" >/dev/null || fail "cbt createtable"
cbtq createappprofile i txeast "east" route-to=east transactional-writes=true >/dev/null ||
  fail "createappprofile txeast"
cbtq createappprofile i onwest "west" route-to=west >/dev/null || fail "createappprofile onwest"
"$STRATA" changes --dir "$DIR" --table k --enable 1d >/dev/null || fail "strata changes --enable 1d"
echo "== 1. live, on east"
js write k txeast "$TMPD/state" || fail "the writes failed"
js check k txeast "$TMPD/state" || fail "the records read live on east differ from the writes"
echo "== 2. on west"
cbtq waitforreplication k >/dev/null || fail "waitforreplication"
js check k onwest "$TMPD/state" || fail "the records read on west differ from the writes"
echo "== 3. from storage on east, after kill -9 of its node"
kill -9 "$(cat "$DIR/run/east-0.pid")" || fail "could not kill east-0"
"$STRATA" up --dir "$DIR" >/dev/null 2>&1 || fail "strata up did not restart east-0"
ok=0
for _ in $(seq 1 20); do # the router reconnects to the restarted node: UNAVAILABLE until then
  if js check k txeast "$TMPD/state" >"$TMPD/3.out" 2>&1; then ok=1; break; fi
  grep -q 'code 14' "$TMPD/3.out" || break
  sleep 0.5
done
cat "$TMPD/3.out"
[ $ok = 1 ] || fail "the records read from storage on east differ from the writes"
echo "PASS"
