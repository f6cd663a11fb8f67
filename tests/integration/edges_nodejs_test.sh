#!/usr/bin/env bash
# edges_nodejs_test.sh — API edge cases where Strata answered differently from Cloud Bigtable
# and the official emulator (nodejs/edges_client.js), through the official Node.js client
# against a `strata up` instance (clusters east and west, one node each), every read through a
# single-cluster profile per cluster so both copies are checked. The client is installed by
# nodejs_client_test.sh into the build tree's nodejs-deps. Skips (77) without cbt, node or the
# installed client package.
# Usage: edges_nodejs_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
CACHE=${STRATA_NODEJS_CACHE:-$(cd "$(dirname "$STRATA")/.." && pwd)/nodejs-deps}
JS=$(cd "$(dirname "$0")/nodejs" && pwd)/edges_client.js
if [ -z "$CBT" ]; then echo "SKIP: cbt not installed"; exit 77; fi
command -v node >/dev/null || { echo "SKIP: node not installed"; exit 77; }
if [ ! -f "$CACHE/node_modules/@google-cloud/bigtable/package.json" ]; then
  echo "SKIP: @google-cloud/bigtable is not installed in $CACHE (nodejs_client_test installs it)"
  exit 77
fi

instance_init edges_nodejs
"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 2 --nodes 1 >"$TMPD/up.out" 2>&1 ||
  { cat "$TMPD/up.out"; fail "strata up"; }
ADDR=127.0.0.1:$PORT
for c in east west; do
  cbtr "$ADDR" createappprofile i "on$c" "reads $c" "route-to=$c" >/dev/null ||
    fail "createappprofile on$c"
done
BIGTABLE_EMULATOR_HOST=$ADDR NODE_PATH="$CACHE/node_modules" timeout 300 node "$JS" oneast onwest \
  2> >(grep -v -e MetadataLookupWarning -e trace-warnings >&2)
rc=$?
[ $rc -eq 0 ] || fail "edges_client.js exited $rc"
echo "edges_nodejs_test: passed"
