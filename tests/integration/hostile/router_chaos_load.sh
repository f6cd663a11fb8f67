#!/usr/bin/env bash
# router_chaos_load.sh — the data path through the router under load and kill -9, with the
# official Node.js client: `strata up --clusters 2 --nodes 2 --split-bytes 131072`, then
#   1. router_load.js through the default profile (single-cluster east) and through a
#      multi-cluster profile (EVENTUAL=1): batch and single writes, full/range/prefix/limit/
#      filter/reversed scans, while east-1, the router, west-0 and east-0 are killed -9 in turn
#      and restarted (ROUNDS kills, every 7 s); tablets split and the balancer moves them;
#   2. router_check.js: waitForReplication, then every acknowledged row through oneast and onwest;
#   3. router_rmw.js: increments and check-and-mutate on one row through a transactional
#      single-cluster profile while the router and east's nodes are killed -9.
# Exit 1 on a missing, unsorted or duplicate row, a lost or doubled increment, or a sanitizer
# report in the logs. Usage: router_chaos_load.sh PATH/TO/strata [SECONDS] [ROUNDS]
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/../lib.sh"
STRATA=$1
SECS=${2:-45}
ROUNDS=${3:-6}
CACHE=${STRATA_NODEJS_CACHE:-$(cd "$(dirname "$STRATA")/.." && pwd)/nodejs-deps}
[ -n "$CBT" ] || { echo "SKIP: cbt not installed"; exit 77; }
[ -f "$CACHE/node_modules/@google-cloud/bigtable/package.json" ] || { echo "SKIP: no client"; exit 77; }
instance_init router_chaos_load
export BIGTABLE_EMULATOR_HOST=127.0.0.1:$PORT NODE_PATH=$CACHE/node_modules
cbtq() { timeout 60 "$CBT" -project p -instance i "$@" 2>&1 | grep -v 'creds flag unset'; }
js() { timeout 300 node "$HERE/$1" "${@:2}" 2> >(grep -v -e MetadataLookupWarning -e trace-warnings >&2); }
"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 2 --nodes 2 --split-bytes 131072 >/dev/null ||
  fail "strata up failed"
cbtq createtable t families=cf:maxversions=1 >/dev/null
cbtq createtable hot families=cf:maxversions=1 >/dev/null
cbtq createappprofile i multi m route-any >/dev/null
cbtq createappprofile i oneast e route-to=east >/dev/null
cbtq createappprofile i onwest w route-to=west >/dev/null
cbtq createappprofile i txeast t route-to=east transactional-writes=true force=true >/dev/null
chaos() { # chaos ROUNDS NAMES...: kill -9 each name in turn, restart it with strata up
  local n=$1 r
  shift
  for r in $(seq 1 "$n"); do
    sleep 5
    local who=${*:$(((r - 1) % $# + 1)):1}
    kill -9 "$(cat "$DIR/run/$who.pid")" 2>/dev/null && echo "killed $who"
    sleep 2
    "$STRATA" up --dir "$DIR" >/dev/null 2>&1 || echo "strata up failed after killing $who"
  done
}
bad=0
echo "== 1. load and scans, $ROUNDS kills"
chaos "$ROUNDS" east-1 router west-0 east-0 &
CH=$!
KEY_PREFIX=a js router_load.js t "$SECS" 3 6 "$TMPD/a.json" &
A=$!
EVENTUAL=1 KEY_PREFIX=m js router_load.js t "$SECS" 3 6 "$TMPD/m.json" multi || bad=1
wait $A || bad=1
wait $CH
echo "== 2. every acknowledged row in both clusters after waitForReplication"
js router_check.js t wait oneast,onwest "$TMPD/a.json" "$TMPD/m.json" || bad=1
echo "== 3. one hot row: increments and check-and-mutate, $ROUNDS kills"
chaos "$ROUNDS" router east-0 east-1 &
CH=$!
js router_rmw.js hot h txeast "$SECS" 6 || bad=1
wait $CH
if grep -l -e 'ERROR: AddressSanitizer' -e 'runtime error:' -e 'LeakSanitizer' "$DIR"/logs/*.log; then
  echo "sanitizer reports above"; bad=1
fi
[ $bad = 0 ] || fail "see above"
echo PASS
