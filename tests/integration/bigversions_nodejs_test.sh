#!/usr/bin/env bash
# bigversions_nodejs_test.sh — a row grown past the 256 MiB read limit through versions is read
# with the filters that ask for less (the latest version, the first cell, the client's keys-only
# scan), and refused without one, through the official Node.js client (nodejs/bigversions_client.js)
# against a `strata up` instance of one node. The node keeps only the cells such a filter can
# return while it assembles the row. The client is installed by nodejs_client_test.sh into the
# build tree's nodejs-deps. Skips (77) without node or the installed client package.
# Usage: bigversions_nodejs_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
CACHE=${STRATA_NODEJS_CACHE:-$(cd "$(dirname "$STRATA")/.." && pwd)/nodejs-deps}
JS=$(cd "$(dirname "$0")/nodejs" && pwd)/bigversions_client.js
command -v node >/dev/null || { echo "SKIP: node not installed"; exit 77; }
if [ ! -f "$CACHE/node_modules/@google-cloud/bigtable/package.json" ]; then
  echo "SKIP: @google-cloud/bigtable is not installed in $CACHE (nodejs_client_test installs it)"
  exit 77
fi

up_single bigversions_nodejs
BIGTABLE_EMULATOR_HOST=127.0.0.1:$PORT NODE_PATH="$CACHE/node_modules" timeout 240 node "$JS" \
  2> >(grep -v -e MetadataLookupWarning -e trace-warnings >&2)
rc=$?
[ $rc -eq 0 ] || fail "bigversions_client.js exited $rc"
echo "bigversions_nodejs_test: passed"
