#!/usr/bin/env bash
# cs_hostile2_values_test.sh — change stream values at the edges of the message budget, read
# with the official Node.js client (nodejs/cs_hostile2_values.js) through the router of `strata up`
# (clusters east and west, one node each): values of 63 and 64 bytes (by reference from 64),
# 1 MiB - 1, 1 MiB, 1 MiB + 1, 3 MiB + 7 and 8 MiB, two 700 KB values in one row, 300 qualifiers
# of 16 KB, an empty value and a whole-row delete in 41 families come back exactly as written
# (chunk_info checked as the official Java client does):
#   1. live through the ring, on east;
#   2. replicated, on west;
#   3. after kill -9 of east's node and a restart, from storage (values by reference).
# Skips (77) without cbt, node or the installed client package (nodejs_client_test installs it).
# Usage: cs_hostile2_values_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
CACHE=${STRATA_NODEJS_CACHE:-$(cd "$(dirname "$STRATA")/.." && pwd)/nodejs-deps}
JS=$(cd "$(dirname "$0")/nodejs" && pwd)/cs_hostile2_values.js
if [ -z "$CBT" ]; then echo "SKIP: cbt not installed"; exit 77; fi
command -v node >/dev/null || { echo "SKIP: node not installed"; exit 77; }
if [ ! -f "$CACHE/node_modules/@google-cloud/bigtable/package.json" ]; then
  echo "SKIP: @google-cloud/bigtable is not installed in $CACHE (nodejs_client_test installs it)"
  exit 77
fi
instance_init cshostile2values
export BIGTABLE_EMULATOR_HOST=127.0.0.1:$PORT METADATA_SERVER_DETECTION=none
cbtq() { timeout 60 "$CBT" -project p -instance i "$@" 2>&1 | grep -v 'creds flag unset'; return "${PIPESTATUS[0]}"; }
js() { NODE_PATH="$CACHE/node_modules" timeout 120 node "$JS" "$@" 2> >(grep -v -e MetadataLookupWarning -e trace-warnings >&2); }

"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 2 --nodes 1 >"$TMPD/up.out" 2>&1 ||
  { cat "$TMPD/up.out"; fail "strata up"; }
fams=cf
for f in $(seq 0 39); do fams="$fams,f$f"; done
cbtq createtable v "families=$fams" >/dev/null || fail "cbt createtable"
cbtq createappprofile i oneast "east only" route-to=east >/dev/null || fail "createappprofile oneast"
cbtq createappprofile i onwest "west only" route-to=west >/dev/null || fail "createappprofile onwest"
"$STRATA" changes --dir "$DIR" --table v --enable 1d >/dev/null || fail "strata changes --enable 1d"
echo "== 1. live, on east"
out=$(js write v oneast) || fail "writing the rows or reading them live on east: $out"
echo "$out"
T0=$(echo "$out" | awk '/^T0/ {print $2}')
[ -n "$T0" ] || fail "no T0 from the writer: $out"
echo "== 2. replicated, on west, and 3. from storage on east after kill -9 of east-0"
cbtq waitforreplication v >/dev/null || fail "waitforreplication"
kill -9 "$(cat "$DIR/run/east-0.pid")" || fail "could not kill east-0"
"$STRATA" up --dir "$DIR" >/dev/null 2>&1 || fail "strata up did not restart east-0"
ok=0
for _ in $(seq 1 20); do # the router reconnects to the restarted node: UNAVAILABLE until then
  if js check v onwest,oneast "$T0" >"$TMPD/3.out" 2>&1; then ok=1; break; fi
  grep -q 'code 14' "$TMPD/3.out" || break
  sleep 0.5
done
cat "$TMPD/3.out"
[ $ok = 1 ] || fail "the records read on west or from storage on east differ from the writes"
echo "PASS"
